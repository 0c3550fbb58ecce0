import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import HTTPTypes
import Logging
import NIOCore

/// The `urlsession` transport: one URLSession per upstream, driven through `URLSessionBridge`
/// so redirects, auth challenges, body limits and deadlines are ours.
///
/// What FoundationNetworking (libcurl underneath) does and how this transport copes
/// (measured on Swift 6.3.1 / curl 7.88.1):
/// - It adds `Accept`, `Accept-Encoding`, `User-Agent`, `Accept-Language`, `Connection:
///   keep-alive` (and a POST `Content-Type`) unless set. A value of a single space makes curl
///   drop the header entirely (an empty string is sent as an empty header), so every such
///   header the client did not send is set to `" "`: the upstream sees the client's headers.
/// - Request headers are a case-insensitive dictionary: duplicates are joined with `, `
///   (`Cookie` with `; `), and their order is lost.
/// - It decodes gzip/deflate/br/zstd bodies (stacked too) whatever `Accept-Encoding` says and
///   keeps `Content-Encoding`/`Content-Length`; an unknown coding fails the task. See
///   `restoreContentCoding`.
/// - Duplicate response headers of the same spelling are joined with `, `, and header order is
///   lost; `Set-Cookie` is split again heuristically (see `splitSetCookie`).
/// - curl removes dot segments from the path (`/a/../b` → `/b`); the query is sent verbatim.
/// - Timeouts are whole seconds: the deadline is enforced here instead. URLSession's request
///   timeout counts silence between reads (measured), so a streamed response gets one above its
///   `stream_idle_timeout`; the resource timeout was not seen to cut anything.
/// - Streaming (measured): `suspend()` on a running data task closes the connection and
///   `resume()` sends the request again, so there is no backpressure on a response: a streamed
///   body is queued as it comes, at most `max_response_bytes` per response while the client
///   reads slowly. An upload cannot stream either: an `InputStream` body is read on the one
///   queue all sessions share (a read that waits for the client stalls every other upstream
///   call) and a read with nothing available ends the body early; a streamed request body is
///   therefore read whole first, up to `maxRequestBodyBytes` (413 beyond).
/// - There is no separate connect timeout: `connect_timeout` is not applied by this transport.
/// - A stale keep-alive connection (issue #45): libcurl sends a request that got no byte back on
///   a reused connection again on a new one, whatever its method (`Curl_retry_request`), so a
///   GET the upstream hung up on is answered. One with a body is not: libcurl asks for it to be
///   rewound, FoundationNetworking does not manage it (giving or refusing a new body stream in
///   `needNewBodyStream` changes nothing), and the task stalls until Portico's deadline: 504
///   (measured: `StaleConnectionTests`). Nothing of that is reachable from here, and nothing of it
///   is counted in `portico_upstream_stale_retries_total`, which is `nio`'s (`StaleConnection`).
/// - `https://` upstreams are verified against libcurl's system trust store (host name and
///   chain); a TLS failure arrives as `URLError(-1)` with curl's message. There is no server
///   trust or client-certificate challenge on Linux, so `tls:` settings are refused at load.
final class URLSessionUpstream: UpstreamClient {
    let config: UpstreamConfig
    private let target: UpstreamTarget
    private let bridge: URLSessionBridge
    private let logger: Logger

    init(config: UpstreamConfig, logger: Logger) {
        self.config = config
        self.target = UpstreamTarget(baseURL: config.url)
        self.logger = logger
        // A backstop behind Portico's own deadline, which enforces sub-second timeouts.
        bridge = URLSessionBridge(backstopSeconds: Int(config.timeout.components.seconds) + 2,
                                  maxConnectionsPerHost: config.maxConnections)
    }

    /// A streamed upload over what this transport holds (`maxRequestBodyBytes`): found as it
    /// flows, or refused at the head by the gateway when its declared length says so.
    static func uploadTooLarge(limit: Int, declared: Int? = nil) -> GatewayError {
        let size = declared.map { "request body of \($0) bytes is larger than \(limit)" } ?? "request body larger than \(limit) bytes"
        return GatewayError(.payloadTooLarge, message: size + ": the urlsession transport reads a streamed body whole "
                            + "before sending it; use transport: nio to stream it")
    }

    func send(_ request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        var request = request
        if request.body.isStreamed {
            // No streamed uploads on this transport (see the type's notes): read it whole first.
            let limit = config.maxRequestBodyBytes
            request.body = Body(try await request.body.collect(upTo: limit, tooLarge: Self.uploadTooLarge(limit: limit)))
        }
        var urlRequest = try makeURLRequest(request)
        // URLSession's own timeout counts silence between reads: above the stream's idle limit.
        urlRequest.timeoutInterval = max(urlRequest.timeoutInterval, TimeInterval(wholeSecondsRoundedUp(context.streamIdleTimeout) + 2))
        let deadline = upstreamDeadline(config: config, context: context)
        let limit = config.maxResponseBytes
        let streaming = streaming(for: request.method, context: context)
        do {
            // The deadline bounds the wait for the head; a streamed body has its watchdog.
            let head = try await withUpstreamDeadline(deadline, clock: context.clock) { [bridge, urlRequest] in
                do {
                    return try await bridge.open(urlRequest, limit: limit, streaming: streaming)
                } catch let failure as URLSessionBridge.Failure {
                    throw Self.upstreamError(failure, limit: limit)
                }
            }
            switch head {
            case .whole(let received):
                return try makeResponse(received, method: request.method)
            case .streaming(let response, let stream):
                return try makeStreamedResponse(response, stream: stream)
            }
        } catch let error as UpstreamError {
            let error = error.reaching(target.authority)
            error.log(upstream: config.name, to: context.logger)
            throw error.gatewayError(upstream: config.name)
        }
    }

    func shutdown() async {
        bridge.shutdown()
    }

    func retire() async {
        bridge.shutdown(finishingTasks: true)
    }

    /// When and how a response streams: a body that declares more than `Body.bufferedLimit`
    /// bytes or no length at all; failures after the head as the client's stream sees them.
    private func streaming(for method: HTTPRequest.Method, context: RequestContext) -> URLSessionBridge.Streaming {
        // `context.logger` builds a logger with the request's metadata: only when a failure is logged.
        let (name, authority, limit) = (config.name, target.authority, config.maxResponseBytes)
        return URLSessionBridge.Streaming(
            framing: { Self.framing($0, method: method) },
            clock: context.clock, idle: context.streamIdleTimeout, maxDuration: context.maxStreamDuration,
            failure: { failure in
                let error = Self.upstreamError(failure, limit: limit).reaching(authority)
                error.log(upstream: name, to: context.logger)
                return error.gatewayError(upstream: name)
            })
    }

    /// Whole or streamed, from the head. Bodiless answers, redirects and 401s (whose `Basic`
    /// challenge comes after the body, see `URLSessionBridge`) are read whole, as is any body
    /// declaring up to `Body.bufferedLimit` bytes. A body URLSession decodes (`Content-Encoding`)
    /// streams without a length: the declared one counts encoded bytes.
    static func framing(_ response: HTTPURLResponse, method: HTTPRequest.Method) -> URLSessionBridge.Framing {
        let status = response.statusCode
        guard method != .head, (200...599).contains(status), !(300...399).contains(status), status != 204, status != 401
        else { return .whole }
        let declared = response.value(forHTTPHeaderField: "Content-Length").flatMap { Int($0.trimmingWhitespace()) }
        if let declared, declared <= Body.bufferedLimit { return .whole }
        return .stream(length: URLSessionBridge.Transfer.unencodedLength(response))
    }

    // MARK: Request

    /// Headers FoundationNetworking or curl add when absent; `" "` makes curl send none.
    static let suppressedDefaults = ["Accept", "Accept-Encoding", "User-Agent", "Accept-Language",
                                     "Content-Type", "Connection", "Expect"]

    func makeURLRequest(_ request: GatewayRequest) throws -> URLRequest {
        let urlString = target.urlString(for: request.target)
        // Built from the string: the query reaches the wire byte for byte (checked by tests).
        guard let url = URL(string: urlString) else {
            throw GatewayError.badRequest("request target cannot be forwarded")
        }
        var urlRequest = URLRequest(url: url, cachePolicy: .reloadIgnoringLocalCacheData, timeoutInterval: bridge.backstop)
        urlRequest.httpMethod = request.method.rawValue
        urlRequest.httpShouldHandleCookies = false

        // One assignment: `setValue(_:forHTTPHeaderField:)` searches the fields case-insensitively
        // on every call (measured: 3 % of the path's CPU).
        var headers = HeaderDictionary(capacity: request.headerFields.count + 4)
        ForwardingHeaders.forEachUpstreamField(
            request.headerFields, authority: request.head.authority, clientAddress: request.clientAddress,
            upstreamHost: config.sentHost(target), preserveHost: config.preserveHost, proto: request.head.scheme ?? "http"
        ) { name, value in headers.add(name, value) }
        urlRequest.allHTTPHeaderFields = headers.finished()
        if let buffer = request.body.buffer, buffer.readableBytes > 0 {
            urlRequest.httpBody = Data(buffer.readableBytesView)
        }
        return urlRequest
    }

    /// URLRequest headers are a dictionary: join duplicates (`Cookie` with `; ` as RFC 6265
    /// asks, the rest with `, `) under the first spelling seen. Framing is curl's job. Defaults
    /// curl would add (`suppressedDefaults`) are set to `" "` when absent, so it sends none.
    static func headerDictionary(_ fields: HTTPFields) -> [String: String] {
        var headers = HeaderDictionary(capacity: fields.count)
        for field in fields { headers.add(field.name, field.value) }
        return headers.finished()
    }

    /// Builds `headerDictionary`'s result one field at a time.
    struct HeaderDictionary {
        private var spelling: [String: String] = [:]  // canonical name → first spelling
        private var headers: [String: String] = [:]

        init(capacity: Int) {
            headers.reserveCapacity(capacity + URLSessionUpstream.suppressedDefaults.count)
        }

        mutating func add(_ name: HTTPField.Name, _ value: String) {
            let key = name.canonicalName
            if key == "content-length" || key == "transfer-encoding" || key == "expect" { return }
            if let first = spelling[key] {
                headers[first]! += (key == "cookie" ? "; " : ", ") + value
            } else {
                spelling[key] = name.rawName
                headers[name.rawName] = value
            }
        }

        func finished() -> [String: String] {
            var headers = headers
            for name in URLSessionUpstream.suppressedDefaults where spelling[name.lowercased()] == nil {
                headers[name] = " "
            }
            return headers
        }
    }

    // MARK: Response

    func makeResponse(_ received: URLSessionBridge.Received, method: HTTPRequest.Method) throws -> GatewayResponse {
        let http = received.response
        let status = try status(http)
        var fields = Self.fields(http)
        var body = received.body
        let hasBody = HTTPSyntax.responseHasBody(status: status.code, toHead: method == .head)
        try Self.restoreContentCoding(&fields, body: &body, hasBody: hasBody)
        if !hasBody { body.clear() }
        return GatewayResponse(status: status, headerFields: ForwardingHeaders.clientResponseFields(fields),
                               body: Body(body))
    }

    func makeStreamedResponse(_ http: HTTPURLResponse, stream: BodyStream) throws -> GatewayResponse {
        let status = try status(http)
        var fields = Self.fields(http)
        Self.restoreContentCoding(streamed: &fields)
        return GatewayResponse(status: status, headerFields: ForwardingHeaders.clientResponseFields(fields),
                               body: Body(stream: stream))
    }

    private func status(_ http: HTTPURLResponse) throws -> HTTPResponse.Status {
        guard (100...999).contains(http.statusCode) else {
            throw UpstreamError.protocolError("invalid status \(http.statusCode)").gatewayError(upstream: config.name)
        }
        return HTTPResponse.Status(code: http.statusCode)
    }

    /// The response's header fields (`Set-Cookie` split again).
    private static func fields(_ http: HTTPURLResponse) -> HTTPFields {
        var fields = HTTPFields()
        // Sorted so the order at least does not vary from run to run: URLSession lost the original.
        // By the names' lower-cased form, made once per field (not twice per comparison).
        let all = http.allHeaderFields
        var pairs: [(HTTPField.Name, String)] = []
        pairs.reserveCapacity(all.count)
        for (key, value) in all {
            guard let name = key as? String, let value = value as? String,
                  let fieldName = HTTPField.Name.received(name) else { continue }
            pairs.append((fieldName, value))
        }
        pairs.sort { $0.0.canonicalName < $1.0.canonicalName }
        fields.reserveCapacity(pairs.count + 1)
        for (fieldName, value) in pairs {
            if fieldName == .setCookie {
                for cookie in Self.splitSetCookie(value) { fields.append(HTTPField(name: fieldName, value: cookie)) }
            } else {
                fields.append(HTTPField(name: fieldName, value: value))
            }
        }
        return fields
    }

    /// Content codings curl decodes on its own (all of them, also stacked).
    static let decodedCodings: Set<String> = ["gzip", "x-gzip", "deflate", "br", "zstd"]

    /// The response's content codings, lower-cased, when it has some and curl decoded them all
    /// (URLSession then hands over the decoded body); `nil` otherwise.
    private static func decodedCodings(of fields: HTTPFields) -> [String]? {
        // The scan first: a lookup by name builds an index of all the fields, and most responses have no coding.
        guard fields.contains(where: { $0.name == .contentEncoding }), let encoding = fields[.contentEncoding] else { return nil }
        let codings = HTTPList(encoding).map { $0.text.lowercased() }
        guard !codings.isEmpty, codings.allSatisfy({ decodedCodings.contains($0) }) else { return nil }
        return codings
    }

    /// URLSession hands over a decoded body with the upstream's `Content-Encoding` and
    /// `Content-Length`. Make them agree again:
    /// - a single `gzip`/`deflate` coding is re-applied with zlib, so the client still gets the
    ///   coding it negotiated (and a cache keyed on `Vary: Accept-Encoding` stores the right
    ///   variant); the bytes differ from the upstream's, so a strong `ETag` becomes weak and
    ///   digests of the encoded bytes are dropped;
    /// - `br`, `zstd` or stacked codings cannot be re-applied here: the coding is dropped and
    ///   the identity body is sent (identity is always acceptable), also with a weak `ETag`.
    /// `Content-Length` is set to the bytes actually sent. Bodiless responses (HEAD, 204, 304)
    /// keep their length; their `ETag` is weakened the same way so validators stay consistent.
    static func restoreContentCoding(_ fields: inout HTTPFields, body: inout ByteBuffer, hasBody: Bool) throws {
        guard let codings = decodedCodings(of: fields) else { return }

        CodingHeaders.weakenETag(&fields)
        CodingHeaders.dropDigests(&fields)
        guard hasBody else { return }

        let format: Zlib.Format? = switch codings {
        case ["gzip"], ["x-gzip"]: .gzip
        case ["deflate"]: .zlib
        default: nil
        }
        if let format {
            body = try Zlib.compress(body, format: format)
        } else {
            fields[.contentEncoding] = nil
        }
        fields[.contentLength] = String(body.readableBytes)
    }

    /// The same for a streamed body, which URLSession decodes as it comes: it goes out decoded,
    /// as identity, without `Content-Encoding` and `Content-Length` (the length counted encoded
    /// bytes), with a weak `ETag` and no digests. Re-encoding would cost a compressor (and a
    /// flush per chunk, so events are not held back) for every byte and still not give the
    /// upstream's bytes; identity is acceptable to every client, and the `compress` middleware
    /// applies the client's coding where one is configured. An undecoded body keeps its
    /// `Content-Length`.
    static func restoreContentCoding(streamed fields: inout HTTPFields) {
        guard decodedCodings(of: fields) != nil else { return }
        CodingHeaders.weakenETag(&fields)
        CodingHeaders.dropDigests(&fields)
        fields[.contentEncoding] = nil
        fields[.contentLength] = nil
    }

    /// Splits a `Set-Cookie` value URLSession joined with `, `.
    ///
    /// A comma starts a new cookie only when what follows is `token=` before any `;`, `,` or
    /// space: `Expires=Wed, 21 Oct 2015 …` never matches (a date has a space before any `=`),
    /// and cookie values cannot contain commas (RFC 6265 cookie-octet). It can still split a
    /// cookie wrongly when an attribute value other than `Expires` contains `, name=`.
    static func splitSetCookie(_ joined: String) -> [String] {
        let bytes = Array(joined.utf8)
        var cookies: [String] = []
        var start = 0
        var index = 0
        while index < bytes.count {
            if bytes[index] == UInt8(ascii: ","), startsCookie(bytes, at: index + 1) {
                cookies.append(String(decoding: bytes[start..<index], as: UTF8.self).trimmingWhitespace())
                start = index + 1
            }
            index += 1
        }
        cookies.append(String(decoding: bytes[start...], as: UTF8.self).trimmingWhitespace())
        return cookies.filter { !$0.isEmpty }
    }

    private static func startsCookie(_ bytes: [UInt8], at offset: Int) -> Bool {
        var index = offset
        while index < bytes.count, bytes[index] == UInt8(ascii: " ") || bytes[index] == UInt8(ascii: "\t") { index += 1 }
        let tokenStart = index
        while index < bytes.count {
            switch bytes[index] {
            case UInt8(ascii: "="): return index > tokenStart
            case UInt8(ascii: ";"), UInt8(ascii: ","), UInt8(ascii: " "), UInt8(ascii: "\t"): return false
            default: index += 1
            }
        }
        return false
    }
}

extension URLSessionUpstream {
    /// What the bridge reports, as an upstream failure.
    static func upstreamError(_ failure: URLSessionBridge.Failure, limit: Int) -> UpstreamError {
        switch failure {
        case .tooLarge(let limit): .responseTooLarge(limit: limit)
        case .challengeWithoutResponse: .protocolError("authentication challenge without a response")
        case .noResponse: .protocolError("no response")
        case .truncated: .connectionClosed("closed before the body was complete")
        case .shutDown: .connectFailed("the upstream client was shut down")
        case .transport(let error, let hadResponse): classify(error, hadResponse: hadResponse, limit: limit)
        }
    }

    /// URLError → UpstreamError. Only the code is kept, in words: descriptions carry the URL
    /// (and its query).
    static func classify(_ error: any Error, hadResponse: Bool, limit: Int) -> UpstreamError {
        guard let urlError = error as? URLError else {
            return hadResponse ? .connectionClosed("transport failure") : .connectFailed("transport failure")
        }
        let detail = NetworkFailure.describe(urlError.code)
        // On Linux a TLS failure is URLError -1 with curl's message; the message names no URL.
        if !hadResponse, let tls = TLSFailure.describe(curlMessage: urlError.localizedDescription) {
            return .tls(tls)
        }
        switch urlError.code {
        case .timedOut:
            return .timeout
        case .cannotConnectToHost, .cannotFindHost, .dnsLookupFailed, .notConnectedToInternet, .badURL, .unsupportedURL:
            return .connectFailed(detail)
        case .secureConnectionFailed, .serverCertificateUntrusted, .serverCertificateHasBadDate,
             .serverCertificateNotYetValid, .serverCertificateHasUnknownRoot, .clientCertificateRejected,
             .clientCertificateRequired:
            return .tls(detail)
        case .badServerResponse, .cannotParseResponse, .cannotDecodeRawData, .cannotDecodeContentData:
            return .protocolError(detail)
        case .dataLengthExceedsMaximum:
            return .responseTooLarge(limit: limit)
        case .unknown where hadResponse:
            // e.g. curl's "Unrecognized content encoding type".
            return .protocolError(detail)
        default:
            return hadResponse ? .connectionClosed(detail) : .connectFailed(detail)
        }
    }
}
