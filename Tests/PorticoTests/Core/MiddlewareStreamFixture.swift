import HTTPTypes
import NIOCore
import Portico

/// Streamed bodies for middleware tests: a body and the writer a test feeds it from, and
/// reading one to its end.
enum MiddlewareStreamFixture {
    static func body(length: Int? = nil) -> (body: Body, writer: BodyWriter) {
        let (stream, writer) = BodyStream.makeStream(length: length)
        return (Body(stream: stream), writer)
    }

    /// A response with a streamed body.
    static func response(_ status: Int = 200, headers: [(String, String)] = [],
                         length: Int? = nil) -> (response: GatewayResponse, writer: BodyWriter) {
        var fields = HTTPFields()
        for (name, value) in headers { fields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
        let (body, writer) = body(length: length)
        return (GatewayResponse(status: HTTPResponse.Status(code: status), headerFields: fields, body: body), writer)
    }

    /// Every chunk `reader` gives until the end.
    static func rest(of reader: BodyReader) async throws -> [UInt8] {
        var bytes: [UInt8] = []
        while let chunk = try await reader.next() { bytes += chunk.readableBytesView }
        return bytes
    }

    static func buffer(_ text: String) -> ByteBuffer { ByteBuffer(string: text) }
}
