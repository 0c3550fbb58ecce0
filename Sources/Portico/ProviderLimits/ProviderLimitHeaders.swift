import Foundation
import HTTPTypes
import RawStructuredFieldValues

/// What a provider's response says about its own limit, read from every standard form:
///
/// - `RateLimit: "name";r=57;t=1` and `RateLimit-Policy: "name";q=200;w=60`
///   (draft-ietf-httpapi-ratelimit-headers -08 and later: Structured Field lists);
/// - `RateLimit: limit=100, remaining=50, reset=5` (earlier drafts: a dictionary) and the
///   separate `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`;
/// - `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (GitHub and many others),
///   whose reset is either seconds from now or a Unix time (seconds or milliseconds);
/// - `Retry-After` on 429 and 503: seconds or an HTTP-date.
///
/// Times the provider gives as instants (a Unix reset, an HTTP-date) are read against the
/// response's own `Date`, so a provider whose clock is off by minutes costs at most `Date`'s
/// one-second resolution. A malformed value is left out and named in `malformed`; it never
/// fails the request.
public struct ProviderLimitObservation: Sendable, Equatable {
    /// Requests the provider will still take before `reset`.
    public var remaining: Int?
    /// Until the provider's window ends (its budget is whole again).
    public var reset: Duration?
    /// The window's quota, when it says.
    public var limit: Int?
    /// The window's length, when it says.
    public var window: Duration?
    /// How long the provider asked to be left alone (`Retry-After` on 429 or 503).
    public var retryAfter: Duration?
    /// Header fields present but unreadable, by name (lower case): counted, ignored.
    public var malformed: [String] = []

    public init(remaining: Int? = nil, reset: Duration? = nil, limit: Int? = nil, window: Duration? = nil,
                retryAfter: Duration? = nil, malformed: [String] = []) {
        self.remaining = remaining
        self.reset = reset
        self.limit = limit
        self.window = window
        self.retryAfter = retryAfter
        self.malformed = malformed
    }

    /// Whether the response said anything about the limit.
    public var isEmpty: Bool { remaining == nil && reset == nil && limit == nil && retryAfter == nil }
}

public enum ProviderLimitHeaders {
    static let rateLimit = HTTPField.Name("RateLimit")!
    static let rateLimitPolicy = HTTPField.Name("RateLimit-Policy")!
    static let rateLimitLimit = HTTPField.Name("RateLimit-Limit")!
    static let rateLimitRemaining = HTTPField.Name("RateLimit-Remaining")!
    static let rateLimitReset = HTTPField.Name("RateLimit-Reset")!
    static let xLimit = HTTPField.Name("X-RateLimit-Limit")!
    static let xRemaining = HTTPField.Name("X-RateLimit-Remaining")!
    static let xReset = HTTPField.Name("X-RateLimit-Reset")!

    /// A reset above this many seconds is an instant (Unix time), not a delay: 10⁹ s is 2001,
    /// and no provider's window lasts 31 years.
    static let unixSecondsThreshold: Int64 = 1_000_000_000
    /// Above this, a Unix time in milliseconds.
    static let unixMillisecondsThreshold: Int64 = 100_000_000_000

    /// What `fields` (a response with `status`) say. `now`: this gateway's wall clock, used only
    /// when the response has no `Date`.
    public static func observe(_ fields: HTTPFields, status: Int, now: Date) -> ProviderLimitObservation {
        var observation = ProviderLimitObservation()
        // The provider's own "now", for the instants it names: its `Date` (whole seconds), or
        // this gateway's own clock when that reads the same second, as with clocks kept by NTP
        // (then a reset on a second's boundary is known to the millisecond, not to the second).
        let date = fields[.date].flatMap(HTTPDate.parse)
        let providerNow: Date = if let date, !(0..<1).contains(now.timeIntervalSince(date)) { date } else { now }

        if let lines = values(fields, rateLimit) {
            if !readStructured(lines, into: &observation) && !readDictionary(lines, into: &observation) {
                observation.malformed.append("ratelimit")
            }
        }
        if let lines = values(fields, rateLimitPolicy), !readPolicy(lines, into: &observation) {
            observation.malformed.append("ratelimit-policy")
        }
        for (limitName, remainingName, resetName) in [(rateLimitLimit, rateLimitRemaining, rateLimitReset),
                                                       (xLimit, xRemaining, xReset)] {
            if let text = fields[limitName] {
                if let value = nonNegative(text) { observation.limit = observation.limit ?? Int(value) }
                else { observation.malformed.append(limitName.canonicalName) }
            }
            if let text = fields[remainingName] {
                if let value = nonNegative(text) { observation.remaining = min(observation.remaining ?? .max, Int(value)) }
                else { observation.malformed.append(remainingName.canonicalName) }
            }
            if let text = fields[resetName] {
                if let value = reset(text, providerNow: providerNow) { observation.reset = observation.reset ?? value }
                else { observation.malformed.append(resetName.canonicalName) }
            }
        }
        if status == 429 || status == 503, let text = fields[.retryAfter] {
            if let delay = RetryAfter.delay(text, now: providerNow) { observation.retryAfter = delay }
            else { observation.malformed.append("retry-after") }
        }
        return observation
    }

    private static func values(_ fields: HTTPFields, _ name: HTTPField.Name) -> String? {
        let lines = fields[values: name]
        return lines.isEmpty ? nil : lines.joined(separator: ", ")
    }

    /// Digits only, at most 18 of them.
    private static func nonNegative(_ text: String) -> Int64? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        guard !trimmed.isEmpty, trimmed.utf8.count <= 18,
              trimmed.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
        return Int64(trimmed)
    }

    /// Seconds from now, or a Unix time (seconds or milliseconds) read against the provider's `Date`.
    static func reset(_ text: String, providerNow: Date) -> Duration? {
        guard let value = nonNegative(text) else {
            // Some send a decimal number of seconds.
            guard let seconds = Double(text.trimmingCharacters(in: .whitespaces)), seconds.isFinite, seconds >= 0,
                  seconds < Double(unixSecondsThreshold) else { return nil }
            return .milliseconds(Int64((seconds * 1000).rounded(.up)))
        }
        if value >= unixMillisecondsThreshold {
            return .milliseconds(max(0, value - Int64((providerNow.timeIntervalSince1970 * 1000).rounded())))
        }
        if value >= unixSecondsThreshold {
            return .milliseconds(max(0, Int64(((Double(value) - providerNow.timeIntervalSince1970) * 1000).rounded(.up))))
        }
        return .seconds(value)
    }

    /// `"name";r=R;t=T` items: the tightest (fewest remaining) counts.
    private static func readStructured(_ line: String, into observation: inout ProviderLimitObservation) -> Bool {
        var parser = StructuredFieldValueParser(Array(line.utf8))
        guard let list = try? parser.parseListFieldValue(), !list.isEmpty else { return false }
        var read = false
        for member in list {
            guard case .item(let item) = member else { continue }
            guard case .integer(let r)? = item.rfc9651Parameters["r"], r >= 0 else { continue }
            read = true
            if Int(r) < (observation.remaining ?? .max) {
                observation.remaining = Int(r)
                if case .integer(let t)? = item.rfc9651Parameters["t"], t >= 0 { observation.reset = .seconds(t) }
            }
        }
        return read
    }

    /// `limit=100, remaining=50, reset=5` (drafts before -08).
    private static func readDictionary(_ line: String, into observation: inout ProviderLimitObservation) -> Bool {
        var parser = StructuredFieldValueParser(Array(line.utf8))
        guard let dictionary = try? parser.parseDictionaryFieldValue() else { return false }
        var read = false
        for (name, member) in dictionary {
            guard case .item(let item) = member, case .integer(let value) = item.rfc9651BareItem, value >= 0 else { continue }
            switch name {
            case "limit": observation.limit = Int(value); read = true
            case "remaining": observation.remaining = Int(value); read = true
            case "reset": observation.reset = .seconds(value); read = true
            default: continue
            }
        }
        return read
    }

    /// `"name";q=Q;w=W`: the quota and window of the policy with the smallest quota.
    private static func readPolicy(_ line: String, into observation: inout ProviderLimitObservation) -> Bool {
        var parser = StructuredFieldValueParser(Array(line.utf8))
        guard let list = try? parser.parseListFieldValue(), !list.isEmpty else { return false }
        var read = false
        for member in list {
            guard case .item(let item) = member, case .integer(let q)? = item.rfc9651Parameters["q"], q >= 0 else { continue }
            read = true
            if Int(q) < (observation.limit ?? .max) {
                observation.limit = Int(q)
                if case .integer(let w)? = item.rfc9651Parameters["w"], w > 0 { observation.window = .seconds(w) }
            }
        }
        return read
    }
}
