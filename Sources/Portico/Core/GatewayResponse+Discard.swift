extension GatewayResponse {
    /// Gives up a response that will not be sent (a retry replaces it, a 401 is replayed): a
    /// streamed body is cancelled at once, so its upstream connection is released now rather
    /// than when the last copy happens to be dropped, and its stages hear how it ended. A
    /// buffered body needs nothing.
    public func discardBody(_ reason: @autoclosure () -> GatewayError = .clientClosedRequest()) {
        guard body.isStreamed else { return }
        body.reader().close(reason())
    }
}
