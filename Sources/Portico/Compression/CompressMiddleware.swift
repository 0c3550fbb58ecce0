import CoreMetrics
import HTTPTypes
import Logging
import Metrics
import NIOCore

/// gzip for responses the client accepts it for (`Accept-Encoding`, RFC 9110 §12.5.3), like
/// nginx's `gzip on`. A response is compressed when its type is on the list, its body is at
/// least `min_bytes`, it has no content coding yet, its status carries content (not 1xx, 204,
/// 304) and is not a range (206, `Content-Range`), and neither side sent
/// `Cache-Control: no-transform`.
///
/// A compressed response gets `Content-Encoding: gzip`, its new `Content-Length`, a weak `ETag`,
/// no digests and no `Accept-Ranges` (byte ranges of the gzip form are not served). Every
/// response whose coding depends on `Accept-Encoding` — compressed or not — gets
/// `Vary: Accept-Encoding`, so a cache never hands gzip to a client that did not ask for it.
/// When zlib fails, or gzip would not be smaller, the identity response goes out unchanged.
///
/// A streamed response (no `Content-Length`, or a long one) is compressed chunk by chunk as it
/// flows, under the same rules: no `Content-Length`, each chunk flushed so nothing is held
/// back (`GzipStage`). `text/event-stream` is still never compressed.
///
/// Place it outside a cache: the cache stores one identity copy, and every hit is compressed
/// for the client at hand.
public struct CompressMiddleware: Middleware {
    public let config: CompressConfig
    private let settings: Zlib.Settings
    private let metrics: CompressMetrics

    public init(_ config: CompressConfig, metricsFactory: any MetricsFactory = MetricsSystem.factory) {
        self.config = config
        self.settings = config.zlibSettings
        self.metrics = CompressMetrics(factory: metricsFactory)
    }

    public func handle(_ request: GatewayRequest, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
        let choice = AcceptEncoding(fieldValues: request.headerFields[values: .acceptEncoding]).choice
        let requestForbidsTransform = CodingHeaders.forbidsTransform(request.headerFields)
        var response = try await next(request, context)
        let report = await encode(&response, choice: choice, isHead: request.method == .head,
                                  requestForbidsTransform: requestForbidsTransform, route: context.route,
                                  logger: context.logger)
        metrics.record(route: context.route, report.result, bytesIn: report.bytesIn, bytesOut: report.bytesOut)
        return response
    }

    /// What `encode` did, for the metrics.
    struct Report {
        var result: CompressMetrics.Outcome
        var bytesIn = 0
        var bytesOut = 0
    }

    /// Applies the rules in the type's comment to `response`; returns what happened.
    func encode(_ response: inout GatewayResponse, choice: AcceptEncoding.Choice, isHead: Bool,
                requestForbidsTransform: Bool, route: String? = nil, logger: Logger) async -> Report {
        var fields = response.headerFields
        if let coding = fields[.contentEncoding], coding.trimmingWhitespace().lowercased() != "identity" {
            return Report(result: .encoded)
        }
        if requestForbidsTransform || CodingHeaders.forbidsTransform(fields) { return Report(result: .noTransform) }
        let contentType = fields[.contentType]
        let status = response.status.code
        if status == 304 {
            // The 200 this revalidates carried a weak ETag and Vary if it was compressed. The
            // 304 must say the same (RFC 9110 §15.4.5), or a cache freshening its gzip copy with
            // it finds no stored response with that strong validator (RFC 9111 §4.3.4). A weak
            // ETag also still matches an identity copy, so weakening is safe either way.
            if choice == .gzip, contentType.map(config.compresses(contentType:)) ?? true {
                CodingHeaders.weakenETag(&fields)
                CodingHeaders.addVaryAcceptEncoding(&fields)
                response.headerFields = fields
            }
            return Report(result: .status)
        }
        if status < 200 || status == 204 || status == 206 || fields[.contentRange] != nil {
            return Report(result: .status)
        }
        guard let contentType, config.compresses(contentType: contentType) else { return Report(result: .type) }
        // HEAD has no body: its Content-Length says what GET would send.
        let length = isHead ? fields[.contentLength].flatMap { Int($0) } : response.body.count
        if let length, length < config.minBytes { return Report(result: .tooSmall) }

        // From here the coding depends on Accept-Encoding, whichever coding this client gets.
        CodingHeaders.addVaryAcceptEncoding(&fields)
        guard choice == .gzip else {
            response.headerFields = fields
            return Report(result: .notAccepted)
        }
        if isHead {
            // RFC 9110 §9.3.2 asks HEAD for the header fields GET would get, but the gzip
            // Content-Length is only known by compressing a body HEAD does not have, and
            // §8.6 forbids sending a Content-Length that differs from GET's. So HEAD describes
            // the identity representation (its own Content-Length, no Content-Encoding), with
            // the same Vary and the same weak ETag as the GET, so validators agree across
            // methods. nginx does not compress HEAD either.
            CodingHeaders.weakenETag(&fields)
            response.headerFields = fields
            return Report(result: .head)
        }
        guard let input = response.body.buffer else {
            return encodeStream(&response, fields: fields, route: route, logger: logger)
        }
        let compressed: ByteBuffer?
        do throws(Zlib.Failure) {
            compressed = try await gzip(input)
        } catch {
            logger.warning("compression failed; sending the response uncompressed", metadata: [
                "zlib_stage": "\(error.stage)", "zlib_code": "\(error.code)", "zlib_message": "\(error.message ?? "")",
            ])
            response.headerFields = fields
            return Report(result: .error)
        }
        guard let compressed else {
            response.headerFields = fields
            return Report(result: .incompressible)
        }
        fields[.contentEncoding] = "gzip"
        fields[.contentLength] = String(compressed.readableBytes)
        fields[.acceptRanges] = nil
        CodingHeaders.weakenETag(&fields)
        CodingHeaders.dropDigests(&fields)
        response.headerFields = fields
        response.body = Body(compressed)
        return Report(result: .compressed, bytesIn: input.readableBytes, bytesOut: compressed.readableBytes)
    }

    /// A streamed body is compressed as it flows (never buffered to compress it): a `GzipStage`
    /// on its way out, `Content-Length` gone (the gzip length is known only at the end), and
    /// the input and output bytes counted when it ends. Whether gzip is smaller cannot be known
    /// up front, so a stream is always sent gzip once it qualifies.
    private func encodeStream(_ response: inout GatewayResponse, fields: HTTPFields, route: String?,
                              logger: Logger) -> Report {
        var fields = fields
        let stage: GzipStage
        do throws(Zlib.Failure) {
            stage = try GzipStage(settings: settings) { [metrics] bytesIn, bytesOut, _ in
                metrics.countBytes(route: route, bytesIn: bytesIn, bytesOut: bytesOut)
            }
        } catch {
            logger.warning("compression failed; sending the response uncompressed", metadata: [
                "zlib_stage": "\(error.stage)", "zlib_code": "\(error.code)", "zlib_message": "\(error.message ?? "")",
            ])
            response.headerFields = fields
            return Report(result: .error)
        }
        fields[.contentEncoding] = "gzip"
        fields[.contentLength] = nil
        fields[.acceptRanges] = nil
        CodingHeaders.weakenETag(&fields)
        CodingHeaders.dropDigests(&fields)
        response.headerFields = fields
        response.body.append(stage, keepsLength: false)
        // The bytes are counted by the stage, when the body ends.
        return Report(result: .compressed)
    }

    /// The gzip form of `input`, or `nil` when it would not be smaller. The output buffer is
    /// allocated once at less than the input's size, so memory stays bounded by the body limit.
    /// Large bodies are fed in slices with a yield between them, so one big response does not
    /// hold a cooperative thread for its whole compression.
    func gzip(_ input: ByteBuffer) async throws(Zlib.Failure) -> ByteBuffer? {
        let deflater = try Deflater(format: .gzip, settings: settings)
        let limit = input.readableBytes - 1
        guard limit > 0 else { return nil }
        var output = ByteBuffer()
        output.reserveCapacity(min(limit, deflater.bound(input.readableBytes)))
        var offset = 0
        repeat {
            if offset > 0 { await Task.yield() }
            let end = min(offset + Zlib.sliceBytes, input.readableBytes)
            guard try deflater.deflate(input, range: offset..<end, finish: end == input.readableBytes,
                                       into: &output, limit: limit) else { return nil }
            offset = end
        } while offset < input.readableBytes
        return output
    }
}
