import ArgumentParser
import NIOCore
import NIOPosix

// Swift concurrency's tasks run on NIO's event loop threads instead of a second pool: the
// gateway's handlers and AsyncHTTPClient then share threads, which saves a thread hop and a
// dispatch queue round trip per request (measured in bench/RESULTS.md). It must happen before
// the first task exists, hence top-level code rather than `@main`.
NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()

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
