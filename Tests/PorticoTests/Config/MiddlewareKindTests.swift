import HTTPTypes
import Logging
import MicroHTTPD
@testable import Portico
import PorticoTesting
import Synchronization
import Testing

/// A made-up middleware type, whole: all that adding a type takes is this (in its own folder)
/// and one line in a registry. It stamps responses with a value and a running count; the
/// count is its state, which a reload with unchanged settings carries over.
struct StampKind: MiddlewareKind {
    struct Settings: Sendable, Equatable {
        var value: String
        var start = 1
    }

    final class Counter: Sendable {
        let next: Synchronization.Mutex<Int>
        init(start: Int) { next = Synchronization.Mutex(start) }
    }

    struct Stamp: Middleware {
        let value: String
        let counter: Counter

        func handle(_ request: GatewayRequest, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
            var response = try await next(request, context)
            let count = counter.next.withLock { next in
                defer { next += 1 }
                return next
            }
            response.headerFields[HTTPField.Name("X-Stamp")!] = "\(value) #\(count)"
            return response
        }
    }

    let typeName = "stamp"

    func parse(_ section: ConfigMapping, names: ConfigNames) -> Settings? {
        let value = section.required("value")?.nonEmptyString()
        var settings = Settings(value: value ?? "")
        section.read("start", into: &settings.start) { $0.int(in: 1...1000) }
        return value == nil ? nil : settings
    }

    func make(name: String, settings: Settings, previous: Stamp?, context: MiddlewareBuildContext) -> Stamp {
        Stamp(value: settings.value, counter: previous?.counter ?? Counter(start: settings.start))
    }
}

@Suite("Middleware kinds")
struct MiddlewareKindTests {
    /// The one line: the shipped types and the made-up one.
    static let registry = MiddlewareRegistry.standard.adding(StampKind())
    static let logger = Logger(label: "portico.tests.kinds", factory: { _ in SwiftLogNoOpLogHandler() })

    static func yaml(_ stamp: String) -> String {
        """
        middleware:
          log: { type: access_log }
          s: \(stamp)
        routes:
          - name: ping
            match: { path: /ping }
            direct: { body: pong }
            middleware: [log, s]
        """
    }

    static func load(_ yaml: String, registry: MiddlewareRegistry = registry) throws(ConfigError) -> PorticoConfig {
        try ConfigLoader.load(yaml: yaml, source: "portico.yaml", environment: [:], baseDirectory: nil, registry: registry)
    }

    static func diagnostics(_ yaml: String, registry: MiddlewareRegistry = registry) -> [String] {
        do throws(ConfigError) {
            _ = try Self.load(yaml, registry: registry)
            return []
        } catch {
            return error.diagnostics.map(\.description)
        }
    }

    static func ping(_ gateway: Gateway) async -> String? {
        let response = await gateway.handle(ServerRequest(method: "GET", target: "/ping", headers: [("Host", "gw.test")],
                                                          clientAddress: "127.0.0.1"))
        #expect(response.status == 200)
        return response.headers.first { $0.name.lowercased() == "x-stamp" }?.value
    }

    @Test("a registered kind is parsed from YAML into a plain configuration value")
    func parses() throws {
        let config = try Self.load(Self.yaml("{ type: stamp, value: hello, start: 5 }"))
        let stamp = try #require(config.middleware["s"])
        #expect(stamp.typeName == "stamp")
        #expect(stamp.settings(as: StampKind.Settings.self) == StampKind.Settings(value: "hello", start: 5))
        #expect(stamp.settings(as: CacheConfig.self) == nil)
        #expect(stamp == MiddlewareConfig(StampKind(), StampKind.Settings(value: "hello", start: 5)))
        #expect(stamp != MiddlewareConfig(StampKind(), StampKind.Settings(value: "hello")))
        #expect(config.middleware["log"] == .accessLog(AccessLogConfig()))
        #expect(stamp != .accessLog(AccessLogConfig()))
    }

    @Test("its errors carry file, line and key path like the shipped kinds'")
    func errorsCarryKeyPaths() {
        #expect(Self.diagnostics(Self.yaml("{ type: stamp }")) == [
            #"portico.yaml:3 middleware.s: missing required key "value""#,
        ])
        #expect(Self.diagnostics(Self.yaml("{ type: stamp, value: v, strat: 2 }")) == [
            #"portico.yaml:3 middleware.s.strat: unknown key "strat" (did you mean "start"?)"#,
        ])
        #expect(Self.diagnostics(Self.yaml("{ type: stamp, value: v, start: 0 }")).first?
            .hasPrefix("portico.yaml:3 middleware.s.start: ") == true)
        #expect(Self.diagnostics(Self.yaml("{ type: stmp }")) == [
            #"portico.yaml:3 middleware.s.type: unknown middleware type "stmp" (did you mean "stamp"?); supported: access_log, auth, cache, compress, headers, quota, rate_limit, retry, stamp"#,
        ])
        // Without the registry line the type does not exist.
        #expect(Self.diagnostics(Self.yaml("{ type: stamp, value: v }"), registry: .standard) == [
            #"portico.yaml:3 middleware.s.type: unknown middleware type "stamp"; supported: access_log, auth, cache, compress, headers, quota, rate_limit, retry"#,
        ])
    }

    @Test("it is built and runs in its routes' chains; a reload keeps its state only while its settings are unchanged")
    func buildsRunsAndCarriesOver() async throws {
        let config = try Self.load(Self.yaml("{ type: stamp, value: hello }"))
        let first = try GatewayRuntime(config: config, logger: Self.logger)
        let gateway = Gateway(runtime: first, logger: Self.logger)
        #expect(first.middleware["s"] is StampKind.Stamp)
        #expect(await Self.ping(gateway) == "hello #1")
        #expect(await Self.ping(gateway) == "hello #2")

        let same = try GatewayRuntime(config: try Self.load(Self.yaml("{ type: stamp, value: hello }")),
                                      logger: Self.logger, previous: gateway.current)
        gateway.install(same)
        #expect(await Self.ping(gateway) == "hello #3")

        let changed = try GatewayRuntime(config: try Self.load(Self.yaml("{ type: stamp, value: bye }")),
                                         logger: Self.logger, previous: gateway.current)
        gateway.install(changed)
        #expect(await Self.ping(gateway) == "bye #1")
        for runtime in [first, same, changed] {
            await runtime.shutdown()
        }
    }
}
