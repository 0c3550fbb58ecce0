import Foundation
import NIOCore
import Portico

/// What a `TestUpstream` hears and says: a request as it arrived, a scripted response, the echo
/// body (in a file of their own: the server's serving code is TestUpstream.swift).
extension TestUpstream {
    /// A request as received: raw target, ordered headers with duplicates, body bytes.
    public struct Request: Sendable {
        public var method: String
        /// The request target exactly as sent (path and query, not decoded).
        public var target: String
        public var version: String
        public var headers: [(name: String, value: String)]
        public var body: [UInt8]
        /// The connection it came on: 1, 2, … in order of accepting.
        public var connection: Int = 0

        public var path: String {
            target.firstIndex(of: "?").map { String(target[..<$0]) } ?? target
        }
        public var query: String? {
            target.firstIndex(of: "?").map { String(target[target.index(after: $0)...]) }
        }
        /// All values of a header, in order (name case-insensitive).
        public func values(_ name: String) -> [String] {
            headers.filter { $0.name.lowercased() == name.lowercased() }.map(\.value)
        }
    }

    /// What to send back.
    public struct Response: Sendable {
        public enum Ending: Sendable {
            /// Head and body as given (a `Content-Length` is added unless one is present).
            case complete
            /// Declare `declaredLength` bytes, send the body, then close the connection (HTTP/2:
            /// reset the stream, `RST_STREAM(CANCEL)`).
            case closeAfterBody(declaredLength: Int)
            /// Never answer (the connection stays open until the client leaves or shutdown).
            case never
            /// Never answer; when the client closes the connection (HTTP/2: resets the stream),
            /// count it in `abandoned` (a hedge's loser, a cancelled exchange).
            case untilClientCloses
            /// Send the head, then each piece `body` yields as it comes (chunked, unless the
            /// headers declare a `Content-Length`), then end as `end` says.
            case streamed(AsyncStream<[UInt8]>, end: StreamEnd)
        }

        /// How a streamed body ends.
        public enum StreamEnd: Sendable {
            /// The terminating chunk (or nothing more, with a declared length), keep-alive.
            case complete
            /// Close the connection: no terminating chunk (HTTP/2: reset the stream, no END_STREAM).
            case close
        }

        public var status: Int
        public var reason: String?
        /// Sent in order; duplicates allowed.
        public var headers: [(name: String, value: String)]
        public var body: [UInt8]
        public var ending: Ending = .complete
        /// Wait this long before answering.
        public var delay: Duration?

        public init(status: Int = 200, reason: String? = nil, headers: [(name: String, value: String)] = [],
                    body: [UInt8] = []) {
            self.status = status
            self.reason = reason
            self.headers = headers
            self.body = body
        }

        public init(status: Int = 200, headers: [(name: String, value: String)] = [], body: String) {
            self.init(status: status, headers: headers, body: Array(body.utf8))
        }

        public static func text(_ text: String, status: Int = 200) -> Response {
            Response(status: status, headers: [("Content-Type", "text/plain")], body: text)
        }

        /// JSON describing the request (see `Echo`).
        public static func echo(_ request: Request) -> Response {
            let echo = Echo(request)
            let data = (try? JSONEncoder().encode(echo)) ?? Data()
            return Response(status: 200, headers: [("Content-Type", "application/json")], body: Array(data))
        }

        /// `body` gzip-encoded with `Content-Encoding: gzip` (and the given extra headers).
        public static func gzip(_ body: [UInt8], headers: [(name: String, value: String)] = []) -> Response {
            let encoded = (try? Zlib.compress(body, format: .gzip)) ?? []
            return Response(status: 200, headers: [("Content-Encoding", "gzip")] + headers, body: encoded)
        }

        public static func redirect(_ status: Int, location: String) -> Response {
            Response(status: status, headers: [("Location", location)], body: "moved\n")
        }

        public static var noContent: Response { Response(status: 204) }

        public static func notModified(etag: String) -> Response {
            Response(status: 304, headers: [("ETag", etag)])
        }

        /// `401` with `WWW-Authenticate: Basic realm="x"` and a small body.
        public static func basicChallenge(realm: String = "x") -> Response {
            Response(status: 401, headers: [("WWW-Authenticate", "Basic realm=\"\(realm)\""),
                                            ("Content-Type", "text/plain")], body: "unauthorized\n")
        }

        /// Declares `declaredLength` bytes, sends `body` (shorter), then closes the connection.
        public static func truncated(declaredLength: Int, body: [UInt8]) -> Response {
            var response = Response(status: 200, headers: [("Content-Type", "application/octet-stream")], body: body)
            response.ending = .closeAfterBody(declaredLength: declaredLength)
            return response
        }

        public static var never: Response {
            var response = Response()
            response.ending = .never
            return response
        }

        /// No answer until the client closes the connection (see `abandoned`).
        public static var untilClientCloses: Response {
            var response = Response()
            response.ending = .untilClientCloses
            return response
        }

        /// A response whose body is sent piece by piece as `body` yields: chunked unless
        /// `headers` declare a `Content-Length`.
        public static func streamed(status: Int = 200, headers: [(name: String, value: String)] = [],
                                    _ body: AsyncStream<[UInt8]>, end: StreamEnd = .complete) -> Response {
            var response = Response(status: status, headers: headers)
            response.ending = .streamed(body, end: end)
            return response
        }

        public func delayed(by duration: Duration) -> Response {
            var copy = self
            copy.delay = duration
            return copy
        }
    }

    /// The echo body: `{"method", "target", "version", "headers": [[name, value], …], "body": base64}`.
    public struct Echo: Codable, Sendable {
        public var method: String
        public var target: String
        public var version: String
        public var headers: [[String]]
        public var body: String

        public init(_ request: Request) {
            method = request.method
            target = request.target
            version = request.version
            headers = request.headers.map { [$0.name, $0.value] }
            body = Data(request.body).base64EncodedString()
        }

        public static func decode(_ bytes: some Sequence<UInt8>) throws -> Echo {
            try JSONDecoder().decode(Echo.self, from: Data(bytes))
        }

        public var bodyBytes: [UInt8] { Array(Data(base64Encoded: body) ?? Data()) }

        /// All values of a header, in order (name case-insensitive).
        public func values(_ name: String) -> [String] {
            headers.filter { $0.first?.lowercased() == name.lowercased() }.map { $0.count > 1 ? $0[1] : "" }
        }

        /// Header names in order, lowercased.
        public var headerNames: [String] { headers.compactMap { $0.first?.lowercased() } }
    }
}
