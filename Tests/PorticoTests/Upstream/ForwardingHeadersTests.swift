import Foundation
import HTTPTypes
import NIOHTTP1
@testable import Portico
import Testing

@Suite struct ForwardingHeadersTests {
    func fields(_ pairs: [(String, String)]) -> HTTPFields {
        var fields = HTTPFields()
        for (name, value) in pairs { fields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
        return fields
    }

    func pairs(_ fields: HTTPFields) -> [String] {
        fields.map { "\($0.name.rawName): \($0.value)" }
    }

    @Test func dropsHopByHopAndConnectionNamedHeaders() {
        let input = fields([
            ("Connection", "keep-alive, X-Private"), ("Keep-Alive", "timeout=5"), ("X-Private", "1"),
            ("Proxy-Connection", "keep-alive"), ("Proxy-Authenticate", "Basic"), ("Proxy-Authorization", "Basic abc"),
            ("TE", "trailers"), ("Trailer", "X-Sum"), ("Transfer-Encoding", "chunked"), ("Upgrade", "h2c"),
            ("Accept", "a"), ("X-Dup", "1"), ("connection", "x-other"), ("X-Other", "2"), ("X-Dup", "2"),
        ])
        #expect(pairs(ForwardingHeaders.removingHopByHop(input)) == ["Accept: a", "X-Dup: 1", "X-Dup: 2"])
    }

    @Test("the fast hop-by-hop check agrees with the list, whatever the name's length")
    func hopByHopCheckMatchesTheList() {
        for name in ForwardingHeaders.hopByHop { #expect(ForwardingHeaders.isHopByHop(name), "\(name)") }
        let others = ["", "t", "tf", "ta", "accept", "trailers", "upgrade2", "connectio", "keep-alivE", "proxy-connectionx",
                      "content-length", "transfer-encodinG", "proxy-authenticat", "x-forwarded-for", "via", "host"]
        for name in others { #expect(!ForwardingHeaders.isHopByHop(name), "\(name)") }
    }

    @Test func requestFieldsAddForwardingAndKeepOrder() {
        let input = fields([("Accept", "*/*"), ("Cookie", "a=1"), ("Cookie", "b=2"), ("Connection", "close")])
        let out = ForwardingHeaders.upstreamRequestFields(
            input, authority: "client.example", clientAddress: "203.0.113.7",
            upstreamHost: "10.0.0.1:9000", preserveHost: false)
        #expect(pairs(out) == [
            "Host: 10.0.0.1:9000", "Accept: */*", "Cookie: a=1", "Cookie: b=2",
            "X-Forwarded-For: 203.0.113.7", "X-Forwarded-Proto: http", "X-Forwarded-Host: client.example",
            "Via: 1.1 portico",
        ])
    }

    @Test func existingForwardingHeadersAreExtendedOrKept() {
        let input = fields([
            ("Host", "client.example:8080"), ("X-Forwarded-For", "198.51.100.1"), ("X-Forwarded-For", "198.51.100.2"),
            ("X-Forwarded-Proto", "https"), ("X-Forwarded-Host", "edge.example"), ("Via", "1.0 edge"),
        ])
        let out = ForwardingHeaders.upstreamRequestFields(
            input, clientAddress: "203.0.113.7", upstreamHost: "up:9000", preserveHost: false)
        #expect(pairs(out) == [
            "Host: up:9000", "X-Forwarded-For: 198.51.100.1", "X-Forwarded-For: 198.51.100.2, 203.0.113.7",
            "X-Forwarded-Proto: https", "X-Forwarded-Host: edge.example", "Via: 1.0 edge, 1.1 portico",
        ])
    }

    @Test func preserveHostSendsTheClientsHost() {
        let input = fields([("Accept", "x"), ("Host", "client.example:8080"), ("Host", "dup")])
        let out = ForwardingHeaders.upstreamRequestFields(
            input, clientAddress: "", upstreamHost: "up:9000", preserveHost: true)
        #expect(pairs(out) == [
            "Accept: x", "Host: client.example:8080", "X-Forwarded-Proto: http",
            "X-Forwarded-Host: client.example:8080", "Via: 1.1 portico",
        ])
        let fromAuthority = ForwardingHeaders.upstreamRequestFields(
            HTTPFields(), authority: "a.example", clientAddress: "", upstreamHost: "up", preserveHost: true)
        #expect(fromAuthority[ForwardingHeaders.host] == "a.example")
    }

    @Test func responseFieldsDropHopByHopAndAddVia() {
        let input = fields([("Set-Cookie", "a=1"), ("Connection", "close"), ("Set-Cookie", "b=2"), ("Transfer-Encoding", "chunked")])
        #expect(pairs(ForwardingHeaders.clientResponseFields(input)) == ["Set-Cookie: a=1", "Set-Cookie: b=2", "Via: 1.1 portico"])
    }

    /// The `nio` transport converts an upstream head and makes its fields the client's in one
    /// pass (`NIOUpstream.makeResponse`): it must give exactly what the two steps give, converting
    /// and then dropping hop-by-hop fields and extending (or adding) `Via`.
    @Test(arguments: [
        [("Server", "nginx"), ("Content-Type", "application/json"), ("Content-Length", "2"), ("Connection", "keep-alive")],
        [("Connection", "keep-alive, X-Internal"), ("X-Internal", "secret"), ("Keep-Alive", "timeout=5"), ("Set-Cookie", "a=1"),
         ("Set-Cookie", "b=2"), ("Proxy-Authenticate", "Basic"), ("Upgrade", "h2c")],
        [("Via", "1.0 edge"), ("Date", "today"), ("VIA", "1.1 inner, "), ("Trailer", "x")],
        [("Content-Type", "text/plain"), ("Bad Name", "dropped"), ("X-Value", "tab\there")],
        [],
    ])
    func nioResponseFieldsMatchTheTwoSteps(_ head: [(String, String)]) {
        var upstream = NIOHTTP1.HTTPHeaders()
        for (name, value) in head { upstream.add(name: name, value: value) }
        let converted = NIOUpstream.makeResponse(HTTPResponseHead(version: .http1_1, status: .ok, headers: upstream), body: .empty)
        var twoSteps = HTTPFields()
        for (name, value) in head {
            if let name = HTTPField.Name(name) { twoSteps.append(HTTPField(name: name, value: value)) }
        }
        var expected = ForwardingHeaders.removingHopByHop(twoSteps)
        if let last = expected.lastIndex(where: { $0.name == ForwardingHeaders.via }) {
            expected[last] = HTTPField(name: ForwardingHeaders.via, value: "\(expected[last].value.trimmingWhitespace()), 1.1 portico")
        } else {
            expected.append(HTTPField(name: ForwardingHeaders.via, value: "1.1 portico"))
        }
        #expect(pairs(converted.headerFields) == pairs(expected))
        #expect(pairs(ForwardingHeaders.clientResponseFields(twoSteps)) == pairs(expected))
    }
}

@Suite struct UpstreamTargetTests {
    @Test(arguments: [
        ("http://up:9000", "/orders?x=1", "http://up:9000/orders?x=1"),
        ("http://up:9000/", "/orders?x=1", "http://up:9000/orders?x=1"),
        ("http://up:9000/api", "/orders?x=1", "http://up:9000/api/orders?x=1"),
        ("http://up:9000/api/", "/orders?x=1", "http://up:9000/api/orders?x=1"),
        ("http://up:9000/api", "/", "http://up:9000/api/"),
        ("http://up:9000/api", "", "http://up:9000/api"),
        ("http://up:9000", "", "http://up:9000/"),
        ("http://up:9000/api", "?q=1", "http://up:9000/api?q=1"),
        ("http://up:9000/api?ignored=1", "/x", "http://up:9000/api/x"),
        ("HTTP://user:pw@up:9000/api", "/x", "http://up:9000/api/x"),
        ("http://[::1]:9000/api", "/x", "http://[::1]:9000/api/x"),
        ("http://up/api", "/a%2Fb//c?x=%2F&y=a+b&x=2&e=%E2%82%AC&k", "http://up/api/a%2Fb//c?x=%2F&y=a+b&x=2&e=%E2%82%AC&k"),
    ])
    func joinsBasePathAndTarget(base: String, target: String, expected: String) {
        #expect(UpstreamTarget(baseURL: base).urlString(for: target) == expected)
    }

    @Test func authorityIsHostAndPort() {
        #expect(UpstreamTarget(baseURL: "http://up:9000/api").authority == "up:9000")
        #expect(UpstreamTarget(baseURL: "https://user@up/api").authority == "up")
        #expect(UpstreamTarget(baseURL: "http://[::1]:81").authority == "[::1]:81")
    }

    /// URLSession needs a URL: building it from the string must not decode or re-encode the query.
    @Test(arguments: ["/a?x=%2F&y=a+b&x=2", "/p%20q?e=%E2%82%AC&plus=+&amp=%26", "/x?k&k=&k=1", "/a%2Fb?x=%252F"])
    func foundationURLKeepsTargetBytes(target: String) throws {
        let string = UpstreamTarget(baseURL: "http://127.0.0.1:9/api").urlString(for: target)
        let url = try #require(URL(string: string))
        #expect(url.absoluteString == string)
        let query = target.split(separator: "?", maxSplits: 1).dropFirst().first.map(String.init)
        #expect(url.query(percentEncoded: true) == query)
    }
}

@Suite struct ZlibTests {
    @Test(arguments: [0, 1, 100, 200_000])
    func roundTrips(count: Int) throws {
        let bytes = Fixture.randomBytes(count) + Array(repeating: 7, count: count)
        for format in [Zlib.Format.gzip, .zlib] {
            let encoded = try Zlib.compress(bytes, format: format)
            #expect(try Zlib.decompress(encoded) == bytes)
        }
        #expect(try Zlib.compress([1, 2, 3], format: .gzip).prefix(2) == [0x1F, 0x8B])
    }

    @Test func decompressRejectsTruncatedAndOversized() throws {
        let encoded = try Zlib.compress(Array(repeating: 1, count: 10_000))
        #expect(throws: Zlib.Failure.self) { try Zlib.decompress(encoded.dropLast(10)) }
        #expect(throws: Zlib.Failure.self) { try Zlib.decompress(encoded, limit: 100) }
    }
}
