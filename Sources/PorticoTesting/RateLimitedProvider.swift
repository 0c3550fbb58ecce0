import Foundation
import Synchronization

/// A stand-in for a third-party API with a published limit (issue #41): at most `limit`
/// requests per `window` for each API key (fixed windows on its own clock), 429 with
/// `Retry-After` beyond, and on every answer what is left in one of the standard forms.
///
/// ```swift
/// let provider = RateLimitedProvider(limit: 20, window: .seconds(1), form: .xRateLimit(unixReset: true))
/// try await provider.start()
/// // … point a gateway's upstream at provider.upstream.baseURL …
/// #expect(provider.counts.refused == 0)
/// ```
public final class RateLimitedProvider: Sendable {
    /// How it tells its clients what is left.
    public enum Form: Sendable {
        /// `RateLimit: "default";r=R;t=T` and `RateLimit-Policy: "default";q=Q;w=W`.
        case ietf
        /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`: the reset as seconds from now, or as a Unix time.
        case xRateLimit(unixReset: Bool)
        /// Nothing but `Retry-After` on its 429s.
        case retryAfterOnly
    }

    public struct Counts: Sendable, Equatable {
        public var served = 0
        public var refused = 0
        /// Requests that arrived while a `Retry-After` this provider sent was still running, more
        /// than `holdGrace` after it was sent (earlier ones were on their way before the 429 could
        /// have been read).
        public var duringHold = 0
    }

    public let limit: Int
    public let window: Duration
    public let form: Form
    /// How far the provider's clock is from ours (its `Date` and Unix resets use it).
    public let clockOffset: TimeInterval
    /// The header it counts by.
    public let keyHeader: String
    public let upstream: TestUpstream
    /// See `Counts.duringHold`.
    public let holdGrace: TimeInterval

    private struct State {
        var windows: [String: (start: Date, count: Int)] = [:]
        /// Per key: from when (a 429's time plus the grace) until when (its window's end) nothing should come.
        var holds: [String: (from: Date, until: Date)] = [:]
        var counts = Counts()
    }

    private let state = Mutex(State())

    public init(limit: Int, window: Duration = .seconds(1), form: Form = .ietf, clockOffset: TimeInterval = 0,
                keyHeader: String = "x-api-key", holdGrace: TimeInterval = 0.25) {
        self.holdGrace = holdGrace
        self.limit = limit
        self.window = window
        self.form = form
        self.clockOffset = clockOffset
        self.keyHeader = keyHeader
        let box = Box()
        upstream = TestUpstream { request in try box.provider!.answer(request) }
        box.provider = self
    }

    /// Lets the handler, made before `self` exists, reach it.
    private final class Box: @unchecked Sendable {
        // @unchecked: written once in `init`, before the upstream starts serving; read only after.
        var provider: RateLimitedProvider?
    }

    /// A `clockOffset` that puts the provider's clock half a second into a fresh window now, so a
    /// test with long windows never meets a window's end by chance (the windows are aligned to
    /// the provider's clock).
    public static func offsetToFreshWindow(_ window: Duration) -> TimeInterval {
        let length = Double(window.components.seconds) + Double(window.components.attoseconds) / 1e18
        let now = Date().timeIntervalSince1970
        return 0.5 - now.truncatingRemainder(dividingBy: length)
    }

    public func start() async throws { try await upstream.start() }
    public func shutdown() async { await upstream.shutdown() }

    public var counts: Counts { state.withLock { $0.counts } }

    private var windowSeconds: TimeInterval { Double(window.components.seconds) + Double(window.components.attoseconds) / 1e18 }

    func answer(_ request: TestUpstream.Request) throws -> TestUpstream.Response {
        let now = Date().addingTimeInterval(clockOffset)
        let key = request.values(keyHeader).first ?? ""
        let length = windowSeconds
        let (allowed, left, resetIn, heldOver): (Bool, Int, TimeInterval, Bool) = state.withLock { state in
            // Fixed windows aligned to the provider's clock.
            let start = Date(timeIntervalSince1970: (now.timeIntervalSince1970 / length).rounded(.down) * length)
            var current = state.windows[key] ?? (start, 0)
            if current.start != start { current = (start, 0) }
            let heldOver = state.holds[key].map { now >= $0.from && now < $0.until } ?? false
            if heldOver { state.counts.duringHold += 1 }
            current.count += 1
            state.windows[key] = current
            let resetIn = start.addingTimeInterval(length).timeIntervalSince(now)
            let allowed = current.count <= limit
            if allowed { state.counts.served += 1 } else {
                state.counts.refused += 1
                if state.holds[key].map({ now >= $0.until }) ?? true {
                    state.holds[key] = (now.addingTimeInterval(holdGrace), start.addingTimeInterval(length))
                }
            }
            return (allowed, max(0, limit - current.count), resetIn, heldOver)
        }
        _ = heldOver
        var headers: [(name: String, value: String)] = [("Date", HTTPDateText.format(now))]
        let resetSeconds = max(1, Int(resetIn.rounded(.up)))
        switch form {
        case .ietf:
            headers.append(("RateLimit-Policy", "\"default\";q=\(limit);w=\(max(1, Int(length.rounded(.up))))"))
            headers.append(("RateLimit", "\"default\";r=\(left);t=\(resetSeconds)"))
        case .xRateLimit(let unixReset):
            headers.append(("X-RateLimit-Limit", String(limit)))
            headers.append(("X-RateLimit-Remaining", String(left)))
            let reset = unixReset ? Int((now.timeIntervalSince1970 + resetIn).rounded(.up)) : resetSeconds
            headers.append(("X-RateLimit-Reset", String(reset)))
        case .retryAfterOnly:
            break
        }
        guard allowed else {
            headers.append(("Retry-After", String(resetSeconds)))
            return TestUpstream.Response(status: 429, headers: headers, body: "{\"error\":\"too many requests\"}\n")
        }
        return TestUpstream.Response(status: 200, headers: headers, body: "ok\n")
    }
}

/// IMF-fixdate for the stand-in's `Date` (Portico's own formatter is the code under test).
enum HTTPDateText {
    static func format(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        return formatter.string(from: date)
    }
}
