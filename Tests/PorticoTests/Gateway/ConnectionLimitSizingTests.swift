import Portico
import Testing

@Suite("listen.connection_limit: sizing the default to the descriptor limit")
struct ConnectionLimitSizingTests {
    @Test("unset: as many as the hard descriptor limit allows, up to 10000, and never one that would warn",
          arguments: [(UInt64(20_000), 9_488), (1_048_576, 10_000), (21_024, 10_000), (21_023, 9_999), (4_096, 1_536),
                      (2_048, 512), (1_200, 88)])
    func sizedDefault(descriptorLimit: UInt64, expected: Int) {
        let limit = ConnectionLimitSizing.connectionLimit(configured: nil, descriptorLimit: descriptorLimit)
        #expect(limit == expected)
        #expect(UInt64(ConnectionLimitSizing.descriptorsNeeded(connectionLimit: limit)) <= descriptorLimit)
    }

    @Test("unset with no known limit (unlimited): 10000; a tiny limit: the minimum of 64")
    func edges() {
        #expect(ConnectionLimitSizing.connectionLimit(configured: nil, descriptorLimit: nil) == 10_000)
        #expect(ConnectionLimitSizing.connectionLimit(configured: nil, descriptorLimit: 1_024) == 64)
        #expect(ConnectionLimitSizing.connectionLimit(configured: nil, descriptorLimit: 0) == 64)
        #expect(ConnectionLimitSizing.connectionLimit(configured: nil, descriptorLimit: .max) == 10_000)
    }

    @Test("an explicit setting is taken as written, even when it does not fit (the listener warns)")
    func explicit() {
        #expect(ConnectionLimitSizing.connectionLimit(configured: 10_000, descriptorLimit: 20_000) == 10_000)
        #expect(ConnectionLimitSizing.connectionLimit(configured: 50, descriptorLimit: 20_000) == 50)
        #expect(ConnectionLimitSizing.descriptorsNeeded(connectionLimit: 10_000) == 21_024)
    }

    @Test("the configuration keeps an absent connection_limit unset, and an explicit one as written")
    func parsing() throws {
        let route = "routes: [{ name: p, match: { path: /p }, direct: { status: 200 } }]\n"
        #expect(try ConfigLoader.load(yaml: route, environment: [:]).listen.connectionLimit == nil)
        #expect(try ConfigLoader.load(yaml: "listen: { connection_limit: 10000 }\n" + route, environment: [:])
            .listen.connectionLimit == 10_000)
    }

    @Test("max_websockets unset: sized so sessions alone fit the hard descriptor limit (4 descriptors a session, 7 over TLS)",
          arguments: [(UInt64(20_000), false, 4_744), (20_000, true, 2_710), (1_048_576, false, 261_888), (1_200, false, 64),
                      (1_024, true, 64)])
    func websocketDefault(descriptorLimit: UInt64, tls: Bool, expected: Int) {
        let limit = ConnectionLimitSizing.websocketLimit(descriptorLimit: descriptorLimit, tls: tls)
        #expect(limit == expected)
        if limit > 64 {
            #expect(UInt64(limit * ConnectionLimitSizing.descriptorsPerSession(tls: tls) + ConnectionLimitSizing.reserve) <= descriptorLimit)
        }
        // Unknown or unlimited: no cap of its own (connection_limit still holds).
        #expect(ConnectionLimitSizing.websocketLimit(descriptorLimit: nil, tls: tls) == 0)
    }
}
