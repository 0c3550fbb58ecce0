import Foundation
import Portico
import PorticoTesting
import Testing

/// `on_limit: wait` through a real gateway on the injected clock (issue #41): the token is decided
/// on libmicrohttpd's thread and the request's task waits before any of its chain runs
/// (`DeferredStart`). The waiting request goes when the test moves time; a client that hangs up
/// while waiting is noticed by the server's hang-up watch, which cuts the wait short.
@Suite("Rate limit waiting on a real gateway, started when the token is due")
struct RateLimitWaitingGatewayTests {
    static func gateway(clock: ManualClock) throws -> (TestGateway, RateLimitQueue) {
        let config = try ConfigLoader.load(yaml: """
            listen: { address: 127.0.0.1, port: 0, request_timeout: 300s }
            logging: { level: error }
            middleware:
              log: { type: access_log }
              pace: { type: rate_limit, key: route, rate: 2/s, burst: 1, on_limit: wait, max_wait: 60s, max_waiting: 2 }
            routes:
              - { name: paced, match: { path: /paced }, direct: { body: "ok\\n" }, middleware: [log, pace] }
            """, environment: [:])
        let gateway = try TestGateway(config, clock: clock)
        let queue = try #require((gateway.server.gateway.current.middleware["pace"] as? RateLimitMiddleware)?.queue)
        return (gateway, queue)
    }

    @Test("a request over the rate is answered when its token is due, with its wait; a third waiter over max_waiting is refused at once")
    func waitsThenGoes() async throws {
        let clock = ManualClock()
        let (gateway, queue) = try Self.gateway(clock: clock)
        defer { Task { await gateway.stop() } }
        #expect(try await gateway.request("GET", "/paced").status == 200, "the burst's one token")
        // Sent one after the other, so the second holds the earlier token.
        let second = Task { try await gateway.request("GET", "/paced") }
        await clock.waitForSleepers(1)
        let third = Task { try await gateway.request("GET", "/paced") }
        await clock.waitForSleepers(2)
        #expect(queue.count == 2)
        let refused = try await gateway.request("GET", "/paced")
        #expect(refused.status == 429, "max_waiting: 2 already wait")
        #expect(refused.bodyText.contains("rate_limited"))
        #expect(refused.header("retry-after") != nil)
        #expect(clock.nextDeadline == clock.now.advanced(by: .milliseconds(500)))
        clock.advance(by: .milliseconds(500))
        let answered = try await second.value
        #expect(answered.status == 200 && answered.bodyText == "ok\n")
        #expect(answered.header("ratelimit")?.contains("\"pace\"") == true, "the limit's headers: \(answered.headers)")
        clock.advance(by: .milliseconds(500))
        #expect(try await third.value.status == 200)
        #expect(queue.count == 0)
    }

    @Test("a client that hangs up while waiting frees its place and its token: the next request waits for the slot it held")
    func leaverGivesBack() async throws {
        let clock = ManualClock()
        let (gateway, queue) = try Self.gateway(clock: clock)
        defer { Task { await gateway.stop() } }
        #expect(try await gateway.request("GET", "/paced").status == 200, "the burst's one token")
        let leaver = try gateway.connect()
        try await leaver.send("GET /paced HTTP/1.1\r\nHost: t\r\n\r\n")
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == clock.now.advanced(by: .milliseconds(500)))
        leaver.reset()
        try await Eventually.wait("the leaver's place freed") { queue.count == 0 }
        try await Eventually.wait("the leaver's wait ended") { clock.sleeperCount == 0 }
        let next = Task { try await gateway.request("GET", "/paced") }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == clock.now.advanced(by: .milliseconds(500)), "the leaver's slot, not the one after it")
        clock.advance(by: .milliseconds(500))
        #expect(try await next.value.status == 200)
    }
}
