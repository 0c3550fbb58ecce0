import Logging
import Synchronization

/// One endpoint's failures and ejections (`outlier_detection`). Its words are written only by an
/// `OutlierDetector` (this file: nothing else can) and only when something changes: a failure, an
/// ejection, the first success after failures. A success on an endpoint that is up writes nothing
/// (it loads the failure count and finds it zero), so the request path writes no word another core
/// writes. It lives in the endpoint's `EndpointState`, so a reload that keeps the endpoint keeps it.
///
/// Instants are nanoseconds since the detector's `origin`; 0 means "never".
struct OutlierRecord: ~Copyable, Sendable {
    fileprivate let consecutiveFailures = Atomic<Int>(0)
    /// Ejected while the clock reads before this. Stored after `ejectionReason` (releasing), so a
    /// reader that sees the instant (acquiring) sees the reason too.
    fileprivate let ejectedUntil = Atomic<Int64>(0)
    /// Ejections in a row (reset by a success after the last one): multiplies `base_ejection`.
    fileprivate let ejectionsInARow = Atomic<Int>(0)
    fileprivate let ejectionReason = Atomic<UInt8>(0)
    fileprivate let ejectionsTotal = Atomic<Int>(0)
    fileprivate let lastFailure = Atomic<UInt8>(0)
    fileprivate let lastFailureAt = Atomic<Int64>(0)

    init() {}

    /// Failures in a row, as the report shows them.
    var failuresInARow: Int { consecutiveFailures.load(ordering: .relaxed) }
    /// Ejections so far.
    var ejections: Int { ejectionsTotal.load(ordering: .relaxed) }
}

/// Passive outlier detection for one upstream: counts each endpoint's failures against it alone,
/// ejects one that keeps failing, lifts the ejection when its time is up (probation) or when it
/// answers well while every endpoint is down, and says what each endpoint is now
/// (`EndpointStatus`), which everything else reads.
///
/// `consecutive_failures` failures in a row eject the endpoint for `base_ejection` × its ejections
/// in a row (at most `OutlierDetectionConfig.maxEjectionMultiplier` times); once that has passed it
/// is on probation: one failure ejects it again at once, one success clears its endpoint.outlier. An
/// ejection that would leave no endpoint up, or eject more than `max_ejection` of them (rounded
/// down), does not happen: such an endpoint stays in rotation, `failing`.
final class OutlierDetector: Sendable {
    let config: OutlierDetectionConfig
    /// The instant the records' times count from (a successor at a reload keeps it, with the records).
    let origin: ContinuousClock.Instant
    private let upstream: String
    private let logger: Logger
    /// Taken to decide an ejection (on a failure past the threshold, never per request), so that
    /// two at once cannot both pass the cap.
    private let ejections = Mutex(())

    init(config: OutlierDetectionConfig, upstream: String, origin: ContinuousClock.Instant, logger: Logger) {
        self.config = config
        self.upstream = upstream
        self.origin = origin
        self.logger = logger
    }

    // MARK: Status

    /// The endpoint's status at `now` (nanoseconds since `origin`): loads only.
    @inline(__always)
    func status(of endpoint: EndpointState, at now: Int64) -> EndpointStatus {
        let until = endpoint.outlier.ejectedUntil.load(ordering: .acquiring)
        if until > now {
            let reason = EndpointFailure(rawValue: endpoint.outlier.ejectionReason.load(ordering: .relaxed)) ?? .connectFailed
            return .ejected(until: instant(until), reason: reason)
        }
        if endpoint.health.current == .unhealthy { return .unhealthy }
        if endpoint.outlier.consecutiveFailures.load(ordering: .relaxed) >= config.consecutiveFailures { return .failing }
        if endpoint.outlier.ejectionsInARow.load(ordering: .relaxed) > 0 { return .probation }
        return .up
    }

    func status(of endpoint: EndpointState, at now: ContinuousClock.Instant) -> EndpointStatus {
        status(of: endpoint, at: moment(now))
    }

    /// The endpoint's last failure and when it was, if it ever failed.
    func lastFailure(of endpoint: EndpointState) -> (kind: EndpointFailure, at: ContinuousClock.Instant)? {
        return EndpointFailure(rawValue: endpoint.outlier.lastFailure.load(ordering: .relaxed)).map {
            ($0, instant(endpoint.outlier.lastFailureAt.load(ordering: .relaxed)))
        }
    }

    // MARK: Outcomes

    /// An exchange with `endpoint` failed as `kind`. `endpoints`: its upstream's endpoints now
    /// (the ejection cap counts them).
    func failed(_ endpoint: EndpointState, _ kind: EndpointFailure, at now: Int64, among endpoints: [EndpointState]) {
        endpoint.metrics.failed(kind)
        endpoint.outlier.lastFailure.store(kind.rawValue, ordering: .relaxed)
        endpoint.outlier.lastFailureAt.store(now, ordering: .relaxed)
        // An exchange that began before the ejection: already dealt with.
        guard endpoint.outlier.ejectedUntil.load(ordering: .relaxed) <= now else { return }
        let failures = endpoint.outlier.consecutiveFailures.wrappingAdd(1, ordering: .relaxed).newValue
        // Past the threshold, or back from an ejection (probation, whatever else it is now).
        if failures >= config.consecutiveFailures || endpoint.outlier.ejectionsInARow.load(ordering: .relaxed) > 0 {
            eject(endpoint, kind, at: now, among: endpoints)
        }
    }

    /// An exchange with `endpoint` went well. `allDown`: it was picked while no endpoint was up.
    func succeeded(_ endpoint: EndpointState, at now: Int64, allDown: Bool) {
        // Loads first: an endpoint that is up writes nothing.
        if endpoint.outlier.consecutiveFailures.load(ordering: .relaxed) != 0 {
            endpoint.outlier.consecutiveFailures.store(0, ordering: .relaxed)
        }
        guard endpoint.outlier.ejectionsInARow.load(ordering: .relaxed) != 0 else { return }
        if endpoint.outlier.ejectedUntil.load(ordering: .relaxed) > now {
            // Picked while all were down, and answered: it takes traffic again at once.
            guard allDown else { return }
            endpoint.outlier.ejectedUntil.store(0, ordering: .relaxed)
        }
        endpoint.outlier.ejectionsInARow.store(0, ordering: .relaxed)
        endpoint.metrics.record(status(of: endpoint, at: now))
    }

    /// Ejects `endpoint` unless the cap forbids it (`max_ejection`, and never the last one up).
    private func eject(_ endpoint: EndpointState, _ kind: EndpointFailure, at now: Int64, among endpoints: [EndpointState]) {
        let ejection: Duration? = ejections.withLock { _ in
            if case .ejected = status(of: endpoint, at: now) { return nil }
            var ejectedNow = 0, upOthers = 0
            for other in endpoints {
                let status = status(of: other, at: now)
                if case .ejected = status {
                    ejectedNow += 1
                } else if other !== endpoint && status.isUp {
                    upOthers += 1
                }
            }
            let allowed = Int((Double(endpoints.count) * config.maxEjection).rounded(.down))
            guard ejectedNow < allowed, upOthers > 0 else { return nil }
            let times = min(endpoint.outlier.ejectionsInARow.load(ordering: .relaxed) + 1, OutlierDetectionConfig.maxEjectionMultiplier)
            let duration = config.baseEjection * times
            endpoint.outlier.ejectionsInARow.store(times, ordering: .relaxed)
            endpoint.outlier.ejectionReason.store(kind.rawValue, ordering: .relaxed)
            endpoint.outlier.consecutiveFailures.store(0, ordering: .relaxed)
            endpoint.outlier.ejectionsTotal.wrappingAdd(1, ordering: .relaxed)
            endpoint.outlier.ejectedUntil.store(now + Self.nanoseconds(duration), ordering: .releasing)
            return duration
        }
        guard let ejection else { return }
        endpoint.metrics.ejections.increment()
        endpoint.metrics.record(status(of: endpoint, at: now))
        logger.warning("upstream endpoint ejected", metadata: [
            "upstream": "\(upstream)", "endpoint": "\(endpoint.address)", "reason": "\(kind.name)",
            "duration": "\(ejection)",
        ])
    }

    // MARK: Time

    /// Nanoseconds from `origin` to `instant`: the records' unit.
    @inline(__always)
    func moment(_ instant: ContinuousClock.Instant) -> Int64 {
        Self.nanoseconds(origin.duration(to: instant))
    }

    func instant(_ moment: Int64) -> ContinuousClock.Instant {
        origin.advanced(by: .nanoseconds(moment))
    }

    static func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}
