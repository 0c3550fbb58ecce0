import Testing
@testable import Portico

@Suite("Admin access: token and exposure")
struct AdminAccessTests {
    @Test("the token compare is right for equal, different, shorter, longer and empty values")
    func constantTimeCompare() {
        let token = Array("s3cret-token".utf8)
        #expect(AdminAccess.constantTimeEquals(token, token))
        #expect(!AdminAccess.constantTimeEquals(Array("s3cret-tokeN".utf8), token))
        #expect(!AdminAccess.constantTimeEquals(Array("s3cret".utf8), token))
        #expect(!AdminAccess.constantTimeEquals(Array("s3cret-token-and-more".utf8), token))
        // A presented value that repeats the token (the modulo walk) is still a different length.
        #expect(!AdminAccess.constantTimeEquals(token + token, token))
        #expect(!AdminAccess.constantTimeEquals([], token))
        #expect(!AdminAccess.constantTimeEquals([], []))
    }

    @Test("without a token everything is open; with one, all but the probes and the page need it")
    func decisions() {
        let open = AdminAccess(AdminConfig())
        for path in ["/metrics", "/credentials", "/-/reload", "/explain"] {
            #expect(open.decide(path: path, authorization: nil) == .allowed)
        }
        var config = AdminConfig()
        config.token = "abc123"
        let guarded = AdminAccess(config)
        for path in ["/healthz", "/readyz", "/"] {
            #expect(guarded.decide(path: path, authorization: nil) == .allowed, "\(path)")
        }
        for path in ["/metrics", "/credentials", "/routes", "/explain", "/stats", "/-/reload", "/nowhere"] {
            #expect(guarded.decide(path: path, authorization: nil) == .missingToken, "\(path)")
            #expect(guarded.decide(path: path, authorization: "Basic abc123") == .missingToken, "\(path)")
            #expect(guarded.decide(path: path, authorization: "Bearer abc124") == .wrongToken, "\(path)")
            #expect(guarded.decide(path: path, authorization: "Bearer abc123") == .allowed, "\(path)")
            #expect(guarded.decide(path: path, authorization: "bearer abc123") == .allowed, "\(path)")
        }
        config.publicMetrics = true
        #expect(AdminAccess(config).decide(path: "/metrics", authorization: nil) == .allowed)
        #expect(AdminAccess(config).decide(path: "/credentials", authorization: nil) == .missingToken)
    }

    @Test("loopback addresses", arguments: [("127.0.0.1", true), ("127.1.2.3", true), ("::1", true), ("[::1]", true),
                                            ("localhost", true), ("0.0.0.0", false), ("::", false), ("10.0.0.5", false),
                                            ("127.0.0.256", false), ("example.com", false)])
    func loopback(address: String, expected: Bool) {
        #expect(AdminAccess.isLoopback(address) == expected)
    }

    @Test("an admin address off loopback without admin.token is refused at its key; with a token it loads")
    func exposureNeedsToken() throws {
        let refused = diagnostics("admin:\n  address: 0.0.0.0\n  port: 9901\n" + minimalRoute)
        #expect(refused.count == 1)
        #expect(refused.first?.hasPrefix("portico.yaml:2 admin.address: \"0.0.0.0\" is not a loopback address") == true,
                "\(refused)")
        #expect(refused.first?.contains("set admin.token") == true)
        let config = try load("admin:\n  address: 0.0.0.0\n  token: ${ADMIN_TOKEN}\n" + minimalRoute,
                              environment: ["ADMIN_TOKEN": "t0ken-from-env"])
        #expect(config.admin.token == "t0ken-from-env")
        #expect(config.warnings.isEmpty)
        // Loopback needs none; a token written in the file is accepted with a warning.
        #expect(diagnostics("admin: { address: 127.0.0.1 }\n" + minimalRoute).isEmpty)
        let literal = try load("admin: { address: 0.0.0.0, token: written-here }\n" + minimalRoute)
        #expect(literal.warnings.map(\.description).contains { $0.contains("admin.token: the admin token is written in the file") })
        #expect(!literal.warnings.map(\.description).joined().contains("written-here"))
    }
}
