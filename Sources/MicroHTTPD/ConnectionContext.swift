import CMicroHTTPD

/// State of one client connection, created and destroyed by libmicrohttpd's connection
/// notifications (so it is released however the connection ends). Only ever touched on the
/// libmicrohttpd thread that owns the connection, so it needs no lock and is not `Sendable`.
final class ConnectionContext {
    /// The request being read, from its request line on.
    var request: RequestInProgress?
    /// Set from suspension until the response is queued (or the request is abandoned).
    var pending: PendingResponse?
    let clientAddress: String

    init(clientAddress: String) {
        self.clientAddress = clientAddress
    }
}

/// A request while its head and body arrive.
final class RequestInProgress {
    let target: String
    let startedAt: ContinuousClock.Instant
    var headersSeen = false
    var headers: [(name: String, value: String)] = []
    var headBytes = 0
    var body: [UInt8] = []

    init(target: String, startedAt: ContinuousClock.Instant) {
        self.target = target
        self.startedAt = startedAt
    }
}
