import Foundation
import HTTPTypes
@testable import Portico
import PorticoTesting
import Testing

/// Seeded mutation fuzzing of every parser Portico owns: each input is a valid example with
/// random edits (inserted bytes from an alphabet of delimiters, controls and digits, deletions,
/// duplicated runs, splices of two examples, huge numbers) or pure noise. A crash fails the run;
/// the invariants checked are the ones each parser promises. Seeds are fixed, so a failure
/// reproduces; the seed and input are in the failure message. `scripts/fuzz` runs the same
/// targets longer: `PORTICO_FUZZ_SCALE` multiplies the iterations, `PORTICO_FUZZ_SEED` moves
/// every seed (a crash found that way becomes an example or a test case here).
@Suite("Parser fuzzing (seeded)")
struct ParserFuzzTests {
    typealias Seeded = SplitMix64

    static let alphabet: [String] = [
        ",", ";", "=", "\"", "\\", " ", "\t", "\r", "\n", "\0", "\u{7F}", "\u{1}", "*", "/", ":", "-", ".",
        "0", "1", "9", "99999999999999999999999", "-1", "1e308", "q", "Q", "%", "ü", "😀", "{", "}", "[", "]", "#", "&", "$",
        "${", "${X}", "${file:/nonexistent}", "max-age", "no-cache", "gzip", "identity", "GMT", "s", "ms", "KiB", "/s",
    ]

    static func mutate(_ examples: [String], _ random: inout Seeded) -> String {
        if Int.random(in: 0..<20, using: &random) == 0 {
            // Pure noise.
            let count = Int.random(in: 0..<64, using: &random)
            return String((0..<count).map { _ in Character(Unicode.Scalar(UInt8.random(in: 0...127, using: &random))) })
        }
        var text = Array(examples.randomElement(using: &random)!)
        for _ in 0..<Int.random(in: 1...4, using: &random) {
            let position = text.isEmpty ? 0 : Int.random(in: 0...text.count, using: &random)
            switch Int.random(in: 0..<5, using: &random) {
            case 0: text.insert(contentsOf: alphabet.randomElement(using: &random)!, at: position)
            case 1: if !text.isEmpty { text.remove(at: min(position, text.count - 1)) }
            case 2:
                let end = min(text.count, position + Int.random(in: 1...8, using: &random))
                text.insert(contentsOf: Array(text[position..<end]), at: position)
            case 3:
                let other = Array(examples.randomElement(using: &random)!)
                text = Array(text[..<position]) + other[Int.random(in: 0...other.count, using: &random)...]
            default: text.insert(contentsOf: String(UInt64.random(in: 0...UInt64.max, using: &random)), at: position)
            }
        }
        return String(text)
    }

    static let environment = ProcessInfo.processInfo.environment
    static let scale = max(1, Int(environment["PORTICO_FUZZ_SCALE"] ?? "") ?? 1)
    static let seedOffset = UInt64(environment["PORTICO_FUZZ_SEED"] ?? "") ?? 0

    static func inputs(_ examples: [String], count: Int, seed: UInt64) -> Yielding {
        var random = Seeded(state: seed &+ seedOffset &* 1_000_003)
        return Yielding(base: (examples + (0..<count * scale).map { _ in mutate(examples, &random) }).makeIterator())
    }

    /// The inputs, pausing every few hundred so other tests get a turn: the suite runs in parallel
    /// on Swift concurrency's few threads, and a loop that never suspends holds one for seconds.
    struct Yielding: AsyncSequence, AsyncIteratorProtocol {
        var base: IndexingIterator<[String]>
        var taken = 0

        mutating func next() async -> String? {
            taken += 1
            if taken % 256 == 0 { await Task.yield() }
            return base.next()
        }

        func makeAsyncIterator() -> Yielding { self }
    }

    @Test("durations, sizes and rates: a value or a UnitError, never a crash; values are not negative")
    func units() async {
        for await input in Self.inputs(["250ms", "10s", "1.5s", "5m", "1h", "0", "512B", "64KiB", "10MiB", "1GB", "100/s", "5/m", "1000/h"],
                                 count: 20_000, seed: 1) {
            if let duration = try? ConfigUnits.duration(input) { #expect(duration >= .zero, "\(input.debugDescription)") }
            if let size = try? ConfigUnits.byteSize(input) { #expect(size >= 0, "\(input.debugDescription)") }
            _ = try? ConfigUnits.rate(input)
        }
    }

    @Test("Cache-Control and request directives never crash; ages are not negative")
    func cacheControl() async {
        let examples = ["max-age=60", "no-cache, no-store", "private=\"set-cookie, x\", s-maxage=10", "public, max-age=\"30\"",
                        "stale-while-revalidate=5, stale-if-error=60", "no-cache=\"a\\\"b\"", "must-revalidate, immutable, max-stale",
                        "min-fresh=10, only-if-cached", "max-age=9999999999999999999999",
                        "max-age=60;a=?0, private=\"x\"", "max-age=(1 2), *x=?1", "max-age=1.5, no-store=:AAA=:"]
        for await input in Self.inputs(examples, count: 20_000, seed: 2) {
            let parsed = CacheControl(parsing: input)
            _ = parsed
            var fields = HTTPFields()
            if HTTPField.isValidValue(input) {
                fields[.cacheControl] = input
                fields[HTTPField.Name("Pragma")!] = input
                fields[HTTPField.Name("CDN-Cache-Control")!] = input
            }
            _ = RequestDirectives(fields)
            for targets in [[], [HTTPField.Name("CDN-Cache-Control")!]] {
                let freshness = ResponseFreshness(status: 200, headerFields: fields, requestTime: Date(timeIntervalSince1970: 1_000_000),
                                                  responseTime: Date(timeIntervalSince1970: 1_000_001), targets: targets)
                #expect(freshness.lifetime >= .zero && freshness.initialAge >= .zero)
            }
        }
    }

    @Test("Accept-Encoding: q-values stay within 0...1000, never a crash")
    func acceptEncoding() async {
        let examples = ["gzip", "gzip;q=0.5, identity;q=0", "*;q=0.1", "br, gzip;q=1.000, deflate;q=0.001", "x-gzip", "identity;q=0",
                        "gzip; q=0 , *"]
        for await input in Self.inputs(examples, count: 20_000, seed: 3) {
            _ = AcceptEncoding(fieldValues: [input, input])
            if let q = AcceptEncoding.qvalue(input) { #expect((0...1000).contains(q), "\(input.debugDescription)") }
        }
    }

    @Test("Retry-After: seconds or an HTTP date, never negative, never a crash")
    func retryAfter() async {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let examples = ["120", "0", "Wed, 21 Oct 2026 07:28:00 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"]
        for await input in Self.inputs(examples, count: 20_000, seed: 4) {
            if let delay = RetryAfter.delay(input, now: now) { #expect(delay >= .zero, "\(input.debugDescription)") }
            _ = HTTPDate.parse(input)
        }
    }

    @Test("Vary: normalised values and keys never crash")
    func vary() async {
        let examples = ["Accept-Encoding", "accept-encoding, Accept-Language", "*", "Cookie,  X-A ,,", ""]
        for await input in Self.inputs(examples, count: 10_000, seed: 5) {
            guard HTTPField.isValidValue(input) else { continue }
            var response = HTTPFields()
            response[HTTPField.Name("Vary")!] = input
            var request = HTTPFields()
            request[.acceptEncoding] = input
            _ = VaryKey(response: response, request: request)
        }
    }

    @Test("list-based fields: elements non-empty, in order, trimmed; without quotes exactly the comma split; never a crash")
    func lists() async {
        let examples = ["gzip, br;q=0.5, identity;q=0", #""a,b", W/"c", "d\""#, #"private="set-cookie, x", max-age=60"#,
                        ",, a ,\t, \"unterminated, b", #"text/html;charset="a;b";q=0.9, */*;q=0.1"#, #""x\"y,z", *"#, ""]
        func isOWS(_ byte: UInt8) -> Bool { byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") }
        for await input in Self.inputs(examples, count: 20_000, seed: 8) {
            for quoting in [HTTPList.Quoting.quotedString, .entityTag] {
                var previousEnd = input.startIndex
                for element in HTTPList(input, quoting: quoting) {
                    let bytes = element.text.utf8
                    #expect(!bytes.isEmpty && !isOWS(bytes.first!) && !isOWS(bytes.last!), "\(input.debugDescription)")
                    #expect(element.text.startIndex >= previousEnd, "\(input.debugDescription)")
                    #expect(element.value.startIndex == element.text.startIndex && element.value.endIndex <= element.text.endIndex)
                    for parameter in element.parameters {
                        #expect(parameter.name.utf8.first.map(isOWS) != true && parameter.name.utf8.last.map(isOWS) != true,
                                "\(input.debugDescription)")
                        if let value = parameter.value { _ = HTTPList.unquoted(value) }
                    }
                    _ = HTTPList.unquoted(element.text)
                    previousEnd = element.text.endIndex
                }
            }
            if !input.contains("\"") {
                let parsed = HTTPList(input).map { Array($0.text.utf8) }
                let reference = Array(input.utf8).split(separator: UInt8(ascii: ","), omittingEmptySubsequences: false)
                    .map { Array($0.drop(while: isOWS).reversed().drop(while: isOWS).reversed()) }
                    .filter { !$0.isEmpty }
                #expect(parsed == reference, "\(input.debugDescription)")
            }
            if HTTPField.isValidValue(input) {
                var request = HTTPFields()
                request[.ifNoneMatch] = input
                var response = HTTPFields()
                response[.eTag] = input
                _ = ConditionalRequest.isNotModified(request: request, response: response)
            }
        }
    }

    @Test("token responses: a token or a TokenEndpointError, never a crash")
    func tokenResponses() async {
        let examples = [#"{"access_token":"a","token_type":"Bearer","expires_in":3600}"#,
                        #"{"access_token":"b","expires_in":"60","refresh_token":"r","scope":"x y"}"#,
                        #"{"error":"invalid_client","error_description":"no"}"#, "[]", "{}", "null"]
        for await input in Self.inputs(examples, count: 10_000, seed: 6) {
            if let token = try? TokenEndpointClient.parse(Data(input.utf8)) {
                #expect(!token.accessToken.isEmpty)
                #expect(HTTPField.isValidValue(token.accessToken), "a token must be usable as a header value")
            }
        }
    }

    @Test("configuration files: diagnostics or a config, never a crash")
    func configFiles() async {
        let examples = [
            "listen: { port: 8080, max_body_bytes: 1MiB }\nroutes:\n  - name: a\n    match: { path: /a }\n    direct: { body: ok }\n",
            "upstreams:\n  u: { url: \"http://127.0.0.1:1\", timeout: 2s }\nroutes:\n  - { name: r, match: { path_prefix: / }, upstream: u }\n",
            "middleware:\n  l: { type: rate_limit, rate: 10/s, burst: 5 }\n  c: { type: cache, max_bytes: 1MiB }\n  g: { type: compress, level: 6 }\n",
            "credentials:\n  k: { type: static, header: X-Key, value: \"${X:-d}\" }\n",
        ]
        for await input in Self.inputs(examples, count: 1_500, seed: 7) {
            _ = try? ConfigLoader.load(yaml: input, source: "fuzz.yaml", environment: ["X": "v"])
        }
    }
}
