import Foundation
@testable import Portico
import PorticoTesting
import Testing

/// `ConfigSchema` (what `portico schema` prints) against the loader itself: the keys each parser
/// asks `ConfigMapping` for, at each key path, must be the schema's keys there, both ways, and a
/// section refuses unknown keys exactly when its parser does (`finish()`). The loads: the
/// reference file, every example, and `fixture` below, which reaches every section and type.
@Suite("Configuration schema: no drift from the loader")
struct ConfigSchemaDriftTests {
    static let root = ShippedConfigTests.root

    @Test("every mapping the loader reads has the schema's keys, and every section of the schema is reached")
    func keysMatchTheLoader() async throws {
        var reads: [(file: String, read: ConfigKeyRecorder.Read)] = []
        for file in ["config/portico.yaml"] + ShippedConfigTests.examples {
            let path = Self.root.appendingPathComponent(file).path
            let yaml = try String(contentsOfFile: path, encoding: .utf8)
            reads += try Self.record(yaml, source: file, baseDirectory: (path as NSString).deletingLastPathComponent)
                .map { (file, $0) }
        }
        reads += try Self.record(try await Self.fixture(), source: "fixture", baseDirectory: nil).map { ("fixture", $0) }

        let problems = Self.compare(reads, with: Self.expectedSections())
        #expect(problems.isEmpty, "\n\(problems.sorted().joined(separator: "\n"))")
    }

    @Test("a key on one side only is named with its path and the side that lacks it")
    func driftMessages() async throws {
        var expected = Self.expectedSections()
        expected["upstreams.*"]?.keys.remove("idle_timeout")
        expected["upstreams.*"]?.keys.insert("replicas")
        expected["routes[].direct.headers"]?.closed = true
        let reads = try Self.record(try await Self.fixture(), source: "fixture", baseDirectory: nil).map { ("fixture", $0) }
        #expect(Self.compare(reads, with: expected) == [
            "upstreams.*: key \"idle_timeout\" is read by the loader but missing from the schema (add it to ConfigSchema)",
            "upstreams.*: key \"replicas\" is in the schema but the loader never asks for it",
            "routes[].direct.headers: the schema refuses unknown keys here (additionalProperties: false) but the loader accepts any",
        ])
    }

    @Test("the typed sections list exactly the types the loader knows")
    func typesMatch() {
        #expect(ConfigSchema.middlewareTypes.map(\.type).sorted() == MiddlewareRegistry.standard.typeNames)
        #expect(ConfigSchema.credentialTypes.map(\.type) == CredentialConfig.supportedTypes)
        #expect(ConfigSchema.storeTypes.map(\.type) == StoreConfig.supportedTypes)
    }

    @Test("every key of the schema is documented in config/portico.yaml")
    func keysAreDocumented() throws {
        let reference = try String(contentsOf: Self.root.appendingPathComponent("config/portico.yaml"), encoding: .utf8)
        var names: Set<String> = []
        func collect(_ value: ConfigSchema.Value) {
            switch value {
            case .section(let section):
                for key in section.keys {
                    names.insert(key.name)
                    collect(key.value)
                }
            case .typed(let variants): variants.forEach { collect(.section($0.section)) }
            case .map(let item, _), .list(let item, _, _): collect(item)
            case .either(let values): values.forEach(collect)
            default: break
            }
        }
        collect(.section(ConfigSchema.root))
        let undocumented = names.filter { name in
            reference.range(of: "(^|[\\s{,#-])\(name):", options: .regularExpression) == nil
        }
        #expect(undocumented.isEmpty, "not in config/portico.yaml: \(undocumented.sorted())")
    }

    @Test("the printed schema is JSON with the draft 2020-12 header")
    func printsJSON() throws {
        let text = ConfigSchema.jsonText()
        let object = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
        #expect(object["$schema"] as? String == "https://json-schema.org/draft/2020-12/schema")
        #expect((object["required"] as? [String]) == ["routes"])
        #expect(object["additionalProperties"] as? Bool == false)
        let properties = try #require(object["properties"] as? [String: Any])
        #expect(Set(properties.keys) == Set(ConfigSchema.root.keys.map(\.name)))
    }

    /// Every disagreement between what the loads read and what the schema describes, one line each.
    static func compare(_ reads: [(file: String, read: ConfigKeyRecorder.Read)], with expected: [String: Expected]) -> Set<String> {
        var problems: Set<String> = []
        var reached: Set<String> = []
        for (file, read) in reads {
            let types = Dictionary(reads.filter { $0.file == file }.map { ($0.read.path, $0.read.type) }, uniquingKeysWith: { a, _ in a })
            guard let path = normalize(read.path, types: { types[$0] ?? nil }) else {
                problems.insert("\(file): the loader reads a mapping at \(read.path.isEmpty ? "(root)" : read.path), where the schema has no section")
                continue
            }
            reached.insert(path)
            guard let section = expected[path] else {
                problems.insert("\(path): the loader reads a mapping here; the schema has no section for it")
                continue
            }
            for key in read.asked.subtracting(section.keys).sorted() {
                problems.insert("\(path): key \"\(key)\" is read by the loader but missing from the schema (add it to ConfigSchema)")
            }
            for key in section.keys.subtracting(read.asked).sorted() {
                problems.insert("\(path): key \"\(key)\" is in the schema but the loader never asks for it")
            }
            if read.refusesUnknownKeys != section.closed {
                problems.insert(read.refusesUnknownKeys
                    ? "\(path): the loader refuses unknown keys here but the schema allows any key"
                    : "\(path): the schema refuses unknown keys here (additionalProperties: false) but the loader accepts any")
            }
        }
        for path in Set(expected.keys).subtracting(reached).sorted() {
            problems.insert("\(path): in the schema but no load reached it (add it to ConfigSchemaDriftTests.fixture)")
        }
        return problems
    }

    // MARK: Loading with a record

    static func record(_ yaml: String, source: String, baseDirectory: String?) throws -> [ConfigKeyRecorder.Read] {
        let recorder = ConfigKeyRecorder()
        do {
            _ = try ConfigLoader.load(yaml: yaml, source: source, environment: [:], baseDirectory: baseDirectory,
                                      keyRecorder: recorder)
        } catch {
            Issue.record("\(source) does not load:\n\(error)")
        }
        return recorder.reads()
    }

    /// Reaches every section and every `type:` the schema has, including the optional
    /// sub-sections (`listen.tls`, `retry.backoff`, `direct.headers`, …), with valid values.
    static func fixture() async throws -> String {
        let certificates = try await TestCertificates.shared()
        let ca = certificates.ca.certificateFile, client = certificates.client
        let server = certificates.server
        return """
            listen:
              port: 0
              tls: { cert_file: \(server.certificateFile), key_file: \(server.keyFile) }
            admin: { enabled: true, port: 0 }
            logging: { level: info, format: json }
            tracing:
              endpoint: http://127.0.0.1:4318
              headers: { x-api-key: abc }
            upstreams:
              plain: { url: http://127.0.0.1:9000 }
              pair:
                endpoints: [http://127.0.0.1:9001, http://127.0.0.2:9001]
                balance: least_request
                health_check: { path: /healthz, interval: 5s, timeout: 1s, healthy: 2, unhealthy: 3, expect: 200-399 }
                outlier_detection: { consecutive_failures: 5, base_ejection: 30s, max_ejection: 50%, failures: gateway }
                circuit_breaker: { max_requests: 100, max_pending: 10 }
                provider_limits: { scope: "header:x-api-key", when_exhausted: wait, max_wait: 5s, max_scopes: 100, default_hold: 1s, store: fleet }
              named: { url: "http://localhost:9002", transport: nio, dns_refresh: 30s }
              adaptive:
                endpoints: [http://127.0.0.1:9003, http://127.0.0.2:9003]
                balance: ewma
                concurrency: adaptive
                adaptive_concurrency: { min: 4, max: 1000, sample_window: 250ms, target_latency: min_rtt × 1.5 }
              multiplexed:
                url: http://localhost:9003
                transport: nio
                protocol: http2
                http2: { max_concurrent_streams: 50, connections_per_loop: 1, ping_interval: 30s, ping_timeout: 5s }
              secure:
                url: https://127.0.0.1:9443
                transport: nio
                tls: { ca_file: \(ca), client_cert_file: \(client.certificateFile), client_key_file: \(client.keyFile), server_name: billing.internal, min_version: "1.2" }
            credentials:
              fixed: { type: static, value: abc }
              basic: { type: basic, username: u, password: p }
              client:
                type: oauth2_client_credentials
                token_url: https://127.0.0.1:9100/token
                client_id: c
                client_secret: s
                extra_params: { resource: r }
                transport: nio
                tls: { ca_file: \(ca) }
              refresh:
                type: oauth2_refresh_token
                token_url: https://127.0.0.1:9100/token
                client_id: c
                client_secret: s
                refresh_token: t
                extra_params: { resource: r }
                transport: nio
                tls: { ca_file: \(ca) }
            stores:
              fleet:
                type: redis
                url: rediss://127.0.0.1:6380/0
                tls: { ca_file: \(ca) }
            middleware:
              log: { type: access_log }
              auth: { type: auth, credential: client }
              cache: { type: cache }
              gzip: { type: compress }
              limit: { type: rate_limit, rate: 10/s, store: fleet }
              quota:
                type: quota
                key: header:X-Team
                limit: 1000
                per: month
                timezone: Europe/Paris
                allocations: { team-a: 60%, default: 10% }
                store: fleet
                on_store_error: local
                headers: true
              retry: { type: retry, backoff: { base: 10ms, cap: 1s }, hedge: { after: p95, min: 10ms, max_extra: 1 } }
              stamp:
                type: headers
                request: { remove: [X-Debug], set: { X-Route: "${route}" }, add: { X-Seen-By: portico } }
                response: { remove: [Server], set: { X-Request-ID: "${request_id}" }, add: { X-Via: portico } }
            defaults:
              middleware: [log]
            routes:
              - name: up
                match: { path_prefix: /up/ }
                upstream: plain
                middleware: [log, limit, gzip, cache, retry, auth]
              - name: ping
                match: { path: /ping }
                direct: { status: 200, body: pong, headers: { content-type: text/plain } }
            """
    }

    // MARK: The schema's side

    struct Expected {
        var keys: Set<String>
        /// Refuses unknown keys (a section), or takes any (a map of names or header fields).
        var closed: Bool
    }

    /// Every mapping the schema describes, by normalized path: `upstreams.*.tls`,
    /// `routes[].match`, `middleware.*(type: retry).backoff`; `""` is the file itself.
    static func expectedSections() -> [String: Expected] {
        var result: [String: Expected] = [:]
        func visit(_ value: ConfigSchema.Value, at path: String) {
            switch value {
            case .section(let section):
                result[path] = Expected(keys: Set(section.keys.map(\.name)), closed: true)
                for key in section.keys { visit(key.value, at: join(path, key.name)) }
            case .typed(let variants):
                for variant in variants {
                    let variantPath = "\(path)(type: \(variant.type))"
                    result[variantPath] = Expected(keys: Set(variant.section.keys.map(\.name) + ["type"]), closed: true)
                    for key in variant.section.keys { visit(key.value, at: join(variantPath, key.name)) }
                }
            case .map(let item, _):
                result[path] = Expected(keys: [], closed: false)
                visit(item, at: join(path, "*"))
            case .list(let item, _, _):
                visit(item, at: path + "[]")
            case .either(let values):
                values.forEach { visit($0, at: path) }
            default:
                break
            }
        }
        visit(.section(ConfigSchema.root), at: "")
        return result
    }

    static func join(_ path: String, _ key: String) -> String {
        path.isEmpty ? key : "\(path).\(key)"
    }

    // MARK: The loader's side

    enum Segment: Equatable {
        case key(String)
        case index(Int)
    }

    /// `routes[0].match`, `upstreams["a.b"].tls` → segments (the inverse of `ConfigNode.join`).
    static func segments(_ path: String) -> [Segment] {
        var result: [Segment] = []
        var characters = Substring(path)
        while let first = characters.first {
            if first == "." {
                characters = characters.dropFirst()
            } else if characters.hasPrefix("[\"") {
                var key = ""
                var rest = characters.dropFirst(2)
                while let c = rest.first, c != "\"" {
                    rest = rest.dropFirst()
                    if c == "\\", let escaped = rest.first {
                        key.append(escaped == "n" ? "\n" : escaped)
                        rest = rest.dropFirst()
                    } else {
                        key.append(c)
                    }
                }
                result.append(.key(key))
                characters = rest.dropFirst(2)  // `"]`
            } else if first == "[" {
                let digits = characters.dropFirst().prefix { $0.isNumber }
                result.append(.index(Int(digits) ?? 0))
                characters = characters.dropFirst(digits.count + 2)
            } else {
                let key = characters.prefix { $0 != "." && $0 != "[" }
                result.append(.key(String(key)))
                characters = characters.dropFirst(key.count)
            }
        }
        return result
    }

    /// A read's path in the schema's terms, or nil when the schema has no place for it.
    /// `types` gives the `type:` word of the mapping at a raw path (for typed sections).
    static func normalize(_ rawPath: String, types: (String) -> String?) -> String? {
        var value = ConfigSchema.Value.section(ConfigSchema.root)
        var normalized = "", raw = ""
        func resolveType() -> Bool {
            guard case .typed(let variants) = value else { return true }
            guard let type = types(raw), let variant = variants.first(where: { $0.type == type }) else { return false }
            value = .section(variant.section)
            normalized += "(type: \(type))"
            return true
        }
        for segment in segments(rawPath) {
            guard resolveType() else { return nil }
            if case .either(let options) = value {
                guard let container = options.first(where: {
                    switch $0 { case .section, .map, .list, .typed: true
                    default: false }
                }) else { return nil }
                value = container
            }
            switch (value, segment) {
            case (.section(let section), .key(let name)):
                guard let key = section.keys.first(where: { $0.name == name }) else { return nil }
                value = key.value
                normalized = join(normalized, name)
                raw = ConfigNode.join(raw, name)
            case (.map(let item, _), .key(let name)):
                value = item
                normalized = join(normalized, "*")
                raw = ConfigNode.join(raw, name)
            case (.list(let item, _, _), .index(let index)):
                value = item
                normalized += "[]"
                raw += "[\(index)]"
            default:
                return nil
            }
        }
        guard resolveType() else { return nil }
        return normalized
    }
}
