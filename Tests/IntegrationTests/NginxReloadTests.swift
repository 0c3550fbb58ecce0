import Foundation
import PorticoTesting
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue #45 as it was seen: nginx upstream reloaded (SIGHUP) twice under load gave callers
/// `502 upstream_connection_closed` (5, 9 and 12 in three runs), with no `retry` middleware: the
/// old worker closes its idle keep-alive connections, and Portico's pool reused some of them in
/// that instant. Now each such request goes out once more on a new connection: no 502.
@Suite("nginx reloaded under load behind Portico (issue #45)", .serialized,
       .enabled(if: ExternalServer.available("nginx"), "needs nginx (scripts/test installs it)"))
struct NginxReloadTests {
    /// The worker processes of nginx's master `pid`.
    static func workers(of pid: Int32) -> Set<Int32> {
        let text = (try? String(contentsOfFile: "/proc/\(pid)/task/\(pid)/children", encoding: .utf8)) ?? ""
        return Set(text.split(separator: " ").compactMap { Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) })
    }

    /// Statuses seen by the clients (`0`: no answer at all).
    final class Tally: Sendable {
        let statuses = Mutex<[Int: Int]>([:])
        let stop = Atomic<Bool>(false)

        var total: Int { statuses.withLock { $0.values.reduce(0, +) } }

        func record(_ status: Int) {
            statuses.withLock { $0[status, default: 0] += 1 }
        }

        /// Waits (polling) until `count` more requests have been answered than when it was called.
        func waitFor(_ count: Int, _ what: String) async throws {
            let start = total
            try await Eventually.wait(timeout: .seconds(120), what) { self.total >= start + count }
        }
    }

    @Test("two reloads of nginx under load: every request answered 200, with no retry middleware", .timeLimit(.minutes(10)))
    func reloadsUnderLoad() async throws {
        let nginx = try await ExternalServer.nginx(serverBlock: """
            keepalive_timeout 75s;
            keepalive_requests 1000000;
            location / { return 200 "ok\\n"; }
            """)
        defer { nginx.stop() }
        let master = try #require(Int32(try String(contentsOf: nginx.directory.appendingPathComponent("nginx.pid"), encoding: .utf8)
                                            .trimmingCharacters(in: .whitespacesAndNewlines)))
        let portico = try await ProxyProcess.portico(yaml: """
            listen: { address: 127.0.0.1, port: 0, threads: 2 }
            admin: { address: 127.0.0.1, port: 0 }
            logging: { level: info, format: logfmt }
            upstreams:
              nginx: { url: "http://127.0.0.1:\(nginx.port)", transport: nio, timeout: 60s, connect_timeout: 30s }
            routes:
              - { name: all, match: { path_prefix: / }, upstream: nginx }
            """)
        defer { portico.stop() }
        let tally = Tally()
        // 16 keep-alive clients, as `wrk -c16` was; each stops when told, or after 20 000 requests.
        let load = Task {
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<16 {
                    group.addTask {
                        var connection: RawHTTPConnection?
                        var sent = 0
                        while sent < 20_000, !tally.stop.load(ordering: .relaxed) {
                            sent += 1
                            do {
                                let client = try connection ?? RawHTTPConnection(port: portico.port, timeout: .seconds(60))
                                connection = client
                                try await client.send("GET /r HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
                                guard let response = try await client.readResponse() else {
                                    tally.record(0)
                                    connection = nil
                                    continue
                                }
                                tally.record(response.status)
                            } catch {
                                tally.record(0)
                                connection = nil
                            }
                        }
                    }
                }
            }
        }
        do {
            try await tally.waitFor(500, "requests before the first reload")
            for reload in 1...2 {
                let before = Self.workers(of: master)
                try #require(!before.isEmpty, "nginx's worker")
                #expect(kill(master, SIGHUP) == 0)
                try await Eventually.wait(timeout: .seconds(120), "reload \(reload): the old worker gone, a new one up") {
                    let now = Self.workers(of: master)
                    return !now.isEmpty && now.isDisjoint(with: before)
                }
                try await tally.waitFor(500, "requests after reload \(reload)")
            }
        } catch {
            tally.stop.store(true, ordering: .relaxed)
            await load.value
            throw error
        }
        tally.stop.store(true, ordering: .relaxed)
        await load.value
        let statuses = tally.statuses.withLock { $0 }
        #expect(statuses.keys.sorted() == [200], "statuses: \(statuses)")
        let resends = try await portico.metric("portico_upstream_stale_retries_total")
        print("nginx reloads: \(statuses[200] ?? 0) requests answered 200, \(Int(resends)) sent again after a stale connection")
    }
}
