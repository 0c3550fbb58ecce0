import Foundation
import NIOSSL
import RedisClient
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A `redis-server` of its own on 127.0.0.1 (never a system one): no persistence, a port the
/// kernel chose, optionally a password and TLS. Tests kill and restart it on the same port.
public final class RedisServer: Sendable {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// TLS files for `--tls-port`: the server's certificate and key, and the CA clients trust.
    public struct TLSFiles: Sendable {
        public var certificateFile: String
        public var keyFile: String
        public var caFile: String

        public init(certificateFile: String, keyFile: String, caFile: String) {
            self.certificateFile = certificateFile
            self.keyFile = keyFile
            self.caFile = caFile
        }
    }

    public let port: Int
    public let password: String?
    public let tls: TLSFiles?
    public let directory: URL
    private let process: Mutex<ChildProcess?>

    public static var available: Bool { ChildProcess.locate("redis-server") != nil }

    /// `redis://127.0.0.1:PORT/0` (or `rediss://`), without the password.
    public var url: String { "\(tls == nil ? "redis" : "rediss")://127.0.0.1:\(port)/0" }

    public static func start(password: String? = nil, tls: TLSFiles? = nil) async throws -> RedisServer {
        guard available else { throw Failure(description: "redis-server is not installed (scripts/test installs it)") }
        var lastError: any Error = Failure(description: "redis-server did not start")
        for _ in 0..<5 {
            let directory = try ScratchDirectory.make("portico")
            let server = RedisServer(port: try unusedPort(), password: password, tls: tls, directory: directory)
            do {
                try await server.launch()
                return server
            } catch {
                lastError = error
                server.stop()
            }
        }
        throw lastError
    }

    /// A free port below the kernel's ephemeral range (32768 and up by default), so no test that
    /// binds port 0 can be handed it — not while this server runs, nor while a test has killed it
    /// and is about to start it again on the same port.
    static func unusedPort() throws -> Int {
        for _ in 0..<100 {
            let port = Int.random(in: 20_000..<32_000)
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard fd >= 0 else { break }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = UInt16(port).bigEndian
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
            }
            close(fd)
            if bound { return port }
        }
        return try ExternalServer.freePort()
    }

    private init(port: Int, password: String?, tls: TLSFiles?, directory: URL) {
        self.port = port
        self.password = password
        self.tls = tls
        self.directory = directory
        self.process = Mutex(nil)
    }

    private var arguments: [String] {
        var arguments = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no",
                         "--dir", directory.path, "--logfile", directory.appendingPathComponent("redis.log").path]
        if let tls {
            arguments += ["--port", "0", "--tls-port", String(port), "--tls-cert-file", tls.certificateFile,
                          "--tls-key-file", tls.keyFile, "--tls-ca-cert-file", tls.caFile, "--tls-auth-clients", "no"]
        } else {
            arguments += ["--port", String(port)]
        }
        if let password { arguments += ["--requirepass", password] }
        return arguments
    }

    /// Starts the server (again, on the same port) and waits until it accepts connections.
    public func launch() async throws {
        let executable = ChildProcess.locate("redis-server")!
        let child = try ChildProcess(executable: executable, arguments: arguments)
        process.withLock { $0 = child }
        let deadline = ContinuousClock.now.advanced(by: .seconds(30))
        while ContinuousClock.now < deadline, child.isRunning {
            if (try? RawHTTPConnection(port: port, timeout: .seconds(1))) != nil { return }
            try await Task.sleep(for: .milliseconds(20))
        }
        await child.terminate()
        throw Failure(description: "redis-server did not start on 127.0.0.1:\(port): \(log)")
    }

    /// SIGKILL, as a crash would: no goodbye to clients. Returns once it has exited.
    public func kill() async {
        guard let child = process.withLock({ $0 }) else { return }
        child.signal(SIGKILL)
        _ = await child.waitForExit(timeout: .seconds(10))
    }

    /// SIGSTOP: the server keeps its connections but answers nothing, as a stalled one would.
    public func pause() {
        process.withLock { $0 }?.signal(SIGSTOP)
    }

    /// SIGCONT after `pause`.
    public func resume() {
        process.withLock { $0 }?.signal(SIGCONT)
    }

    /// The server's log file (for failure messages).
    public var log: String {
        String(((try? String(contentsOf: directory.appendingPathComponent("redis.log"), encoding: .utf8)) ?? "").suffix(3000))
    }

    /// A client configuration for this server (password and TLS trust included).
    public func configuration() throws -> RedisConfiguration {
        var configuration = try RedisConfiguration(url: url)
        configuration.password = password
        if let tls {
            var settings = configuration.tls!
            settings.trustRoots = .file(tls.caFile)
            configuration.tls = settings
        }
        configuration.connections = 1
        configuration.commandTimeout = .seconds(10)
        configuration.connectTimeout = .seconds(10)
        return configuration
    }

    /// Stops the server in the background and removes its folder.
    public func stop() {
        resume()
        if let child = process.withLock({ $0 }) {
            child.stopInBackground(removing: directory)
        } else {
            ScratchDirectory.remove(directory)
        }
    }
}
