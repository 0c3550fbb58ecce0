import Foundation
import PorticoTesting
import Testing

/// `listen.threads` sets the libmicrohttpd threads and the event loops paired with them; `auto`
/// follows the cores the process may use (issue #33). Read from the `listening` log line.
@Suite("Thread sizing: event loops follow listen.threads; auto follows affinity and cgroups")
struct ThreadSizingTests {
    static func yaml(threads: String) -> String {
        """
        listen: { address: 127.0.0.1, port: 0, threads: \(threads) }
        admin: { address: 127.0.0.1, port: 0 }
        logging: { level: info, format: logfmt }
        routes:
          - { name: ping, match: { path: /ping }, direct: { status: 200, body: "pong" } }
        """
    }

    static func threads(of gateway: ProxyProcess) -> Int? {
        let line = gateway.log.split(separator: "\n").first { $0.contains("msg=listening") }
        return line?.split(separator: " ").first { $0.hasPrefix("threads=") }.flatMap { Int($0.dropFirst("threads=".count)) }
    }

    /// Event loop threads of the process: NIO names them `NIO-ELT-<group>-#<n>`.
    static func eventLoopThreads(pid: pid_t) -> Int {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.filter { task in
            let name = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/comm", encoding: .utf8)) ?? ""
            return name.hasPrefix("NIO-ELT-")
        }.count
    }

    @Test("threads: 3 runs 3 daemon threads and one group of 3 event loops")
    func explicitCount() async throws {
        let gateway = try await ProxyProcess.portico(yaml: Self.yaml(threads: "3"))
        defer { gateway.stop() }
        #expect(Self.threads(of: gateway) == 3)
        // The gateway's own group (3) beside NIO's process-wide one (one per core, for the admin
        // listener and token endpoints): the process-wide group is not used for requests.
        let loops = Self.eventLoopThreads(pid: gateway.pid)
        #expect(loops == 3 || loops == 3 + ProcessInfo.processInfo.activeProcessorCount, "event loop threads: \(loops)")
    }

    @Test("threads: auto under taskset -c 0 runs one thread")
    func autoFollowsAffinity() async throws {
        try #require(ChildProcess.locate("taskset") != nil, "taskset (util-linux) is needed")
        let gateway = try await ProxyProcess.portico(yaml: Self.yaml(threads: "auto"), launcher: ["taskset", "-c", "0"])
        defer { gateway.stop() }
        #expect(Self.threads(of: gateway) == 1)
    }

    @Test("threads: auto in a cgroup with a one-CPU quota runs one thread (where a cgroup can be made)")
    func autoFollowsQuota() async throws {
        // cgroup v2 (unified) or v1's cpu controller, whichever this machine mounts writable.
        let candidates = ["/sys/fs/cgroup", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"]
        let name = "portico-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        var made: (directory: String, procs: String)?
        for root in candidates where FileManager.default.fileExists(atPath: root) {
            let directory = root + "/" + name
            guard mkdir(directory, 0o755) == 0 else { continue }
            // A real cgroup has its control files the moment it is made (a plain directory on a
            // tmpfs mount point has none); they are written in place, never created.
            let v2 = FileManager.default.fileExists(atPath: directory + "/cpu.max")
            let quotaFile = directory + (v2 ? "/cpu.max" : "/cpu.cfs_quota_us")
            let wrote = FileManager.default.fileExists(atPath: directory + "/cgroup.procs")
                && FileManager.default.fileExists(atPath: quotaFile)
                && FileHandle(forWritingAtPath: quotaFile).map { handle in
                    defer { try? handle.close() }
                    return (try? handle.write(contentsOf: Data((v2 ? "100000 100000" : "100000").utf8))) != nil
                } == true
            if wrote {
                made = (directory, directory + (v2 ? "/cgroup.procs" : "/tasks"))
                break
            }
            rmdir(directory)
            try? FileManager.default.removeItem(atPath: directory)
        }
        guard let made, ProcessInfo.processInfo.activeProcessorCount > 1 else {
            // Not root, no writable cgroup mount, or one core anyway: the parsing tests cover it.
            return
        }
        defer { rmdir(made.directory) }
        // The shell moves itself into the cgroup, then becomes portico.
        let gateway = try await ProxyProcess.portico(
            yaml: Self.yaml(threads: "auto"),
            launcher: ["sh", "-c", "echo $$ > \(made.procs) && exec \"$0\" \"$@\""])
        defer { gateway.stop() }
        #expect(Self.threads(of: gateway) == 1)
        await gateway.terminate()
    }
}
