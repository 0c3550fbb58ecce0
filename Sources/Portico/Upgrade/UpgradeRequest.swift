import HTTPTypes

/// Whether a request asks to switch protocols (RFC 9110 §7.8): a GET over HTTP/1.1 whose
/// `Connection` lists `upgrade` and whose `Upgrade` names one protocol. What it names is
/// honoured only on a route that opted in to it (`RouteConfig.upgrade`); anywhere else the
/// request goes on as a plain one, `Upgrade` dropped with the other hop-by-hop fields.
enum UpgradeRequest {
    /// The protocol asked for, lower-cased (`websocket`), or `nil`.
    static func protocolAsked(_ request: GatewayRequest) -> String? {
        guard request.method == .get, request.version == "HTTP/1.1" else { return nil }
        let fields = request.headerFields
        let asksUpgrade = fields[values: .connection].contains { value in
            HTTPList(value).contains { $0.text.lowercased() == "upgrade" }
        }
        guard asksUpgrade else { return nil }
        let offers = fields[values: .upgrade]
        // One protocol, without a version suffix we would have to honour (`websocket`, not `h2c, websocket`).
        guard offers.count == 1, let offer = offers.first else { return nil }
        let token = offer.trimmingWhitespace().lowercased()
        guard !token.isEmpty, !token.contains(","), HTTPSyntax.isToken(token) else { return nil }
        return token
    }
}
