import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// An independent server (nginx, Python's http.server) run as a child process on 127.0.0.1,
/// so Portico is not only ever tested against itself.
public final class ExternalServer: Sendable {
    public let port: Int
    private let process: ChildProcess
    public let directory: URL

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// Whether `name` is on PATH (or in /usr/sbin for nginx).
    public static func available(_ name: String) -> Bool {
        ChildProcess.locate(name) != nil
    }

    /// A port that was free a moment ago (the kernel's choice for port 0; released at once).
    public static func freePort() throws -> Int {
        try RefusingPort().port
    }

    /// Python's `http.server` serving `files` (name → contents) from a temporary directory.
    public static func pythonFileServer(files: [String: [UInt8]]) async throws -> ExternalServer {
        let python = ChildProcess.locate("python3") ?? "/usr/bin/python3"
        return try await ScratchDirectory.make("portico") { directory in
            for (name, contents) in files {
                try Data(contents).write(to: directory.appendingPathComponent(name))
            }
            return try await retryingPorts { port in
                try await ExternalServer(executable: python, arguments: ["-m", "http.server", String(port), "--bind", "127.0.0.1",
                                                                        "--directory", directory.path],
                                         port: port, directory: directory)
            }
        }
    }

    /// A Python program listening on 127.0.0.1 at the port given as its first argument (a raw
    /// server a test writes to misbehave in one exact way).
    public static func python(script: String) async throws -> ExternalServer {
        let python = ChildProcess.locate("python3") ?? "/usr/bin/python3"
        return try await ScratchDirectory.make("portico") { directory in
            try await retryingPorts { port in
                try await ExternalServer(executable: python, arguments: ["-c", script, String(port)], port: port,
                                         directory: directory)
            }
        }
    }

    /// nginx with `serverBlock` (the inside of one `server { }`, listening on the chosen port
    /// with `listenParameters`, e.g. `http2` or `ssl http2`); `httpBlock` goes in `http { }`
    /// (a `log_format`, say).
    public static func nginx(serverBlock: String, listenParameters: String = "", httpBlock: String = "") async throws -> ExternalServer {
        guard let nginx = ChildProcess.locate("nginx") else { throw Failure(description: "nginx is not installed (scripts/test installs nginx-light)") }
        return try await ScratchDirectory.make("portico") { directory in
            try await retryingPorts { port in
                try nginxConfig(serverBlock: serverBlock, port: port, directory: directory,
                                listenParameters: listenParameters, httpBlock: httpBlock)
                    .write(to: directory.appendingPathComponent("nginx.conf"), atomically: true, encoding: .utf8)
                return try await ExternalServer(executable: nginx, arguments: ["-p", directory.path, "-c", "\(directory.path)/nginx.conf"],
                                                port: port, directory: directory)
            }
        }
    }

    /// Another test may bind the "free" port between our probe and the server's bind: try a few.
    static func retryingPorts(_ start: (Int) async throws -> ExternalServer) async throws -> ExternalServer {
        var lastError: (any Error)?
        for _ in 0..<5 {
            do {
                return try await start(try freePort())
            } catch {
                lastError = error
            }
        }
        throw lastError!
    }

    static func nginxConfig(serverBlock: String, port: Int, directory: URL, listenParameters: String = "",
                            httpBlock: String = "") -> String {
        """
        worker_processes 1;
        daemon off;
        error_log \(directory.path)/error.log warn;
        pid \(directory.path)/nginx.pid;
        events { worker_connections 256; }
        http {
          access_log off;
          client_body_temp_path \(directory.path)/body; proxy_temp_path \(directory.path)/proxy;
          fastcgi_temp_path \(directory.path)/fcgi; uwsgi_temp_path \(directory.path)/uwsgi; scgi_temp_path \(directory.path)/scgi;
          \(httpBlock)
          server {
            listen 127.0.0.1:\(port)\(listenParameters.isEmpty ? "" : " " + listenParameters);
            \(serverBlock)
          }
        }
        """
    }

    init(executable: String, arguments: [String], port: Int, directory: URL) async throws {
        let logPath = directory.appendingPathComponent("stderr.log").path
        let process = try ChildProcess(executable: executable, arguments: arguments, standardError: .file(logPath))
        self.process = process
        self.port = port
        self.directory = directory
        // Wait until it accepts connections (generous: a loaded machine starts Python slowly).
        let deadline = ContinuousClock.now.advanced(by: .seconds(30))
        while ContinuousClock.now < deadline {
            // Listening, and by this child: another test's server may have taken the port
            // between the probe that found it free and the child's bind (then the child exits,
            // and the connection would reach that other server).
            if (try? RawHTTPConnection(port: port, timeout: .seconds(1))) != nil, Self.listens(process.pid, on: port) { return }
            guard process.isRunning else { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        await process.terminate()
        let output = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
        let errorLog = (try? String(contentsOf: directory.appendingPathComponent("error.log"), encoding: .utf8)) ?? ""
        throw Failure(description: "\(executable) did not start listening on 127.0.0.1:\(port): \(output)\(errorLog)")
    }

    /// Whether process `pid` holds a TCP socket listening on `port` on 127.0.0.1 (Linux:
    /// `/proc/net/tcp`'s listening sockets matched to the inodes of the process's descriptors).
    static func listens(_ pid: pid_t, on port: Int) -> Bool {
        guard let table = try? String(contentsOfFile: "/proc/net/tcp", encoding: .utf8) else { return true }
        let local = String(format: "0100007F:%04X", port)
        let inodes = Set(table.split(separator: "\n").dropFirst().compactMap { line -> String? in
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            // sl, local_address, rem_address, st (0A: LISTEN), …, inode is the tenth field.
            guard fields.count > 9, fields[1] == local, fields[3] == "0A" else { return nil }
            return String(fields[9])
        })
        guard !inodes.isEmpty else { return false }
        let descriptors = "/proc/\(pid)/fd"
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: descriptors) else { return false }
        return entries.contains { entry in
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "\(descriptors)/\(entry)"),
                  target.hasPrefix("socket:[") else { return false }
            return inodes.contains(String(target.dropFirst("socket:[".count).dropLast()))
        }
    }

    /// Stops the child without waiting for it (usable from `defer`): SIGTERM now; a task reaps
    /// it, with SIGKILL as a last resort, and removes its directory.
    public func stop() {
        process.stopInBackground(removing: directory)
    }
}
