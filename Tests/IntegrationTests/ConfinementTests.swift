import Foundation
import PorticoTesting
import Testing

/// Issue #33: a proxied request lives on one core. The gateway runs as its own process with
/// `PORTICO_LOCK_AUDIT`, so every lock it makes records which threads take it (nothing else of
/// the test process is counted), proxies 10 000 requests on 4 threads, and writes the report.
@Suite("Confinement: the locks a proxied request takes are each taken by one thread")
struct ConfinementTests {
    /// Every counter more than one thread may change while proxying: the documented global caps
    /// (README, "Scaling"), each one atomic.
    static let documentedSharedCounters: Set<String> = [
        "cap: listen.connection_limit",
        "cap: listen.max_in_flight",
        "cap: upstreams.up.max_connections",
        // Taken per WebSocket handshake and session end only (issue #35); not by plain requests.
        "cap: listen.max_websockets",
    ]

    struct Instance: Decodable {
        var site: String
        var acquisitions: Int
        var threads: [String: Int]
    }

    static func yaml(upstreamPort: Int) -> String {
        """
        listen: { address: 127.0.0.1, port: 0, threads: 4, max_in_flight: 100000 }
        admin: { address: 127.0.0.1, port: 0 }
        logging: { level: info, format: logfmt }
        upstreams:
          up: { url: "http://127.0.0.1:\(upstreamPort)", transport: nio, max_connections: 64 }
        routes:
          - { name: proxied, match: { path_prefix: / }, upstream: up }
        """
    }

    @Test("10 000 proxied requests on 4 threads: every lock taken per request is taken by one thread only; shared counters are the documented caps")
    func proxiedRequestsAreConfined() async throws {
        let upstream = TestUpstream()
        upstream.route("/item", .text("ok\n"))
        try await upstream.start()
        let reportPath = NSTemporaryDirectory() + "portico-lock-audit-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).json"
        defer { try? FileManager.default.removeItem(atPath: reportPath) }
        let audited = try await ProxyProcess.portico(yaml: Self.yaml(upstreamPort: upstream.port), name: "confined",
                                                     launcher: ["env", "PORTICO_LOCK_AUDIT=" + reportPath])
        defer { audited.stop() }

        // 16 keep-alive connections, 625 requests each, one at a time per connection.
        let requests = 10_000, connections = 16
        try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<connections {
                group.addTask {
                    let connection = try RawHTTPConnection(port: audited.port)
                    var ok = 0
                    for _ in 0..<(requests / connections) {
                        try await connection.send("GET /item HTTP/1.1\r\nHost: x\r\n\r\n")
                        if try await connection.readResponse()?.status == 200 { ok += 1 }
                    }
                    return ok
                }
            }
            var ok = 0
            for try await count in group { ok += count }
            #expect(ok == requests)
        }
        await audited.terminate()
        let data = try Data(contentsOf: URL(fileURLWithPath: reportPath))
        let instances = try JSONDecoder().decode([Instance].self, from: data)

        // Two kinds of lock are taken per request. A long-lived one (a registry, a pool, a
        // runtime slot) taken at least once per request of one thread's share: one thread takes
        // it per request; another may take it only for start, stop and admin reads (a few times).
        // A per-request one (a site making thousands of short-lived locks): each instance is
        // taken by one thread.
        let perRequestInstances = requests / 8
        var confined: [String] = []
        for instance in instances where !instance.site.hasPrefix("cap: ") && instance.acquisitions >= perRequestInstances {
            let main = instance.threads.values.max() ?? 0
            let others = instance.acquisitions - main
            #expect(others <= 10, "\(instance.site): taken \(instance.acquisitions) times by \(instance.threads.count) threads \(instance.threads.values.sorted(by: >))")
            confined.append(instance.site)
        }
        let bySite = Dictionary(grouping: instances.filter { !$0.site.hasPrefix("cap: ") && $0.acquisitions < perRequestInstances },
                                by: \.site)
        for (site, group) in bySite.sorted(by: { $0.key < $1.key }) where group.count >= requests / 2 {
            let shared = group.filter { $0.threads.count > 1 }
            #expect(shared.isEmpty, "\(site): \(shared.count) of \(group.count) per-request instances taken by several threads")
            confined.append(site)
        }
        // Locks exist on the path (the test would prove nothing otherwise): the runtime slots at least.
        #expect(confined.contains { $0.contains("Gateway.swift") }, "per-request locks: \(confined)")

        // Counters several threads change: only the documented caps, each an atomic.
        let counters = Set(instances.filter { $0.site.hasPrefix("cap: ") && $0.threads.count > 1 }.map(\.site))
        #expect(counters.isSubset(of: Self.documentedSharedCounters), "shared counters: \(counters.sorted())")
    }

    /// Every middleware in the default chain, outermost first (issue #42). `rate_limit` keyed by
    /// route: one bucket every thread draws from, the hardest case; its rate never refuses.
    static func chainYAML(upstreamPort: Int) -> String {
        """
        listen: { address: 127.0.0.1, port: 0, threads: 4, max_in_flight: 100000 }
        admin: { address: 127.0.0.1, port: 0 }
        logging: { level: info, format: logfmt }
        credentials:
          key: { type: static, header: X-Api-Key, value: confinement-secret }
        upstreams:
          up: { url: "http://127.0.0.1:\(upstreamPort)", transport: nio, max_connections: 64 }
        middleware:
          log: { type: access_log }
          limit: { type: rate_limit, key: route, rate: 10000000/s, burst: 10000000 }
          headers: { type: headers, request: { set: { X-Gateway-Route: "${route}" } }, response: { add: { X-Served-By: portico } } }
          compress: { type: compress, min_bytes: 1KiB }
          cache: { type: cache, max_bytes: 16MiB }
          retry: { type: retry, attempts: 3 }
          auth: { type: auth, credential: key }
        defaults:
          middleware: [log, limit, headers, compress, cache, retry, auth]
        routes:
          - { name: chained, match: { path_prefix: / }, upstream: up }
        """
    }


    @Test("the default chain with every middleware, 4 000 requests on 4 threads: long-lived locks are each one thread's (the hot rate-limit bucket is one atomic, found through each thread's own table), per-request ones one pair's, and every lock or counter several threads take is documented in docs/shared-state.md")
    func fullChainIsConfined() async throws {
        let upstream = TestUpstream()
        // A pass-through (no-store), a cache hit, a compressed pass-through, and an unsafe method.
        // It answers 200 only to requests that `auth` and `headers` changed.
        upstream.route("/pass") { request in
            let changed = request.values("x-api-key") == ["confinement-secret"] && request.values("x-gateway-route") == ["chained"]
            return TestUpstream.Response(status: changed ? 200 : 500,
                                         headers: [("Content-Type", "text/plain"), ("Cache-Control", "no-store")], body: "ok\n")
        }
        upstream.route("/cached", TestUpstream.Response(headers: [("Content-Type", "text/plain"), ("Cache-Control", "max-age=3600")],
                                                        body: "stored\n"))
        upstream.route("/big", TestUpstream.Response(headers: [("Content-Type", "text/plain"), ("Cache-Control", "no-store")],
                                                     body: String(repeating: "compressible text ", count: 200)))
        upstream.route("/submit", TestUpstream.Response(headers: [("Content-Type", "text/plain")], body: "done\n"))
        try await upstream.start()
        let requests = [
            "GET /pass HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /cached HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /big HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n",
            "POST /submit HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
        ]
        let (instances, answers) = try await Self.audit(yaml: Self.chainYAML(upstreamPort: upstream.port), requests: requests)
        #expect(answers.ok == Self.chainRequests, "statuses: \(answers.statuses)")
        // The chain ran: compressed and cached as configured (credential and headers: /pass).
        #expect(answers.gzipped == Self.chainRequests / 4 && answers.hits > Self.chainRequests / 5)
        #expect(upstream.hits("/cached") <= 16, "the cached path went upstream \(upstream.hits("/cached")) times")
        #expect(answers.served == Self.chainRequests / 4, "responses with the headers middleware's field: \(answers.served) of each \(Self.chainRequests / 4) per path")

        let violations = Self.perRequestViolations(instances, requests: Self.chainRequests, allowed: [],
                                                   pairs: true)
        #expect(violations.isEmpty, "\(violations.joined(separator: "\n"))")

        // Every site several threads took (a lock, or a `cap:` counter), each documented.
        let shared = Set(instances.filter { $0.threads.count > 1 }.map { Self.fileID($0.site) })
        let documented = try Self.documentedSharedSites()
        let undocumented = shared.subtracting(documented).sorted()
        #expect(undocumented.isEmpty, "taken by several threads, not in docs/shared-state.md: \(undocumented)")
    }

    /// What the requests got.
    struct Answers {
        var ok = 0
        var statuses: [Int: Int] = [:]
        var gzipped = 0
        var hits = 0
        /// Responses to /pass with the `headers` middleware's response field.
        var served = 0
    }

    /// Runs the gateway from `yaml` audited in its own process, sends 10 000 requests over 16
    /// keep-alive connections (each cycling through `requests`), stops it and reads the report.
    /// Requests through the full chain: 4,000 (was 10,000) keeps the audited process from
    /// starving the rest of the suite on two cores; a per-request lock is still taken 1,000 times.
    static let chainRequests = 4_000

    static func audit(yaml: String, requests: [String]) async throws -> ([Instance], Answers) {
        let reportPath = NSTemporaryDirectory() + "portico-lock-audit-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).json"
        defer { try? FileManager.default.removeItem(atPath: reportPath) }
        let audited = try await ProxyProcess.portico(yaml: yaml, name: "confined",
                                                     launcher: ["env", "PORTICO_LOCK_AUDIT=" + reportPath])
        defer { audited.stop() }
        let total = chainRequests, connections = 16
        let answers = try await withThrowingTaskGroup(of: Answers.self) { group in
            for connectionIndex in 0..<connections {
                group.addTask {
                    let connection = try RawHTTPConnection(port: audited.port)
                    var answers = Answers()
                    for index in 0..<(total / connections) {
                        try await connection.send(requests[(connectionIndex + index) % requests.count])
                        guard let response = try await connection.readResponse() else { break }
                        answers.statuses[response.status, default: 0] += 1
                        if response.status == 200 { answers.ok += 1 }
                        if requests[(connectionIndex + index) % requests.count].hasPrefix("GET /pass"),
                           response.header("x-served-by") == "portico" { answers.served += 1 }
                        if response.header("content-encoding") == "gzip" { answers.gzipped += 1 }
                        if response.header("x-cache")?.hasPrefix("HIT") == true
                            || response.header("cache-status")?.contains("hit") == true { answers.hits += 1 }
                    }
                    return answers
                }
            }
            var all = Answers()
            for try await part in group {
                all.ok += part.ok
                all.gzipped += part.gzipped
                all.hits += part.hits
                all.served += part.served
                all.statuses.merge(part.statuses, uniquingKeysWith: +)
            }
            return all
        }
        await audited.terminate()
        let data = try Data(contentsOf: URL(fileURLWithPath: reportPath))
        // PORTICO_CONFINEMENT_REPORTS=DIR keeps each report, for updating docs/shared-state.md.
        if let directory = ProcessInfo.processInfo.environment["PORTICO_CONFINEMENT_REPORTS"] {
            try? data.write(to: URL(fileURLWithPath: directory).appendingPathComponent("lock-audit-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).json"))
        }
        return (try JSONDecoder().decode([Instance].self, from: data), answers)
    }

    /// Locks taken per request by more than one thread, except at `allowed` sites. Two kinds of
    /// lock are taken per request. A long-lived one (a registry, a pool, a runtime slot) taken at
    /// least once per request of one thread's share: one thread takes it per request; another
    /// may take it only for start, stop and admin reads (a few times). A per-request one (a site
    /// making thousands of short-lived locks): each instance is taken by one thread — or, with
    /// `pairs`, by the two threads of one pair (a daemon thread and its event loop: the chain
    /// runs on the loop, a streamed body's end reaches the daemon thread), so that every thread
    /// seen on such instances is seen with one partner only.
    static func perRequestViolations(_ instances: [Instance], requests: Int, allowed: Set<String>,
                                     pairs: Bool = false) -> [String] {
        let perRequestInstances = requests / 8
        var violations: [String] = []
        for instance in instances where !instance.site.hasPrefix("cap: ") && instance.acquisitions >= perRequestInstances
            && !allowed.contains(fileID(instance.site)) {
            let main = instance.threads.values.max() ?? 0
            if instance.acquisitions - main > 10 {
                violations.append("\(instance.site): taken \(instance.acquisitions) times by \(instance.threads.count) threads \(instance.threads.values.sorted(by: >))")
            }
        }
        let bySite = Dictionary(grouping: instances.filter { !$0.site.hasPrefix("cap: ") && $0.acquisitions < perRequestInstances },
                                by: \.site)
        for (site, group) in bySite.sorted(by: { $0.key < $1.key }) where group.count >= requests / 2 && !allowed.contains(fileID(site)) {
            let shared = group.filter { $0.threads.count > (pairs ? 2 : 1) }
            if !shared.isEmpty { violations.append("\(site): \(shared.count) of \(group.count) per-request instances taken by several threads") }
            guard pairs else { continue }
            var partners: [String: Set<String>] = [:]
            for instance in group where instance.threads.count == 2 {
                let threads = Array(instance.threads.keys)
                partners[threads[0], default: []].insert(threads[1])
                partners[threads[1], default: []].insert(threads[0])
            }
            for (thread, others) in partners where others.count > 1 {
                violations.append("\(site): thread \(thread) shares per-request instances with \(others.count) threads, not one partner")
            }
        }
        return violations
    }

    /// A site without its line: `Portico/CacheStore.swift:77` → `Portico/CacheStore.swift`
    /// (lines move with every edit; a file's locks are told apart in the docs); an upstream's
    /// cap without the upstream's name: `cap: upstreams.NAME.max_connections`.
    static func fileID(_ site: String) -> String {
        if site.hasPrefix("cap: upstreams."), site.hasSuffix(".max_connections") { return "cap: upstreams.NAME.max_connections" }
        guard !site.hasPrefix("cap: "), let colon = site.lastIndex(of: ":"),
              site[site.index(after: colon)...].allSatisfy(\.isNumber) else { return site }
        return String(site[..<colon])
    }

    /// The sites of docs/shared-state.md's table of audited locks and counters: the first code
    /// span of each row.
    static func documentedSharedSites() throws -> Set<String> {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let text = try String(contentsOf: root.appendingPathComponent("docs/shared-state.md"), encoding: .utf8)
        var sites: Set<String> = []
        var inTable = false
        for line in text.split(separator: "\n") {
            if line.hasPrefix("## ") { inTable = line.hasPrefix("## Locks and counters the audit sees") }
            guard inTable, line.hasPrefix("| `") else { continue }
            let parts = line.split(separator: "`", omittingEmptySubsequences: false)
            if parts.count > 2 { sites.insert(String(parts[1])) }
        }
        return sites
    }
}
