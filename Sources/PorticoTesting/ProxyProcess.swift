import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A proxy run as a child process in front of an upstream, for end-to-end streaming tests: the
/// built `portico` binary with a generated YAML config (ports chosen by the kernel, read from its
/// log), or nginx (`master_process off`, so the process measured is the one moving the bytes).
/// Peak memory is read from the process's `/proc/PID/status`.
public final class ProxyProcess: Sendable {
    public let name: String
    public let port: Int
    /// Portico's admin listener (`/metrics`); nil for nginx.
    public let adminPort: Int?
    private let process: ChildProcess
    private let directory: URL
    private let logPath: String

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public var pid: pid_t { process.pid }

    /// `portico` next to the test bundle (`swift build` puts both in `.build/<config>/`), or
    /// `$PORTICO_BINARY`.
    public static var porticoBinary: String {
        if let path = ProcessInfo.processInfo.environment["PORTICO_BINARY"], !path.isEmpty { return path }
        return URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("portico").path
    }

    /// Runs `portico run --config` with `yaml` (its `listen.port` and `admin.port` should be 0).
    /// `launcher` goes before the binary: `["taskset", "-c", "0"]`, or `["env", "NAME=value"]`.
    public static func portico(yaml: String, name: String = "portico", launcher: [String] = []) async throws -> ProxyProcess {
        let binary = porticoBinary
        guard FileManager.default.isExecutableFile(atPath: binary) else {
            throw Failure(description: "no portico binary at \(binary): build the portico product first (swift build --build-tests builds it)")
        }
        return try await ScratchDirectory.make("portico-proxy") { directory in
            let config = directory.appendingPathComponent("portico.yaml")
            try yaml.write(to: config, atomically: true, encoding: .utf8)
            let log = directory.appendingPathComponent("portico.log").path
            let command = launcher + [binary, "run", "--config", config.path]
            let executable = command[0].hasPrefix("/") ? command[0] : ChildProcess.locate(command[0]) ?? command[0]
            let process = try ChildProcess(executable: executable, arguments: Array(command.dropFirst()),
                                           standardOutput: .file(log), standardError: .file(log))
            let text: @Sendable () -> String = { (try? String(contentsOfFile: log, encoding: .utf8)) ?? "" }
            let deadline = ContinuousClock.now.advanced(by: .seconds(60))
            while ContinuousClock.now < deadline, process.isRunning {
                let lines = text().split(separator: "\n")
                if let proxy = lines.first(where: { $0.contains("msg=listening") }).flatMap({ portField($0) }),
                   let admin = lines.first(where: { $0.contains("msg=\"admin listening\"") }).flatMap({ portField($0) }) {
                    return ProxyProcess(name: name, port: proxy, adminPort: admin, process: process, directory: directory, logPath: log)
                }
                try await Task.sleep(for: .milliseconds(20))
            }
            await process.terminate()
            throw Failure(description: "portico did not start listening: \(text())")
        }
    }

    /// `count` Portico processes with one configuration, as the replicas of a deployment
    /// (`replica-0`, `replica-1`, …); those started are stopped when one fails to start.
    public static func fleet(yaml: String, count: Int = 3) async throws -> [ProxyProcess] {
        var replicas: [ProxyProcess] = []
        for index in 0..<count {
            do {
                replicas.append(try await portico(yaml: yaml, name: "replica-\(index)"))
            } catch {
                replicas.forEach { $0.stop() }
                throw error
            }
        }
        return replicas
    }

    /// nginx with one `server { }` whose body is `serverBlock` (the `listen` line is added), single
    /// process, on a port the kernel chose a moment ago (retried if another test took it).
    public static func nginx(serverBlock: String, name: String = "nginx") async throws -> ProxyProcess {
        guard let nginx = ChildProcess.locate("nginx") else { throw Failure(description: "nginx is not installed (scripts/test installs nginx-light)") }
        var lastError: any Error = Failure(description: "nginx did not start")
        for _ in 0..<5 {
            let directory = try ScratchDirectory.make("portico-proxy")
            let port = try ExternalServer.freePort()
            let config = ExternalServer.nginxConfig(serverBlock: serverBlock, port: port, directory: directory)
                .replacingOccurrences(of: "daemon off;", with: "daemon off;\nmaster_process off;")
            try config.write(to: directory.appendingPathComponent("nginx.conf"), atomically: true, encoding: .utf8)
            let log = directory.appendingPathComponent("stderr.log").path
            let process = try ChildProcess(executable: nginx, arguments: ["-p", directory.path, "-c", "\(directory.path)/nginx.conf"],
                                           standardError: .file(log))
            let deadline = ContinuousClock.now.advanced(by: .seconds(30))
            while ContinuousClock.now < deadline, process.isRunning {
                if (try? RawHTTPConnection(port: port, timeout: .seconds(1))) != nil {
                    return ProxyProcess(name: name, port: port, adminPort: nil, process: process, directory: directory, logPath: log)
                }
                try await Task.sleep(for: .milliseconds(20))
            }
            await process.terminate()
            let errors = (try? String(contentsOf: directory.appendingPathComponent("error.log"), encoding: .utf8)) ?? ""
            lastError = Failure(description: "nginx did not start on \(port): \(errors)")
            ScratchDirectory.remove(directory)
        }
        throw lastError
    }

    private init(name: String, port: Int, adminPort: Int?, process: ChildProcess, directory: URL, logPath: String) {
        self.name = name
        self.port = port
        self.adminPort = adminPort
        self.process = process
        self.directory = directory
        self.logPath = logPath
    }

    public func url(_ target: String) -> String { "http://127.0.0.1:\(port)\(target)" }

    public var isRunning: Bool { process.isRunning }

    /// Its log (Portico's stdout and stderr; nginx's error.log), for failure messages.
    public var log: String {
        let primary = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
        let errors = (try? String(contentsOf: directory.appendingPathComponent("error.log"), encoding: .utf8)) ?? ""
        return String((primary + errors).suffix(4000))
    }

    /// `VmHWM` (peak resident set) and `VmRSS` from `/proc/PID/status`, in bytes.
    public func memory() throws -> (peak: Int, current: Int) {
        let status = try String(contentsOfFile: "/proc/\(process.pid)/status", encoding: .utf8)
        func field(_ name: String) -> Int? {
            status.split(separator: "\n").first { $0.hasPrefix(name + ":") }
                .flatMap { $0.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first }
                .flatMap { Int($0) }.map { $0 * 1024 }
        }
        guard let peak = field("VmHWM"), let current = field("VmRSS") else { throw Failure(description: "no VmHWM in /proc/\(process.pid)/status") }
        return (peak, current)
    }

    /// A gauge or counter from Portico's `/metrics` (the sum over all label sets of `name`); throws
    /// when `name` is not there (a renamed metric must not pass as zero).
    public func metric(_ name: String) async throws -> Double {
        guard let adminPort else { throw Failure(description: "\(self.name) has no /metrics") }
        let connection = try RawHTTPConnection(port: adminPort, timeout: .seconds(10))
        try await connection.send("GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
        guard let response = try await connection.readResponse(), response.status == 200 else {
            throw Failure(description: "GET /metrics failed")
        }
        let values = response.bodyText.split(separator: "\n")
            .filter { $0.hasPrefix(name + " ") || $0.hasPrefix(name + "{") }
            .compactMap { $0.split(separator: " ").last.flatMap { Double($0) } }
        guard !values.isEmpty else { throw Failure(description: "no \(name) in /metrics") }
        return values.reduce(0, +)
    }

    /// SIGTERM now; reaped (SIGKILL as a last resort) and its folder removed in the background.
    public func stop() {
        process.stopInBackground(removing: directory)
    }

    /// Stops it gracefully (SIGTERM) and waits for it to exit; the directory stays until `stop`.
    public func terminate() async {
        await process.terminate(grace: .seconds(30))
    }

    /// A file in its private directory (removed by `stop`).
    public func file(_ name: String) -> String {
        directory.appendingPathComponent(name).path
    }

    private static func portField(_ line: Substring) -> Int? {
        line.split(separator: " ").first { $0.hasPrefix("port=") }.flatMap { Int($0.dropFirst(5)) }
    }

}
