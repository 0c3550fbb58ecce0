import HTTPTypes
@testable import Portico
import PorticoTesting
import Testing

@Suite("header rules: templates and configuration")
struct HeaderRulesTests {
    func template(_ text: String, _ environment: [String: String] = [:]) throws -> HeaderTemplate {
        try HeaderTemplate(parsing: text, environment: environment)
    }

    @Test("a template is parsed once into literal and per-request parts")
    func parts() throws {
        #expect(try template("plain").parts == [.literal("plain")])
        #expect(try template("").parts == [])
        #expect(try template("id=${request_id};ip=${client_ip}").parts
            == [.literal("id="), .requestID, .literal(";ip="), .clientIP])
        #expect(try template("${route}${upstream}").parts == [.route, .upstream])
        // `${env:…}` becomes literal text at load, merged with its neighbours.
        #expect(try template("Bearer ${env:TOKEN}!", ["TOKEN": "s3cret"]).parts == [.literal("Bearer s3cret!")])
        // `$${` is a literal `${`; a lone `$` stays.
        #expect(try template("$${request_id} costs $5").parts == [.literal("${request_id} costs $5")])
        #expect(try template("a ${env:T}", ["T": "x"]).isConstant)
        #expect(try !template("${route}").isConstant)
    }

    @Test("rendering joins the parts with the request's values")
    func render() throws {
        let t = try template("${request_id}/${client_ip}/${route}/${upstream}/${env:E}", ["E": "e"])
        #expect(t.render(requestID: "r1", clientIP: "127.0.0.1", route: "api", upstream: "app") == "r1/127.0.0.1/api/app/e")
        #expect(t.render(requestID: "r1", clientIP: "", route: nil, upstream: nil) == "r1////e")
    }

    @Test("unknown references, bad env names, missing variables and CR/LF are errors that show no value")
    func errors() {
        func failure(_ text: String, _ environment: [String: String] = [:]) -> HeaderTemplate.ParseError? {
            do throws(HeaderTemplate.ParseError) {
                _ = try HeaderTemplate(parsing: text, environment: environment)
                return nil
            } catch { return error }
        }
        #expect(failure("${requestid}") == .unknownReference("${requestid}"))
        #expect(failure("${API_KEY}") == .unknownReference("${API_KEY}"))
        #expect(failure("${API_KEY}")?.description.contains("${env:API_KEY}") == true)
        #expect(failure("${file:/etc/x}") == .unknownReference("${file:/etc/x}"))
        #expect(failure("${request_id") == .unterminated)
        #expect(failure("${env:1X}") == .invalidEnvironmentName("1X"))
        #expect(failure("${env:MISSING}") == .environmentNotSet("MISSING"))
        #expect(failure("a\r\nb") == .invalidCharacter)
        let bad = failure("${env:SPLIT}", ["SPLIT": "top\nsecret"])
        #expect(bad == .invalidEnvironmentValue("SPLIT"))
        #expect(bad?.description.contains("secret") == false)
    }

    @Test("rules apply remove, then set, then add")
    func apply() throws {
        let rules = HeaderRules(
            remove: [HTTPField.Name("X-Debug")!],
            set: [.init(name: HTTPField.Name("X-Id")!, value: try template("${request_id}"))],
            add: [.init(name: HTTPField.Name("X-Tag")!, value: try template("b"))])
        var fields = HTTPFields([HTTPField(name: HTTPField.Name("X-Debug")!, value: "1"),
                                 HTTPField(name: HTTPField.Name("X-Id")!, value: "client-1"),
                                 HTTPField(name: HTTPField.Name("x-id")!, value: "client-2"),
                                 HTTPField(name: HTTPField.Name("X-Tag")!, value: "a")])
        rules.apply(to: &fields, requestID: "r9", clientIP: "", route: nil, upstream: nil)
        #expect(fields[values: HTTPField.Name("X-Debug")!] == [])
        #expect(fields[values: HTTPField.Name("X-Id")!] == ["r9"])
        #expect(fields[values: HTTPField.Name("X-Tag")!] == ["a", "b"])
    }

    // MARK: Configuration

    func headers(_ body: String, environment: [String: String] = [:]) throws -> HeadersConfig? {
        let config = try load("middleware:\n  h:\n    type: headers\n" + body + minimalRoute, environment: environment)
        return config.middleware["h"]?.settings(as: HeadersConfig.self)
    }

    @Test("every key, and the loader's ${VAR} interpolation leaves header values to the template parser")
    func everyKey() throws {
        let c = try #require(try headers("""
                request:
                  set: { X-Request-Id: "${request_id}", Authorization: "Bearer ${env:API_TOKEN}" }
                  add: { X-Via-Route: "${route} -> ${upstream}" }
                  remove: [X-Debug, cookie]
                response:
                  set: { X-Served-By: portico }
                  remove: [Server]

            """, environment: ["API_TOKEN": "t0k", "request_id": "from-env", "route": "from-env"]))
        // An environment variable named like a template reference is not read: the middleware fills it.
        #expect(c.request.set.map(\.value.parts) == [[.requestID], [.literal("Bearer t0k")]])
        #expect(c.request.add.first?.value.parts == [.route, .literal(" -> "), .upstream])
        #expect(c.request.remove.map(\.canonicalName) == ["x-debug", "cookie"])
        #expect(c.response.set.first?.value.parts == [.literal("portico")])
        #expect(c.response.remove.map(\.canonicalName) == ["server"])
        // Elsewhere in the file the loader still interpolates.
        let config = try load("upstreams: { app: { url: \"http://${HOST}:1\" } }\n" + minimalRoute, environment: ["HOST": "10.0.0.9"])
        #expect(config.upstreams["app"]?.url.host == "10.0.0.9")
    }

    @Test("check refuses rules on fields Portico frames, pointing to host_header", arguments: [
        "Host", "content-length", "Transfer-Encoding", "Connection", "Keep-Alive", "TE", "Trailer", "Upgrade",
        "Proxy-Connection", "Proxy-Authorization",
    ])
    func framedFields(name: String) {
        for (key, value) in [("set", "{ \(name): x }"), ("add", "{ \(name): x }"), ("remove", "[\(name)]")] {
            for direction in ["request", "response"] {
                let found = diagnostics("middleware:\n  h:\n    type: headers\n    \(direction):\n      \(key): \(value)\n" + minimalRoute)
                #expect(found.count == 1, "\(direction).\(key) \(name)")
                #expect(found.first?.contains("middleware.h.\(direction).\(key)") == true, "\(found)")
                #expect(found.first?.contains("cannot be changed by a header rule") == true, "\(found)")
                #expect(found.first?.contains("host_header:") == true, "\(found)")
            }
        }
    }

    @Test("bad templates and contradictory rules are check errors", arguments: [
        ("request: { set: { X-A: \"${request}\" } }", "middleware.h.request.set.X-A: unknown reference \"${request}\""),
        ("request: { set: { X-A: \"${SECRET}\" } }", "for an environment variable write ${env:SECRET}"),
        ("request: { set: { X-A: \"${env:NOPE}\" } }", "environment variable \"NOPE\" is not set"),
        ("request: { set: { X-A: \"${route\" } }", "unterminated"),
        ("request: { set: { \"Bad Name\": x } }", "is not a valid header field name"),
        ("request: { set: { X-A: a, x-a: b } }", "is set twice"),
        ("request: { remove: [X-A], set: { X-A: b } }", "is both removed and set"),
        ("request: { set: { X-A: a }, add: { X-A: b } }", "is both set and added"),
        ("request: { sett: { X-A: a } }", "unknown key \"sett\""),
        ("request: {}", "sets, adds or removes nothing"),
        ("response: { set: [X-A] }", "expected a mapping"),
    ])
    func badRules(rule: String, expected: String) {
        let found = diagnostics("middleware:\n  h:\n    type: headers\n    \(rule)\n" + minimalRoute)
        #expect(found.contains { $0.contains(expected) }, "\(found)")
    }

    @Test("an env value never reaches a diagnostic or the step's description")
    func secretsStayHidden() throws {
        let c = try #require(try headers("    request: { set: { Authorization: \"Bearer ${env:API_TOKEN}\" } }\n",
                                         environment: ["API_TOKEN": "hunter2"]))
        let described = HeadersMiddleware(c).describe(for: nil)
        #expect(described.settings == "request: set [Authorization: \"Bearer ${env:API_TOKEN}\"]")
        #expect(described.answersAtOnce == nil)
        #expect(!described.settings.contains("hunter2"))
        let found = diagnostics("middleware:\n  h:\n    type: headers\n    request: { set: { X-A: \"${env:T}\" } }\n" + minimalRoute,
                                environment: ["T": "hunter2\nx"])
        #expect(found.count == 1 && !found[0].contains("hunter2"), "\(found)")
    }

    @Test("host_header: a host or host:port, refused with preserve_host: true")
    func hostHeader() throws {
        let good = try load("upstreams: { app: { url: \"http://127.0.0.1:1\", host_header: \"api.example.com:8443\" } }\n" + minimalRoute)
        #expect(good.upstreams["app"]?.hostHeader == "api.example.com:8443")
        #expect(try load("upstreams: { app: { url: \"http://127.0.0.1:1\", host_header: \"[::1]:80\" } }\n" + minimalRoute)
            .upstreams["app"]?.hostHeader == "[::1]:80")
        for bad in ["a b", "host:0", "host:x", "", "a:b:c"] {
            let found = diagnostics("upstreams: { app: { url: \"http://127.0.0.1:1\", host_header: \"\(bad)\" } }\n" + minimalRoute)
            #expect(found.count == 1, "\(bad): \(found)")
        }
        let both = diagnostics("upstreams: { app: { url: \"http://127.0.0.1:1\", preserve_host: true, host_header: a.test } }\n" + minimalRoute)
        #expect(both == ["portico.yaml:1 upstreams.app.host_header: cannot be combined with preserve_host: true, which sends the client's Host instead"])
    }
}
