import ArgumentParser

// Requests' tasks run on NIO's event loops by executor preference (`EventLoopTaskExecutor`), not
// by making the loops Swift's global executor: NIO's hook for that is found with `dlsym`, which
// a statically linked binary (as released) does not answer, so it held only in debug builds.

/// What ArgumentParser's async `main()` does. Called from top-level code, its synchronous
/// overload would win and async subcommands would not run; inside an async function the
/// async `run()` is chosen.
func runCommand() async {
    do {
        var command = try PorticoCommand.parseAsRoot()
        if var command = command as? any AsyncParsableCommand {
            try await command.run()
        } else {
            try command.run()
        }
    } catch {
        PorticoCommand.exit(withError: error)
    }
}

await runCommand()
