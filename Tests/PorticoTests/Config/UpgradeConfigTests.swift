import Portico
import Testing

/// `websocket: true` / `upgrade: [...]` on a route, `websocket_idle_timeout` and
/// `listen.max_websockets` (issue #35), and what `check` refuses with them.
@Suite("ConfigLoader: WebSocket routes")
struct UpgradeConfigTests {
    @Test("websocket: true is upgrade: [websocket]; the idle timeout defaults to 1h; max_websockets parses")
    func opting() throws {
        let config = try load("""
            listen: { max_websockets: 500 }
            upstreams:
              ws: { url: "http://127.0.0.1:9000", transport: nio }
            routes:
              - { name: a, match: { path_prefix: /a/ }, upstream: ws, websocket: true, middleware: [] }
              - { name: b, match: { path_prefix: /b/ }, upstream: ws, upgrade: [WebSocket], websocket_idle_timeout: 30s, middleware: [] }
              - { name: c, match: { path_prefix: /c/ }, upstream: ws }
            """)
        #expect(config.routes[0].upgrade == ["websocket"])
        #expect(config.routes[0].websocketIdleTimeout == .seconds(3600))
        #expect(config.routes[1].upgrade == ["websocket"])
        #expect(config.routes[1].websocketIdleTimeout == .seconds(30))
        #expect(config.routes[2].upgrade.isEmpty)
        #expect(config.listen.maxWebsockets == 500)
    }

    @Test("check refuses websocket: true on a urlsession upstream, naming transport: nio")
    func urlsessionRefused() {
        #expect(diagnostics("""
            upstreams:
              ws: { url: "http://127.0.0.1:9000" }
            routes:
              - { name: a, match: { path_prefix: /a/ }, upstream: ws, websocket: true, middleware: [] }
            """) == [#"portico.yaml:4 routes[0].websocket: upstream "ws" uses transport: urlsession, which cannot relay an upgraded connection on Linux (FoundationNetworking's URLSessionWebSocketTask re-frames messages and hides ping/pong); set transport: nio on that upstream"#])
    }

    @Test("check refuses cache, compress and retry on an upgrade route, also when they come from defaults.middleware")
    func middlewareRefused() {
        let found = diagnostics("""
            upstreams:
              ws: { url: "http://127.0.0.1:9000", transport: nio }
            middleware:
              log: { type: access_log }
              cache: { type: cache }
              retry: { type: retry }
            defaults: { middleware: [log, cache, retry] }
            routes:
              - { name: a, match: { path_prefix: /a/ }, upstream: ws, websocket: true }
            """)
        #expect(found.count == 1)
        #expect(found.first?.contains(#"routes[0].websocket: cache, compress and retry do not apply to an upgrade"#) == true)
        #expect(found.first?.contains(#""cache" (cache), "retry" (retry) from defaults.middleware"#) == true, "\(found)")
    }

    @Test("a direct route cannot upgrade; an upgrade token must be a token")
    func directAndTokens() {
        #expect(diagnostics("""
            routes:
              - { name: a, match: { path: /a }, direct: { status: 200 }, websocket: true }
            """) == ["portico.yaml:2 routes[0].websocket: an upgrade needs an upstream: a direct route cannot switch protocols"])
        let bad = diagnostics("""
            upstreams:
              ws: { url: "http://127.0.0.1:9000", transport: nio }
            routes:
              - { name: a, match: { path_prefix: /a/ }, upstream: ws, upgrade: ["web socket"], middleware: [] }
            """)
        #expect(bad.first?.contains("invalid upgrade protocol") == true, "\(bad)")
    }
}
