/// The instant an upstream exchange must be done by: the request's deadline, or the
/// upstream's own `timeout` if that comes first.
func upstreamDeadline(config: UpstreamConfig, context: RequestContext) -> ContinuousClock.Instant {
    let own = context.clock.now.advanced(by: config.timeout)
    return min(own, context.deadline)
}

/// Runs `operation`, failing with `UpstreamError.timeout` when `deadline` passes on `clock`.
///
/// The operation is cancelled at the deadline; both transports answer cancellation at once
/// (URLSession: the continuation is resumed from the cancellation handler; AsyncHTTPClient
/// cancels the transaction), so leaving the task group does not wait on the network.
func withUpstreamDeadline<T: Sendable>(
    _ deadline: ContinuousClock.Instant, clock: any GatewayClock,
    _ operation: @escaping @Sendable () async throws -> T
) async throws -> T {
    if clock.now >= deadline { throw UpstreamError.timeout }
    return try await race(operation, against: { try await clock.sleep(until: deadline) })
}

/// `operation`'s result, or `UpstreamError.timeout` when `timer` returns first; the loser is cancelled.
func race<T: Sendable>(_ operation: @escaping @Sendable () async throws -> T,
                       against timer: @escaping @Sendable () async throws -> Void) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await operation() }
        group.addTask {
            try await timer()
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else {
            throw UpstreamError.timeout
        }
        return value
    }
}
