import Foundation
import MicroHTTPD
import Synchronization

/// What the admin listener answers, by method and path. Everything is read from the gateway's
/// current runtime, so after a reload the new configuration answers.
struct AdminEndpoints: Sendable {
    let gateway: GatewayServer
    let access: AdminAccess
    let metricsText: @Sendable () -> [UInt8]
    let sampler: StatsSampler

    static let paths: [String: String] = [
        "/": "GET, HEAD", "/metrics": "GET, HEAD", "/healthz": "GET, HEAD", "/readyz": "GET, HEAD",
        "/credentials": "GET", "/routes": "GET", "/upstreams": "GET", "/limits": "GET", "/explain": "GET", "/stats": "GET", "/-/reload": "POST",
        "/cache/purge": "POST",
    ]

    func answer(_ request: ServerRequest) async -> ServerResponse {
        let (path, query) = Self.split(request.target)
        switch access.decide(path: path, authorization: request.header("Authorization")) {
        case .allowed:
            break
        case .missingToken, .wrongToken:
            var response = Self.json(401, ["error": "unauthorized",
                                           "message": "this admin endpoint needs Authorization: Bearer <admin.token>"])
            response.headers.append(("WWW-Authenticate", "Bearer realm=\"portico-admin\""))
            return response
        }
        switch (request.method, path) {
        case ("GET", "/"), ("HEAD", "/"):
            return ServerResponse(status: 200, headers: [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store"),
                                                         ("Content-Security-Policy", Self.dashboardPolicy)],
                                  body: PackageResources.dashboard_html)
        case ("GET", "/metrics"), ("HEAD", "/metrics"):
            // Token expiries are recorded as they are now, so the gauge counts down between refreshes.
            await CredentialReport.collect(from: gateway.gateway.current).recordExpiryGauges()
            // HTTP/2 streams are counted per loop (no shared write per request): summed here, when read.
            await UpstreamReport.recordHTTP2Gauges(gateway.gateway.current)
            return ServerResponse(status: 200, headers: [("Content-Type", "text/plain; version=0.0.4; charset=utf-8"),
                                                         ("Cache-Control", "no-store")], body: metricsText())
        case ("GET", "/healthz"), ("HEAD", "/healthz"):
            return Self.text(200, "ok\n")
        case ("GET", "/readyz"), ("HEAD", "/readyz"):
            return gateway.isDraining ? Self.text(503, "draining\n") : Self.text(200, "ready\n")
        case ("GET", "/credentials"):
            return Self.json(200, await CredentialReport.collect(from: gateway.gateway.current))
        case ("GET", "/routes"):
            return Self.json(200, RouteTable(gateway.gateway.current))
        case ("GET", "/upstreams"):
            return Self.json(200, UpstreamReport(gateway.gateway.current))
        case ("GET", "/limits"):
            return Self.json(200, LimitsReport(gateway.gateway.current, now: gateway.gateway.clock.wallNow))
        case ("GET", "/explain"):
            return explain(query)
        case ("GET", "/stats"):
            let names = gateway.gateway.current.config.routes.map(\.name)
            return Self.json(200, sampler.report(routeNames: names, lastReload: gateway.lastReload))
        case ("POST", "/cache/purge"):
            return await CachePurgeEndpoint(runtime: gateway.gateway.current).answer(request.body)
        case ("POST", "/-/reload"):
            do {
                try gateway.reloadFromFile()
                return Self.text(200, "reloaded\n")
            } catch {
                return Self.text(400, "configuration rejected; the previous one keeps serving:\n\(error.description)\n")
            }
        default:
            guard let allow = Self.paths[path] else {
                return Self.text(404, "not found: try /, /metrics, /healthz, /readyz, /credentials, /routes, /upstreams, /limits, /explain, /stats, POST /-/reload or POST /cache/purge\n")
            }
            var response = Self.text(405, "method not allowed\n")
            response.headers.append(("Allow", allow))
            return response
        }
    }

    /// `GET /explain?method=GET&url=http://host/path&header=Name:value…` (`method` defaults to GET).
    private func explain(_ query: [URLQueryItem]) -> ServerResponse {
        let method = query.first { $0.name == "method" }?.value ?? "GET"
        guard let url = query.first(where: { $0.name == "url" })?.value else {
            return Self.json(400, ["error": "bad_request", "message": "give the request as ?url=…[&method=…][&header=Name:value…]"])
        }
        let headers = query.filter { $0.name == "header" }.compactMap(\.value)
        let client = query.first { $0.name == "client" }?.value ?? "127.0.0.1"
        do {
            return Self.json(200, try Explanation(method: method, url: url, headers: headers, client: client,
                                                  runtime: gateway.gateway.current))
        } catch {
            return Self.json(400, ["error": "bad_request", "message": error.description])
        }
    }

    /// The dashboard loads nothing from elsewhere, and this says so to the browser too.
    static let dashboardPolicy = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:"

    static func split(_ target: String) -> (path: String, query: [URLQueryItem]) {
        let parts = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        let path = parts.first.map(String.init) ?? "/"
        guard parts.count == 2 else { return (path.isEmpty ? "/" : path, []) }
        var components = URLComponents()
        components.percentEncodedQuery = String(parts[1])
        return (path.isEmpty ? "/" : path, components.queryItems ?? [])
    }

    static func text(_ status: Int, _ body: String) -> ServerResponse {
        ServerResponse(status: status, headers: [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")],
                       body: Array(body.utf8))
    }

    static func json(_ status: Int, _ value: some Encodable) -> ServerResponse {
        ServerResponse(status: status, headers: [("Content-Type", "application/json"), ("Cache-Control", "no-store")],
                       body: AdminJSON.encode(value))
    }
}

/// Samples the metrics every `interval` into a `StatsHistory` while the admin listener runs,
/// so the dashboard shows the last minutes as soon as it opens.
final class StatsSampler: Sendable {
    let history: StatsHistory
    let interval: Duration
    private let metricsText: @Sendable () -> [UInt8]
    private let task = Mutex<Task<Void, Never>?>(nil)

    init(metricsText: @escaping @Sendable () -> [UInt8], interval: Duration = .seconds(5), capacity: Int = 60) {
        self.metricsText = metricsText
        self.interval = interval
        history = StatsHistory(capacity: capacity)
    }

    func snapshot() -> StatsSnapshot {
        StatsSnapshot(time: ContinuousClock.now.secondsSinceStart, samples: PrometheusText.parse(metricsText()))
    }

    func report(routeNames: [String], lastReload: ReloadRecord?) -> StatsReport {
        StatsReport(history: history.all, now: snapshot(), routeNames: routeNames, lastReload: lastReload)
    }

    func start() {
        let started = Task { [self] in
            while !Task.isCancelled {
                history.record(snapshot())
                try? await Task.sleep(for: interval)
            }
        }
        task.withLock { $0 = started }
    }

    func stop() {
        task.withLock { $0?.cancel() }
    }
}

extension ContinuousClock.Instant {
    /// Seconds since an arbitrary fixed origin: differences are what count.
    var secondsSinceStart: Double {
        Self.origin.duration(to: self).secondsValue
    }

    private static let origin = ContinuousClock.now
}
