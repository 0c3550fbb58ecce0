import Portico
import Testing

@Suite("compress configuration")
struct CompressConfigTests {
    func compress(_ body: String) throws -> CompressConfig? {
        let config = try load("middleware:\n  c:\n    type: compress\n" + body + minimalRoute)
        guard let compress = config.middleware["c"]?.settings(as: CompressConfig.self) else { return nil }
        return compress
    }

    @Test("defaults: level 6, 1 KiB, JSON/text/JavaScript/XML/SVG and +json/+xml, 256 KiB of zlib state")
    func defaults() throws {
        let c = try #require(try compress(""))
        #expect(c == CompressConfig())
        #expect(c.level == 6 && c.minBytes == 1024 && c.windowBits == 15 && c.memLevel == 8)
        for type in ["application/json", "application/json; charset=utf-8", "Application/JSON", "text/html", "text/css",
                     "text/javascript", "application/javascript", "application/xml", "image/svg+xml",
                     "application/problem+json", "application/vnd.api+json", "application/atom+xml", "text/plain;charset=utf-8"] {
            #expect(c.compresses(contentType: type), "\(type)")
        }
        for type in ["image/png", "application/octet-stream", "application/gzip", "video/mp4", "text/event-stream",
                     "text/event-stream; charset=utf-8", "", "json", "application/jsonx", "application/json+zip"] {
            #expect(!c.compresses(contentType: type), "\(type)")
        }
    }

    @Test("every key")
    func everyKey() throws {
        let c = try #require(try compress("""
                level: 1
                min_bytes: 0
                types: [application/json, "text/*", "*/*+yaml"]
                window_bits: 9
                mem_level: 1

            """))
        #expect(c.level == 1 && c.minBytes == 0 && c.windowBits == 9 && c.memLevel == 1)
        #expect(c.types.map(\.description) == ["application/json", "text/*", "*/*+yaml"])
        #expect(c.compresses(contentType: "application/openapi+yaml"))
        #expect(!c.compresses(contentType: "application/xml"))
        #expect(try compress("    min_bytes: 4KiB\n")?.minBytes == 4096)
        #expect(try compress("    types: [\"*/*\"]\n")?.compresses(contentType: "image/png") == true)
    }

    @Test("invalid values name the key and the problem", arguments: [
        ("level: 0", "middleware.c.level: must be between 1 and 9, got 0"),
        ("level: 10", "middleware.c.level: must be between 1 and 9, got 10"),
        ("window_bits: 8", "middleware.c.window_bits: must be between 9 and 15, got 8"),
        ("mem_level: 10", "middleware.c.mem_level: must be between 1 and 9, got 10"),
        ("types: []", "middleware.c.types: must list at least one media type"),
        ("types: json", "middleware.c.types: expected a list, got \"json\""),
        ("types: [json]", "middleware.c.types[0]: invalid media type \"json\"; expected type/subtype, type/*, */*+suffix or */*"),
        ("types: [\"*/json\"]", "middleware.c.types[0]: invalid media type \"*/json\"; expected type/subtype, type/*, */*+suffix or */*"),
        ("types: [\"text/x y\"]", "middleware.c.types[0]: invalid media type \"text/x y\"; expected type/subtype, type/*, */*+suffix or */*"),
        ("types: [text/html, TEXT/HTML]", "middleware.c.types[1]: duplicate media type \"text/html\""),
        ("levle: 3", "middleware.c.levle: unknown key \"levle\" (did you mean \"level\"?)"),
    ])
    func invalid(line: String, expected: String) {
        let found = diagnostics("middleware:\n  c:\n    type: compress\n    \(line)\n" + minimalRoute)
        #expect(found == ["portico.yaml:4 \(expected)"])
    }

    @Test("media type patterns")
    func patterns() throws {
        let json = try #require(MediaTypePattern("application/json"))
        #expect(json.matches(contentType: " application/json ; charset=utf-8"))
        #expect(!json.matches(contentType: "application/json-seq"))
        let text = try #require(MediaTypePattern("TEXT/*"))
        #expect(text.description == "text/*")
        #expect(text.matches(contentType: "text/csv"))
        #expect(!text.matches(contentType: "textual/csv"))
        let suffix = try #require(MediaTypePattern("*/*+json"))
        #expect(suffix.matches(contentType: "application/problem+json"))
        #expect(!suffix.matches(contentType: "application/json"))
        #expect(!suffix.matches(contentType: "application/jsonp+jsonx"))
        #expect(MediaTypePattern("application/*+json")?.matches(contentType: "image/x+json") == false)
        for bad in ["", "/", "text/", "/json", "text/*/x", "*/json", "text/*+", "te xt/html", "text/ht*ml"] {
            #expect(MediaTypePattern(bad) == nil, "\(bad)")
        }
    }
}
