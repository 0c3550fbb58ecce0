import Foundation
import MicroHTTPD
import Synchronization

/// The upstream `portico demo` forwards to: a tiny orders API on 127.0.0.1.
/// - `GET /orders` lists orders, `GET /orders/{id}` returns one, `POST /orders` creates one.
/// - `GET /echo…` answers with what it received (method, target, headers), to show what the gateway sends.
/// - `GET /secure…` demands a bearer token the demo identity provider issued (`authorizes`).
/// - `GET /flaky` fails with 503 two times out of three; so does `GET /secure/flaky`, behind the token check.
/// - `GET /events?count=N` streams N Server-Sent Events, one a second.
/// - `POST /demo/down` and `POST /demo/up` stop and restart its answers: stopped, it answers
///   503 to everything else (the demo's failover: `/spare/demo/down` through the gateway).
/// - `POST /demo/idp/down` and `POST /demo/idp/up` on the upstream's own port (never through the
///   gateway's routes) stop and restart the demo identity provider, to watch a failing credential
///   on the dashboard.
public final class DemoUpstream: Sendable {
    private let server: HTTPServer

    /// `authorizes` decides whether an `Authorization` value is a current token (the demo IdP's check);
    /// `switchIdP(up)` stops or restarts the identity provider.
    /// `name`: sent back in `X-Demo-Upstream`, so an answer says which demo upstream served it.
    public init(name: String = "primary", authorizes: @escaping @Sendable (String?) -> Bool = { _ in true },
                switchIdP: @escaping @Sendable (Bool) async -> Void = { _ in }) {
        let counter = Atomic<Int>(0)
        let stopped = Atomic<Bool>(false)
        let flaky = Atomic<Int>(0)
        let secureFlaky = Atomic<Int>(0)
        let respond: @Sendable (ServerRequest) -> ServerResponse = { request in
            let served = counter.add(1, ordering: .relaxed).newValue
            let path = request.target.split(separator: "?", maxSplits: 1).first.map(String.init) ?? "/"
            if stopped.load(ordering: .relaxed) {
                return ServerResponse(status: 503, headers: [("Content-Type", "application/json"), ("X-Demo-Upstream", name)],
                                      body: Array("{\"error\":\"stopped by POST /demo/down\"}\n".utf8))
            }
            if path.hasPrefix("/secure"), !authorizes(request.header("authorization")) {
                return ServerResponse(status: 401, headers: [("WWW-Authenticate", "Bearer realm=\"demo\""),
                                                             ("Content-Type", "application/json")],
                                      body: Array("{\"error\":\"invalid_token\"}\n".utf8))
            }
            let flakyCount: Int? = switch path {
            case "/flaky": flaky.add(1, ordering: .relaxed).newValue
            case "/secure/flaky": secureFlaky.add(1, ordering: .relaxed).newValue
            default: nil
            }
            if let flakyCount, flakyCount % 3 != 0 {
                return ServerResponse(status: 503, headers: [("Content-Type", "application/json")],
                                      body: Array("{\"error\":\"try again\"}\n".utf8))
            }
            var response = DemoUpstream.answer(request, served: served)
            response.headers.append(("X-Demo-Upstream", name))
            return response
        }
        server = HTTPServer(configuration: ServerConfiguration()) { (request: ServerRequest) -> HTTPServer.Answer in
            let path = request.target.split(separator: "?", maxSplits: 1).first.map(String.init) ?? "/"
            if request.method == "POST", path == "/demo/down" || path == "/demo/up" {
                let down = path == "/demo/down"
                stopped.store(down, ordering: .relaxed)
                let text = down ? "\(name) stopped: it answers 503 until POST /demo/up\n" : "\(name) started again\n"
                return .now(ServerResponse(status: 200, headers: [("Content-Type", "text/plain")], body: Array(text.utf8)))
            }
            if request.method == "POST", path == "/demo/idp/down" || path == "/demo/idp/up" {
                return .later {
                    await switchIdP(path.hasSuffix("/up"))
                    return ServerResponse(status: 200, headers: [("Content-Type", "text/plain")],
                                          body: Array("identity provider \(path.hasSuffix("/up") ? "up" : "down")\n".utf8))
                }
            }
            if path == "/ws/echo", let handshake = DemoWebSocketEcho.answer(request) { return .now(handshake) }
            guard path == "/events" else { return .now(respond(request)) }
            let count = request.target.split(separator: "count=").dropFirst().first.flatMap { Int($0.prefix { $0.isNumber }) } ?? 10
            return .now(ServerResponse(status: 200, headers: [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")],
                                       payload: .stream(DemoEvents(count: count), length: nil)))
        }
    }

    /// Starts on 127.0.0.1 with a free port; returns it.
    public func start() throws -> Int {
        Int(try server.start())
    }

    public func stop() async {
        await server.stop(grace: .seconds(1))
    }

    static func answer(_ request: ServerRequest, served: Int) -> ServerResponse {
        let path = request.target.split(separator: "?", maxSplits: 1).first.map(String.init) ?? "/"
        func json(_ status: Int, _ object: Any) -> ServerResponse {
            let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
            return ServerResponse(status: status, headers: [("Content-Type", "application/json"),
                                                             ("X-Upstream-Served", String(served))],
                                  body: Array(data) + [0x0A])
        }
        switch (request.method, path) {
        case ("GET", "/orders"), ("HEAD", "/orders"):
            return json(200, ["orders": (1...3).map { ["id": $0, "item": "widget-\($0)", "quantity": $0 * 2] }])
        case ("POST", "/orders"):
            return json(201, ["id": 4, "received_bytes": request.body.count])
        case ("GET", _) where path.hasPrefix("/orders/"):
            let id = path.dropFirst("/orders/".count)
            guard let number = Int(id), (1...3).contains(number) else {
                return json(404, ["error": "no such order", "id": String(id)])
            }
            return json(200, ["id": number, "item": "widget-\(number)", "quantity": number * 2])
        case ("GET", "/catalog"), ("HEAD", "/catalog"):
            // Cacheable for 10 s, and big enough to be worth compressing.
            var response = json(200, ["catalog": (1...60).map { ["sku": "SKU-\($0)", "name": "widget model \($0)",
                                                                "description": "a sturdy widget, size \($0 % 5), colour \($0 % 7)"] }])
            response.headers.append(("Cache-Control", "max-age=10"))
            return response
        case ("GET", "/flaky"):
            return json(200, ["ok": true, "note": "this endpoint fails two times out of three; the retry middleware hid that"])
        case ("GET", _) where path.hasPrefix("/secure"):
            return json(200, ["secret_report": "only for callers with a current token", "served": served])
        case (_, _) where path.hasPrefix("/echo"):
            return json(200, [
                "method": request.method,
                "target": request.target,
                "headers": request.headers.map { ["name": $0.name, "value": $0.value] },
                "body_bytes": request.body.count,
            ])
        default:
            return json(404, ["error": "not found"])
        }
    }
}
