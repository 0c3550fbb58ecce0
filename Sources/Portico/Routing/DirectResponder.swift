import HTTPTypes

/// A `direct:` route's endpoint.
public struct DirectResponder: Responder {
    public let response: GatewayResponse

    public init(status: Int, headers: [(String, String)], body: String) {
        var fields = HTTPFields()
        for (name, value) in headers {
            if let fieldName = HTTPField.Name(name) { fields.append(HTTPField(name: fieldName, value: value)) }
        }
        response = GatewayResponse(status: HTTPResponse.Status(code: status), headerFields: fields, body: Body(string: body))
    }

    public func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        response
    }

    public func respondImmediately(to request: GatewayRequest, context: RequestContext) throws -> GatewayResponse? {
        response
    }

    public var answersImmediately: Bool { true }
}
