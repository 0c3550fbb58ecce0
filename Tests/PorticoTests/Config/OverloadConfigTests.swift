import Portico
import Testing

@Suite("Config: in-flight caps")
struct OverloadConfigTests {
    @Test("listen.max_in_flight and a route's max_in_flight are read; the listener's default caps at 4096")
    func read() throws {
        #expect(try load(minimalRoute).listen.maxInFlight == 4096)
        let config = try load("""
            listen: { max_in_flight: 0 }
            routes:
              - name: slow
                match: { path_prefix: /slow }
                direct: { body: ok }
                max_in_flight: 25
            """)
        #expect(config.listen.maxInFlight == 0)
        #expect(config.routes[0].maxInFlight == 25)
    }

    @Test("a route cap must be at least 1, and the listener's not negative")
    func invalid() {
        let errors = diagnostics("""
            listen: { max_in_flight: -1 }
            routes:
              - name: slow
                match: { path_prefix: /slow }
                direct: { body: ok }
                max_in_flight: 0
            """)
        #expect(errors.count == 2)
        #expect(errors.contains { $0.contains("listen.max_in_flight") })
        #expect(errors.contains { $0.contains("routes[0].max_in_flight") })
    }
}
