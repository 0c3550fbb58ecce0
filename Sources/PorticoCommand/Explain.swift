import ArgumentParser
import Foundation
import Logging
import Portico

/// `portico explain`: what the gateway would do with one request, without serving or sending it.
struct Explain: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the route, chain, upstream URL and deadlines a request would get, without serving.",
        discussion: "The same answer as GET /explain on a running gateway's admin listener.")

    @OptionGroup var options: ConfigOption

    @Option(name: .customShort("X"), help: ArgumentHelp("The request method.", valueName: "method"))
    var method = "GET"

    @Option(name: .customShort("H"), help: ArgumentHelp("A request header, 'Name: value' (repeatable).", valueName: "header"))
    var header: [String] = []

    @Option(help: ArgumentHelp("The client address a client_ip rate-limit key would see.", valueName: "address"))
    var client = "127.0.0.1"

    @Flag(help: "Print the JSON that GET /explain answers instead of text.")
    var json = false

    @Argument(help: "http://host/path?query, or /path?query (Host: localhost unless -H gives one).")
    var url: String

    func run() async throws {
        let config = try options.load()
        let runtime: GatewayRuntime
        do {
            runtime = try GatewayRuntime(config: config, logger: Logger(label: "portico.explain", factory: { _ in SwiftLogNoOpLogHandler() }))
        } catch {
            FileHandle.standardError.write(Data("\(options.config): \(error)\n".utf8))
            throw ExitCode(1)
        }
        do {
            let explanation = try Explanation(method: method, url: url, headers: header, client: client, runtime: runtime)
            if json {
                FileHandle.standardOutput.write(Data(explanation.json))
            } else {
                print(explanation.text, terminator: "")
            }
        } catch {
            FileHandle.standardError.write(Data("portico explain: \(error.description)\n".utf8))
            await runtime.shutdown()
            throw ExitCode(2)
        }
        await runtime.shutdown()
    }
}
