/// What an endpoint is to its upstream now: the one meaning of its outlier record and its health
/// verdict together. `OutlierDetector.status(of:at:)` is the only place it is worked out; picking,
/// the ejection cap, `GET /upstreams`, the `ejected` gauge and `explain` read it.
///
/// When several apply, the first in this order wins: ejected, unhealthy, failing, probation, up.
public enum EndpointStatus: Sendable, Equatable, CustomStringConvertible {
    /// Takes traffic and is not failing.
    case up
    /// Failed `consecutive_failures` times in a row yet not ejected (the ejection cap kept it in
    /// rotation): it takes traffic but counts as down.
    case failing
    /// Out of rotation until `until` (on the upstream's clock) because of `reason`.
    case ejected(until: ContinuousClock.Instant, reason: EndpointFailure)
    /// Its ejection is over and it takes traffic again, counted as up: one failure ejects it
    /// again at once (for longer), one success makes it `up`.
    case probation
    /// Its health check failed: no traffic until checks pass again.
    case unhealthy

    /// Picked with the others: up, on probation, or failing (kept by the cap). While no endpoint
    /// is up, every endpoint is picked from, whatever its status.
    @inline(__always)
    public var takesTraffic: Bool {
        switch self {
        case .up, .probation, .failing: true
        case .ejected, .unhealthy: false
        }
    }

    /// Counts as up: while none is, attempts are spread over every endpoint ("all down").
    @inline(__always)
    public var isUp: Bool {
        switch self {
        case .up, .probation: true
        case .failing, .ejected, .unhealthy: false
        }
    }

    /// The word `GET /upstreams`, the dashboard and `explain` show.
    public var name: String {
        switch self {
        case .up: "up"
        case .failing: "failing"
        case .ejected: "ejected"
        case .probation: "probation"
        case .unhealthy: "unhealthy"
        }
    }

    public var description: String {
        if case .ejected(_, let reason) = self { return "ejected (\(reason.name))" }
        return name
    }
}
