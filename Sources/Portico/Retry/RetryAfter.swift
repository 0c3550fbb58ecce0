import Foundation

/// `Retry-After` (RFC 9110 §10.2.3): delta-seconds or an HTTP-date.
public enum RetryAfter {
    /// Longest delay represented; larger delta-seconds are clamped rather than overflowing.
    static let clamp: Int64 = 1_000_000_000

    /// How long to wait, measured from `now` for dates (a date in the past means "now": zero).
    /// `nil` for a value that is neither form: the caller falls back to its own backoff.
    public static func delay(_ value: String, now: Date) -> Duration? {
        let text = value.trimmingCharacters(in: .whitespaces)
        guard !text.isEmpty else { return nil }
        if text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) {
            // Digits only: a very long number is a very long delay, never an overflow.
            let seconds = text.count > 10 ? clamp : min(Int64(text) ?? clamp, clamp)
            return .seconds(seconds)
        }
        guard let date = HTTPDate.parse(text) else { return nil }
        let interval = date.timeIntervalSince(now)
        guard interval > 0 else { return .zero }
        return .milliseconds(Int64(min(interval, Double(clamp)) * 1000))
    }
}
