import CoreMetrics
import HTTPTypes
import Metrics

/// The gateway's own request metrics, recorded for every request outside the chain.
/// Handles are made once per label set and kept per shard (`HandleCache`): a request does one
/// dictionary lookup in its thread's shard and writes its thread's cells, never a lock or a
/// line another thread writes. Labels stay bounded: route names come from configuration
/// (unmatched requests are `route=""`), non-standard methods are `OTHER`, codes are 100–599.
public final class GatewayMetrics: Sendable {
    struct Key: Hashable, Sendable {
        var route: String
        var method: String
        var code: Int
    }

    struct Handles: Sendable {
        var requests: any CounterHandler
        var duration: any TimerHandler
    }

    /// What one shard writes of `Handles`.
    struct LocalHandles {
        var requests: CounterCell
        var duration: TimerRecorder
    }

    private let handles: HandleCache<Key, Handles, LocalHandles>
    /// `portico_time_to_first_byte_seconds`, per route.
    private let firstByteTimers: HandleCache<String, any TimerHandler, TimerRecorder>
    private let inFlight: Meter
    /// `portico_open_streams`: streamed responses whose body is still flowing to the client.
    private let openStreams: Meter
    private let reloads: LabelledCounters
    private let overloads: LabelledCounters
    /// Upgraded (WebSocket) sessions: open per route, bytes each way, closes by reason.
    let upgrades: UpgradeMetrics

    public static let requestDurationBuckets: [Duration] = [
        .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2), .milliseconds(5),
        .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250),
        .milliseconds(500), .seconds(1), .milliseconds(2500), .seconds(5), .seconds(10), .seconds(30), .seconds(60),
    ]

    public init(factory: any MetricsFactory = MetricsSystem.factory) {
        handles = HandleCache(make: { key in
            let dimensions = [("route", key.route), ("method", key.method)]
            return Handles(
                requests: factory.makeCounter(label: "portico_requests_total",
                                              dimensions: dimensions + [("code", String(key.code))]),
                duration: factory.makeTimer(label: "portico_request_duration_seconds", dimensions: dimensions))
        }, localize: { handles, shard in
            LocalHandles(requests: CounterCell(handles.requests, shard: shard),
                         duration: TimerRecorder(handles.duration, shard: shard))
        })
        firstByteTimers = HandleCache(make: { route in
            factory.makeTimer(label: "portico_time_to_first_byte_seconds", dimensions: [("route", route)])
        }, localize: TimerRecorder.init)
        inFlight = Meter(label: "portico_in_flight_requests", dimensions: [], factory: factory)
        openStreams = Meter(label: "portico_open_streams", dimensions: [], factory: factory)
        reloads = LabelledCounters("portico_config_reloads_total", factory: factory)
        overloads = LabelledCounters("portico_overloaded_requests_total", factory: factory)
        upgrades = UpgradeMetrics(factory: factory)
        Gauge(label: "portico_build_info", dimensions: [("version", PorticoVersion.string)], factory: factory).record(1)
    }

    /// The method's label: itself when standard, `OTHER` otherwise (a switch, not a shared set
    /// whose storage every thread would retain).
    static func methodLabel(_ method: String) -> String {
        switch method {
        case "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE": method
        default: "OTHER"
        }
    }

    func requestStarted() { inFlight.increment() }

    func requestFinished(route: String?, method: String, code: Int, duration: Duration) {
        inFlight.decrement()
        let key = Key(route: route ?? "", method: Self.methodLabel(method),
                      code: (100...599).contains(code) ? code : 0)
        let handle = handles[key]
        handle.requests.increment()
        handle.duration.recordNanoseconds(Self.nanoseconds(duration))
    }

    /// Time to the first byte of a response: when its head went out for a buffered response
    /// (the head and body leave together), when its first body byte did for a streamed one.
    public func firstByte(route: String?, after duration: Duration) {
        firstByteTimers[route ?? ""].recordNanoseconds(Self.nanoseconds(duration))
    }

    /// For a streamed response, instead of `requestFinished` when the head goes out: a stage to
    /// append last to its body. It records the time to the first body byte as that byte leaves,
    /// and the request (count, `portico_request_duration_seconds` from `start` to the body's
    /// end, in-flight gauge) when the body ends, however it ends — or when the body is dropped
    /// unread; `then` runs after that. `portico_open_streams` counts it from now to that end.
    /// `clock` must be the one `start` was read from.
    public func streamObserver(route: String?, method: String, code: Int, start: ContinuousClock.Instant,
                               clock: any GatewayClock = SystemClock(),
                               then: @escaping @Sendable () -> Void = {}) -> StreamObserver {
        openStreams.increment()
        return StreamObserver(clock: clock, onFirstByte: { [self] first in
            firstByte(route: route, after: start.duration(to: first))
        }, onEnd: { [self] observation in
            if observation.firstByte == nil, observation.ending == .complete {
                // An empty body: its end was the first thing the client got after the head.
                firstByte(route: route, after: start.duration(to: observation.end))
            }
            openStreams.decrement()
            requestFinished(route: route, method: method, code: code, duration: start.duration(to: observation.end))
            then()
        })
    }

    /// A request refused by an in-flight cap: `route` nil for the listener-wide cap (`route=""`).
    func overloaded(route: String?) {
        overloads.increment([("route", route ?? "")])
    }

    /// `result` is `success` or `failure`.
    public func configReloaded(result: String) {
        reloads.increment([("result", result)])
    }

    static func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}
