import Foundation
import Portico
import PorticoTesting
import Synchronization
import Testing

/// An upstream's capacity: `slots` requests served at a time, the rest queued in arrival order.
actor CapacityGate {
    private var free: Int
    private var waiting: [CheckedContinuation<Void, Never>] = []

    init(slots: Int) { free = slots }

    func acquire() async {
        if free > 0 {
            free -= 1
            return
        }
        await withCheckedContinuation { waiting.append($0) }
    }

    func release() {
        if waiting.isEmpty {
            free += 1
        } else {
            waiting.removeFirst().resume()
        }
    }
}

/// Issue #44 end to end: `balance: ewma` and `concurrency: adaptive` through the real gateway,
/// against in-process upstreams whose latency is real. Assertions are shares and bands, never
/// times: a loaded machine moves latencies, not which endpoint is slower or where a queue starts.
@Suite("Tail: latency-aware balancing and adaptive concurrency")
struct TailTests {
    /// `workers` callers, each sending `requests` one after another over keep-alive connections.
    static func drive(_ gateway: TestGateway, path: String, workers: Int, requests: Int) async throws -> [Int] {
        try await withThrowingTaskGroup(of: [Int].self) { group in
            for _ in 0..<workers {
                group.addTask {
                    let connection = try gateway.connect()
                    var statuses: [Int] = []
                    for _ in 0..<requests {
                        try await connection.send("GET \(path) HTTP/1.1\r\nHost: tail.test\r\n\r\n")
                        guard let response = try await connection.readResponse() else { break }
                        statuses.append(response.status)
                    }
                    return statuses
                }
            }
            var all: [Int] = []
            for try await statuses in group { all += statuses }
            return all
        }
    }

    /// Requests each of two endpoints got, the second 30 ms slower, through `balance`.
    static func slowShare(_ balance: BalanceStrategy) async throws -> (share: Double, counts: [Int]) {
        let counts = Shared<[Int]>([0, 0])
        var upstreams: [TestUpstream] = []
        for (index, host) in ["127.0.0.1", "127.0.0.2"].enumerated() {
            let upstream = TestUpstream(host: host)
            upstream.route("/api/item") { _ in
                counts.update { $0[index] += 1 }
                if index == 1 { try await Task.sleep(for: .milliseconds(30)) }
                return .text("ok\n")
            }
            try await upstream.start()
            upstreams.append(upstream)
        }
        let gateway = try TestGateway(resilienceConfig(upstreams.map(\.baseURL), transport: .nio) { $0.balance = balance })
        let statuses = try await drive(gateway, path: "/api/item", workers: 4, requests: 150)
        #expect(statuses.allSatisfy { $0 == 200 }, "\(Set(statuses))")
        await gateway.stop()
        for upstream in upstreams { await upstream.shutdown() }
        let seen = counts.current
        return (Double(seen[1]) / Double(max(1, seen[0] + seen[1])), seen)
    }

    // least_request sees the slower endpoint only through its queue: with one request in flight
    // per loop every pick is a tie (half each); at concurrency 4 over the test gateway's two loops
    // the slow one holds one request per loop most of the time, about 15 %. ewma sees its latency:
    // it gets a probe now and then.
    @Test("two endpoints, one 30 ms slower, at concurrency 4: ewma sends the slow one a small share, less than least_request")
    func slowEndpoint() async throws {
        let ewma = try await Self.slowShare(.ewma)
        let leastRequest = try await Self.slowShare(.leastRequest)
        #expect(ewma.share < 0.15, "ewma: \(ewma.counts), least_request: \(leastRequest.counts)")
        #expect(ewma.share < leastRequest.share, "ewma: \(ewma.counts), least_request: \(leastRequest.counts)")
        #expect(leastRequest.counts[1] > 0)
    }

    @Test("an upstream serving 16 at a time, offered 200 callers: the adaptive limit settles near 16 and the excess gets 503 at once")
    func adaptiveLimit() async throws {
        let gate = CapacityGate(slots: 16)
        // Requests at the upstream (served or queued) now, and the most ever.
        let atUpstream = Shared<(now: Int, peak: Int)>((0, 0))
        let upstream = TestUpstream()
        upstream.route("/api/work") { _ in
            atUpstream.update { $0.now += 1; $0.peak = max($0.peak, $0.now) }
            await gate.acquire()
            try? await Task.sleep(for: .milliseconds(100))
            await gate.release()
            atUpstream.update { $0.now -= 1 }
            return .text("done\n")
        }
        try await upstream.start()
        let gateway = try TestGateway(resilienceConfig([upstream.baseURL], transport: .nio) {
            $0.adaptiveConcurrency = AdaptiveConcurrencyConfig()
        })
        func report() -> UpstreamReport.Adaptive? {
            UpstreamReport(gateway.server.gateway.current).upstreams.first { $0.name == "app" }?.adaptiveConcurrency
        }
        #expect(report()?.limit == 4)
        let deadline = ContinuousClock.now.advanced(by: .seconds(6))
        let served = Shared<Int>(0), refused = Shared<Int>(0)
        let refusal = Shared<RawHTTPResponse?>(nil)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<200 {
                group.addTask {
                    var connection = try gateway.connect()
                    while ContinuousClock.now < deadline {
                        try await connection.send("GET /api/work HTTP/1.1\r\nHost: tail.test\r\n\r\n")
                        guard let response = try await connection.readResponse() else {
                            connection = try gateway.connect()
                            continue
                        }
                        if response.status == 503 {
                            refused.update { $0 += 1 }
                            refusal.update { $0 = $0 ?? response }
                            // A caller that honours Retry-After comes back later; this one, soon.
                            try await Task.sleep(for: .milliseconds(50))
                        } else {
                            #expect(response.status == 200)
                            served.update { $0 += 1 }
                        }
                    }
                }
            }
            // The limit over the second half of the run, where it has settled.
            group.addTask {
                try await Task.sleep(for: .seconds(3))
                var limits: [Int] = []
                while ContinuousClock.now < deadline {
                    if let limit = report()?.limit { limits.append(limit) }
                    try await Task.sleep(for: .milliseconds(100))
                }
                let median = limits.sorted()[limits.count / 2]
                #expect((8...40).contains(median), "limits: \(limits)")
            }
            try await group.waitForAll()
        }
        #expect(served.current > 0 && refused.current > 0, "served \(served.current), refused \(refused.current)")
        // The excess never reached the upstream: what queued there stayed near the limit, far from 200.
        #expect(atUpstream.current.peak <= 60, "peak at the upstream: \(atUpstream.current.peak)")
        let answer = try #require(refusal.current)
        #expect(answer.header("retry-after") == "1")
        #expect(answer.bodyText.contains(#""error":"upstream_overloaded""#))
        #expect(answer.bodyText.contains("adaptive concurrency limit"))
        #expect(answer.bodyText.contains(#""request_id":"#))
        let settled = try #require(report())
        #expect(settled.minLatencyMs.map { $0 >= 100 } == true, "min latency \(String(describing: settled.minLatencyMs))")
        await gateway.stop()
        await upstream.shutdown()
    }
}
