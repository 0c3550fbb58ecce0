import Foundation
import PorticoTesting
import Testing

/// deploy/grafana/portico.json against the gateway it draws: every metric any query names must
/// be one the running binary exports at /metrics (a histogram's `_bucket`, `_sum` and `_count`
/// belong to its family), with the labels the query groups and filters by. The gateway runs with
/// a configuration and traffic that make every family appear: a cache hit and miss, a 429, a
/// token fetch, a refused upstream with a retry, an open stream and an overload refusal, a reload,
/// a request that waited for its token, a provider's published budget and its 429, a quota's count.
@Suite("Grafana dashboard", .timeLimit(.minutes(5)))
struct GrafanaDashboardTests {
    static let root = DashboardBrowserTests.root
    static let path = root.appendingPathComponent("deploy/grafana/portico.json")

    // MARK: The dashboard's queries

    struct Query: Sendable {
        var panel: String
        var expr: String
    }

    static func dashboard() throws -> [String: Any] {
        let data = try Data(contentsOf: path)
        return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    /// Every PromQL expression: panel targets (rows' nested panels too), template variables'
    /// `label_values(…)` queries and annotations.
    static func queries(_ dashboard: [String: Any]) -> [Query] {
        var result: [Query] = []
        func visit(panels: [[String: Any]]) {
            for panel in panels {
                let title = panel["title"] as? String ?? "?"
                for target in panel["targets"] as? [[String: Any]] ?? [] {
                    if let expr = target["expr"] as? String { result.append(Query(panel: title, expr: expr)) }
                }
                visit(panels: panel["panels"] as? [[String: Any]] ?? [])
            }
        }
        visit(panels: dashboard["panels"] as? [[String: Any]] ?? [])
        let variables = (dashboard["templating"] as? [String: Any])?["list"] as? [[String: Any]] ?? []
        for variable in variables where variable["type"] as? String == "query" {
            let definition = variable["definition"] as? String ?? ""
            // label_values(selector, label): the selector is the query.
            if definition.hasPrefix("label_values("), let comma = definition.lastIndex(of: ",") {
                let selector = definition[definition.index(definition.startIndex, offsetBy: 13)..<comma]
                result.append(Query(panel: "variable $\(variable["name"] as? String ?? "?")", expr: String(selector)))
            }
        }
        let annotations = (dashboard["annotations"] as? [String: Any])?["list"] as? [[String: Any]] ?? []
        for annotation in annotations {
            if let expr = annotation["expr"] as? String { result.append(Query(panel: "annotation \(annotation["name"] ?? "?")", expr: expr)) }
        }
        return result
    }

    /// `expr` with Grafana's variables replaced by what PromQL can parse.
    static func promQL(_ expr: String) -> String {
        expr.replacingOccurrences(of: "$__rate_interval", with: "5m")
            .replacingOccurrences(of: "$__interval", with: "1m")
            .replacingOccurrences(of: #"\$[A-Za-z_]+"#, with: ".*", options: .regularExpression)
    }

    static func replacing(_ pattern: String, in text: String, with template: String = " ") -> String {
        text.replacingOccurrences(of: pattern, with: template, options: .regularExpression)
    }

    /// The metric names an expression selects: what is left once strings, ranges, label
    /// matchers, grouping clauses, function names, keywords and numbers are taken out.
    static func metricNames(_ expr: String) -> Set<String> {
        var text = promQL(expr)
        text = replacing(#""([^"\\]|\\.)*""#, in: text)
        text = replacing(#"\[[^\]]*\]"#, in: text)
        text = replacing(#"\{[^}]*\}"#, in: text)
        text = replacing(#"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"#, in: text)
        text = replacing(#"\b[A-Za-z_][A-Za-z0-9_]*\s*\("#, in: text, with: "(")
        let keywords: Set<String> = ["by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                                     "unless", "offset", "Inf", "NaN", "inf", "nan"]
        let regex = try! NSRegularExpression(pattern: #"(?<![0-9.])\b[A-Za-z_:][A-Za-z0-9_:]*\b"#)
        let range = NSRange(text.startIndex..., in: text)
        return Set(regex.matches(in: text, range: range).compactMap { Range($0.range, in: text).map { String(text[$0]) } }
            .filter { !keywords.contains($0) })
    }

    /// `metric{label…}` and `by (label, …)` in `expr`: the label names it relies on, per metric.
    static func labelsUsed(_ expr: String) -> Set<String> {
        let text = promQL(expr)
        var labels: Set<String> = []
        let clauses = try! NSRegularExpression(pattern: #"\b(?:by|without)\s*\(([^)]*)\)"#)
        let matchers = try! NSRegularExpression(pattern: #"\{([^}]*)\}"#)
        let range = NSRange(text.startIndex..., in: text)
        for match in clauses.matches(in: text, range: range) {
            guard let inner = Range(match.range(at: 1), in: text) else { continue }
            labels.formUnion(text[inner].split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty })
        }
        for match in matchers.matches(in: text, range: range) {
            guard let inner = Range(match.range(at: 1), in: text) else { continue }
            let names = try! NSRegularExpression(pattern: #"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)"#)
            let innerText = String(text[inner])
            for name in names.matches(in: innerText, range: NSRange(innerText.startIndex..., in: innerText)) {
                if let r = Range(name.range(at: 1), in: innerText) { labels.insert(String(innerText[r])) }
            }
        }
        return labels.subtracting(["le", "job", "instance"])  // `le` is the histogram's; job and instance Prometheus adds
    }

    @Test("the dashboard is an importable Grafana dashboard: a datasource input, the route variable, unique panel ids")
    func importable() throws {
        let dashboard = try Self.dashboard()
        let inputs = try #require(dashboard["__inputs"] as? [[String: Any]])
        #expect(inputs.contains { $0["name"] as? String == "DS_PROMETHEUS" && $0["pluginId"] as? String == "prometheus" })
        let variables = ((dashboard["templating"] as? [String: Any])?["list"] as? [[String: Any]] ?? []).compactMap { $0["name"] as? String }
        #expect(variables.contains("route"))
        var ids: [Int] = []
        var titles: [String] = []
        func visit(_ panels: [[String: Any]]) {
            for panel in panels {
                ids.append(panel["id"] as? Int ?? -1)
                titles.append(panel["title"] as? String ?? "")
                if panel["type"] as? String != "row", panel["type"] as? String != "text" {
                    let datasource = panel["datasource"] as? [String: Any]
                    #expect(datasource?["uid"] as? String == "${DS_PROMETHEUS}", "\(panel["title"] ?? "?") has no ${DS_PROMETHEUS} datasource")
                    let unit = (panel["fieldConfig"] as? [String: Any]).flatMap { ($0["defaults"] as? [String: Any])?["unit"] as? String }
                    #expect(unit != nil, "\(panel["title"] ?? "?") has no unit")
                }
                visit(panel["panels"] as? [[String: Any]] ?? [])
            }
        }
        visit(dashboard["panels"] as? [[String: Any]] ?? [])
        #expect(Set(ids).count == ids.count, "panel ids repeat: \(ids)")
        #expect(!Self.queries(dashboard).isEmpty)
        for wanted in ["Request rate by route", "Errors by route", "p50 latency by route", "p99 latency by route",
                       "Upstream errors by kind", "Cache hit ratio", "Rate-limit refusals by route", "Token refreshes",
                       "Credential expiry", "In flight", "Open streams", "Endpoint health", "Pacing and quotas",
                       "Requests waiting at rate limits", "Rate-limit wait, p50 and p99", "429s by reason",
                       "Requests waiting for a provider's budget", "Provider budget remaining", "Provider 429s", "Quota used"] {
            #expect(titles.contains(wanted), "no panel \(wanted)")
        }
    }

    @Test("the query reader finds metric names, not functions, labels or variables")
    func readsQueries() {
        #expect(Self.metricNames(#"histogram_quantile(0.99, sum by (route, le) (rate(portico_request_duration_seconds_bucket{job=~"$job", code=~"5.."}[$__rate_interval])))"#)
            == ["portico_request_duration_seconds_bucket"])
        #expect(Self.metricNames(#"sum(rate(a_total[5m])) / (sum(rate(b_total[5m])) + 1e3) > bool 0"#) == ["a_total", "b_total"])
        #expect(Self.labelsUsed(#"sum by (cache, reason) (rate(x{job=~"$job", route=~"$route"}[5m]))"#) == ["cache", "reason", "route"])
    }

    // MARK: Against the running gateway

    /// Metric families at /metrics with the label names their samples carry; a histogram's
    /// `_bucket`, `_sum` and `_count` samples are listed under those names too.
    static func families(_ text: String) -> [String: Set<String>] {
        var result: [String: Set<String>] = [:]
        for line in text.split(separator: "\n") {
            if line.hasPrefix("# TYPE ") {
                let parts = line.split(separator: " ")
                if parts.count >= 3 { result[String(parts[2]), default: []].formUnion([]) }
                continue
            }
            guard !line.hasPrefix("#") else { continue }
            let name = String(line.prefix { $0 != "{" && $0 != " " })
            var labels: Set<String> = []
            if let open = line.firstIndex(of: "{"), let close = line.lastIndex(of: "}") {
                let inner = line[line.index(after: open)..<close]
                let names = try! NSRegularExpression(pattern: #"([A-Za-z_][A-Za-z0-9_]*)=""#)
                let innerText = String(inner)
                for match in names.matches(in: innerText, range: NSRange(innerText.startIndex..., in: innerText)) {
                    if let r = Range(match.range(at: 1), in: innerText) { labels.insert(String(innerText[r])) }
                }
            }
            result[name, default: []].formUnion(labels)
            for suffix in ["_bucket", "_sum", "_count"] where name.hasSuffix(suffix) {
                result[String(name.dropLast(suffix.count)), default: []].formUnion(labels.subtracting(["le"]))
            }
        }
        return result
    }

    static func get(_ port: Int, _ target: String, method: String = "GET") async throws -> RawHTTPResponse? {
        let connection = try RawHTTPConnection(port: port, timeout: .seconds(30))
        try await connection.send("\(method) \(target) HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
        return try await connection.readResponse()
    }

    @Test("every metric a panel queries is exported by the running gateway, with the labels the query uses")
    func metricsExist() async throws {
        let dashboard = try Self.dashboard()
        let queries = Self.queries(dashboard)

        let upstream = TestUpstream()
        upstream.route("/cached", TestUpstream.Response(status: 200, headers: [("Cache-Control", "max-age=300")], body: "cached\n"))
        // A provider publishing what is left, then refusing: the provider_limits families.
        upstream.route("/budget", TestUpstream.Response(status: 200, headers: [("RateLimit-Policy", "\"d\";q=10;w=60"),
                                                                                ("RateLimit", "\"d\";r=9;t=30")], body: "ok\n"))
        upstream.route("/throttled", TestUpstream.Response(status: 429, headers: [("Retry-After", "1")], body: "slow down\n"))
        let (pieces, feed) = AsyncStream.makeStream(of: [UInt8].self)
        upstream.route("/stream", .streamed(headers: [("Content-Type", "text/event-stream")], pieces))
        try await upstream.start()
        let idp = try TestTokenEndpoint()
        let refused = try RefusingPort()
        let oauth = idp.oauth2Config()
        let yaml = """
            listen: { address: 127.0.0.1, port: 0 }
            admin: { address: 127.0.0.1, port: 0 }
            logging: { level: info, format: logfmt }
            upstreams:
              app: { url: "http://127.0.0.1:\(upstream.port)", transport: nio }
              gone: { url: "http://127.0.0.1:\(refused.port)", transport: nio }
              vendor:
                url: "http://127.0.0.1:\(upstream.port)"
                transport: nio
                provider_limits: { scope: upstream, when_exhausted: reject }
              # Two endpoints, the second refusing: failures by kind, an ejection (endpoint health row).
              pair:
                endpoints: ["http://127.0.0.1:\(upstream.port)", "http://127.0.0.1:\(refused.port)"]
                transport: nio
                outlier_detection: { consecutive_failures: 1 }
                health_check: { path: /cached, interval: 1s, timeout: 1s }
                circuit_breaker: { max_requests: 100 }
            # A store that refuses connections: the quota counts on locally (and records its gauge).
            stores:
              away: { type: redis, url: "redis://127.0.0.1:\(refused.port)/0", timeout: 1s, connect_timeout: 1s }
            credentials:
              idp: { type: oauth2_client_credentials, token_url: "\(idp.url.absoluteString)", client_id: "\(oauth.clientID)", client_secret: "\(oauth.clientSecret)" }
            middleware:
              cache: { type: cache }
              limit: { type: rate_limit, key: route, rate: 1/m, burst: 1 }
              pace: { type: rate_limit, key: route, rate: 20/s, burst: 1, on_limit: wait, max_wait: 5s }
              daily: { type: quota, limit: 100, per: day, store: away }
              auth: { type: auth, credential: idp }
              retry: { type: retry, attempts: 2, backoff: { base: 1ms, cap: 2ms } }
            routes:
              - { name: cached, match: { path: /cached }, upstream: app, middleware: [cache] }
              - { name: limited, match: { path: /limited }, direct: { body: ok }, middleware: [limit] }
              - { name: secure, match: { path: /secure }, upstream: app, middleware: [auth] }
              - { name: gone, match: { path: /gone }, upstream: gone, middleware: [retry] }
              - { name: stream, match: { path: /stream }, upstream: app, max_in_flight: 1 }
              - { name: pair, match: { path: /cached-pair }, upstream: pair }
              - { name: paced, match: { path: /paced }, direct: { body: ok }, middleware: [pace] }
              - { name: budget, match: { path: /budget }, upstream: vendor }
              - { name: throttled, match: { path: /throttled }, upstream: vendor }
              - { name: counted, match: { path: /counted }, direct: { body: ok }, middleware: [daily] }
            """
        let gateway = try await ProxyProcess.portico(yaml: yaml, name: "grafana")
        defer {
            gateway.stop()
            feed.finish()
        }
        let adminPort = try #require(gateway.adminPort)

        #expect(try await Self.get(gateway.port, "/cached")?.status == 200)
        #expect(try await Self.get(gateway.port, "/cached")?.status == 200)
        #expect(try await Self.get(gateway.port, "/limited")?.status == 200)
        #expect(try await Self.get(gateway.port, "/limited")?.status == 429)
        #expect(try await Self.get(gateway.port, "/secure")?.status == 200)
        // The second waits for its token (a twentieth of a second): the wait histogram.
        for _ in 0..<2 { #expect(try await Self.get(gateway.port, "/paced")?.status == 200) }
        #expect(try await Self.get(gateway.port, "/budget")?.status == 200)
        #expect(try await Self.get(gateway.port, "/throttled")?.status == 429)
        #expect(try await Self.get(gateway.port, "/counted")?.status == 200)
        #expect(try await Self.get(gateway.port, "/gone")?.status == 502)
        // Round robin: one of the two reaches the refusing endpoint (a 502), which is then ejected.
        for _ in 0..<2 { _ = try await Self.get(gateway.port, "/cached-pair") }
        #expect(try await Self.get(adminPort, "/-/reload", method: "POST")?.status == 200)
        // A stream held open: it is counted as open, and the route's cap refuses a second one.
        let stream = try RawHTTPConnection(port: gateway.port, timeout: .seconds(30))
        try await stream.send("GET /stream HTTP/1.1\r\nHost: test\r\n\r\n")
        feed.yield(Array("data: one\n\n".utf8))
        #expect(try await stream.receive("data: one"))
        #expect(try await Self.get(gateway.port, "/stream")?.status == 503)

        var exported: [String: Set<String>] = [:]
        var text = ""
        let needed = queries.reduce(into: Set<String>()) { $0.formUnion(Self.metricNames($1.expr)) }
        // Recorded as each answer completes: poll until every family is there (or the deadline).
        let deadline = ContinuousClock.now.advanced(by: .seconds(30))
        repeat {
            if let response = try await Self.get(adminPort, "/metrics"), response.status == 200 {
                text = response.bodyText
                exported = Self.families(text)
            }
            if needed.isSubset(of: Set(exported.keys)) { break }
            try await Task.sleep(for: .milliseconds(50))
        } while ContinuousClock.now < deadline
        #expect(try await gateway.metric("portico_open_streams") == 1)
        feed.finish()

        var problems: [String] = []
        for query in queries {
            let names = Self.metricNames(query.expr)
            if names.isEmpty { problems.append("\(query.panel): no metric in \(query.expr)") }
            for name in names.sorted() where exported[name] == nil {
                problems.append("\(query.panel): \(name) is not exported at /metrics")
            }
            // Labels the query groups or filters by must be on one of its metrics.
            let known = names.reduce(into: Set<String>()) { $0.formUnion(exported[$1] ?? []) }
            for label in Self.labelsUsed(query.expr).subtracting(known).sorted() {
                problems.append("\(query.panel): label \(label) is on none of \(names.sorted())")
            }
        }
        #expect(problems.isEmpty, "\n\(problems.joined(separator: "\n"))\n--- /metrics:\n\(text.prefix(6000))")
        await idp.stop()
        await upstream.shutdown()
        withExtendedLifetime(refused) {}
    }

    // MARK: PromQL syntax

    /// promtool from $PROMTOOL, PATH, or where deploy/validate unpacks Debian's prometheus package.
    static let promtool: String? = {
        var candidates: [String?] = [ProcessInfo.processInfo.environment["PROMTOOL"], ChildProcess.locate("promtool")]
        let cache = ProcessInfo.processInfo.environment["XDG_CACHE_HOME"] ?? (NSHomeDirectory() + "/.cache")
        candidates.append(cache + "/portico-validate/usr/bin/promtool")
        return candidates.compactMap { $0 }.first { !$0.isEmpty && FileManager.default.isExecutableFile(atPath: $0) }
    }()

    @Test("every query parses as PromQL (promtool check rules)",
          .enabled(if: promtool != nil, "promtool not found: deploy/validate fetches it (apt-get download prometheus)"))
    func promQLParses() async throws {
        let promtool = try #require(Self.promtool)
        let queries = Self.queries(try Self.dashboard())
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-grafana-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var rules = "groups:\n  - name: grafana-dashboard\n    rules:\n"
        for (index, query) in queries.enumerated() {
            let json = String(decoding: try JSONSerialization.data(withJSONObject: [Self.promQL(query.expr)], options: [.withoutEscapingSlashes]), as: UTF8.self)
            rules += "      - record: portico:dashboard_query_\(index)\n        expr: \(json.dropFirst().dropLast())\n"
        }
        let file = directory.appendingPathComponent("rules.yml")
        try rules.write(to: file, atomically: true, encoding: .utf8)
        let output = directory.appendingPathComponent("out").path
        let process = try ChildProcess(executable: promtool, arguments: ["check", "rules", file.path],
                                       standardOutput: .file(output), standardError: .file(output))
        let status = await process.waitForExit(timeout: .seconds(60))
        if status == nil { await process.terminate() }
        let log = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        #expect(status == 0, "\(log)\n\(rules)")
        #expect(log.contains("SUCCESS: \(queries.count) rules found"), "\(log)")
    }
}
