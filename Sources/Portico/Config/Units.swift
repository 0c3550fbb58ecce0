/// Parsers for the human-friendly units used in configuration: durations (`250ms`, `10s`),
/// byte sizes (`64KiB`, `10MB`) and rates (`100/s`). Public so the CLI and middleware can
/// accept the same spellings the YAML file does.
public enum ConfigUnits {
    /// Hint appended to duration errors.
    static let durationHint = "expected e.g. 250ms, 10s, 5m"
    static let sizeHint = "expected e.g. 512B, 64KiB, 10MiB, 1GB"
    static let rateHint = "expected e.g. 100/s, 6000/m, 10/h"

    private static let durationUnits: [(suffix: String, nanoseconds: Int128)] = [
        ("ms", 1_000_000), ("s", 1_000_000_000), ("m", 60_000_000_000), ("h", 3_600_000_000_000),
    ]

    private static let sizeUnits: [(suffix: String, bytes: Int128)] = [
        ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40),
        ("KB", 1_000), ("MB", 1_000_000), ("GB", 1_000_000_000), ("TB", 1_000_000_000_000),
        ("B", 1),
    ]

    /// Parses `250ms`, `10s`, `5m`, `1h`, `1.5s` or a bare `0`.
    ///
    /// A bare non-zero number is rejected: `30` could mean seconds or milliseconds, and a
    /// config that guesses wrong is worse than one that refuses.
    public static func duration(_ text: String) throws(UnitError) -> Duration {
        let kind = "duration"
        if text == "0" { return .zero }
        if text.hasPrefix("-") { throw UnitError(kind: kind, input: text, reason: "must not be negative") }
        // Longest suffix first so "ms" is not read as "m" + garbage.
        guard let unit = durationUnits.first(where: { text.hasSuffix($0.suffix) }) else {
            throw UnitError(kind: kind, input: text, reason: durationHint)
        }
        let number = text.dropLast(unit.suffix.count)
        guard let nanoseconds = scaled(number, by: unit.nanoseconds) else {
            throw UnitError(kind: kind, input: text, reason: durationHint)
        }
        guard nanoseconds <= Int128(Int64.max) else {
            throw UnitError(kind: kind, input: text, reason: "too large")
        }
        return .nanoseconds(Int64(nanoseconds))
    }

    /// Parses `512B`, `64KiB`, `10MiB`, `1GiB`, `10MB` (decimal) or a plain byte count.
    /// Fractions are allowed with a unit (`1.5MiB`) and rounded down to whole bytes.
    public static func byteSize(_ text: String) throws(UnitError) -> Int {
        let kind = "size"
        if text.hasPrefix("-") { throw UnitError(kind: kind, input: text, reason: "must not be negative") }
        let unit = sizeUnits.first(where: { text.hasSuffix($0.suffix) }) ?? ("", 1)
        let number = text.dropLast(unit.suffix.count)
        if unit.suffix.isEmpty, number.contains(".") {
            throw UnitError(kind: kind, input: text, reason: sizeHint)
        }
        guard let bytes = scaled(number, by: unit.bytes) else {
            throw UnitError(kind: kind, input: text, reason: sizeHint)
        }
        guard bytes <= Int128(Int.max) else { throw UnitError(kind: kind, input: text, reason: "too large") }
        return Int(bytes)
    }

    static let maxRatePerSecond: Double = 1_000_000_000

    /// Parses `100/s`, `6000/m`, `10/h`, or `5/10s` (a count per any duration), at most 10⁹ per second.
    public static func rate(_ text: String) throws(UnitError) -> Rate {
        let kind = "rate"
        let parts = text.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.count == 2 else { throw UnitError(kind: kind, input: text, reason: rateHint) }
        let countText = parts[0], periodText = String(parts[1])
        if countText.hasPrefix("-") { throw UnitError(kind: kind, input: text, reason: "must not be negative") }
        guard isDecimal(countText), let count = Double(countText), count.isFinite else {
            throw UnitError(kind: kind, input: text, reason: rateHint)
        }
        guard count > 0 else { throw UnitError(kind: kind, input: text, reason: "must be greater than zero") }
        // "/s" means "per one second"; "/10s" is a full duration.
        let periodSpelled = ["ms", "s", "m", "h"].contains(periodText) ? "1" + periodText : periodText
        let per: Duration
        do {
            per = try duration(periodSpelled)
        } catch {
            throw UnitError(kind: kind, input: text, reason: rateHint)
        }
        guard per > .zero else { throw UnitError(kind: kind, input: text, reason: "period must be greater than zero") }
        let rate = Rate(count: count, per: per)
        // Bucket sizes and refill arithmetic are integers: an absurd rate must be an error, not an overflow.
        guard rate.perSecond <= maxRatePerSecond else {
            throw UnitError(kind: kind, input: text, reason: "must be at most 1000000000 per second")
        }
        return rate
    }

    /// `digits[.digits]` times `multiplier`, rounded down; nil for anything else.
    /// Int128 keeps `9999999999h` from overflowing before the range check.
    private static func scaled(_ number: Substring, by multiplier: Int128) -> Int128? {
        guard isDecimal(number) else { return nil }
        let pieces = number.split(separator: ".", maxSplits: 1, omittingEmptySubsequences: false)
        let whole = pieces[0], fraction = pieces.count > 1 ? pieces[1].prefix(18) : ""
        guard whole.count <= 30 else { return Int128.max }  // absurdly long: overflow, not garbage
        guard let wholeValue = Int128(whole) else { return nil }
        let (product, overflow) = wholeValue.multipliedReportingOverflow(by: multiplier)
        if overflow { return Int128.max }
        guard !fraction.isEmpty, let fractionValue = Int128(fraction) else { return product }
        var scale: Int128 = 1
        for _ in 0..<fraction.count { scale *= 10 }
        return product + fractionValue * multiplier / scale
    }

    /// `12`, `1.5` — ASCII digits with at most one inner dot; no sign, exponent or spaces.
    private static func isDecimal(_ text: Substring) -> Bool {
        let pieces = text.split(separator: ".", maxSplits: 1, omittingEmptySubsequences: false)
        return pieces.allSatisfy { !$0.isEmpty && $0.allSatisfy { $0.isASCII && $0.isNumber } }
    }
}

/// A count of events per period, e.g. `100/s`.
public struct Rate: Sendable, Hashable, CustomStringConvertible {
    public var count: Double
    public var per: Duration

    public init(count: Double, per: Duration) {
        self.count = count
        self.per = per
    }

    /// Events per second, the unit token buckets refill in.
    public var perSecond: Double {
        let (seconds, attoseconds) = per.components
        return count / (Double(seconds) + Double(attoseconds) / 1e18)
    }

    public var description: String { "\(count)/\(per)" }
}

/// A unit value that failed to parse. `message(showing:)` lets the loader substitute
/// `value from ${VAR}` for the input so interpolated secrets never reach an error message.
public struct UnitError: Error, Sendable, Equatable, CustomStringConvertible {
    /// `duration`, `size` or `rate`.
    public var kind: String
    public var input: String
    /// Why, e.g. `expected e.g. 250ms, 10s, 5m` or `must not be negative`.
    public var reason: String

    public init(kind: String, input: String, reason: String) {
        self.kind = kind
        self.input = input
        self.reason = reason
    }

    public func message(showing shownInput: String) -> String {
        "invalid \(kind) \(shownInput) (\(reason))"
    }

    public var description: String { message(showing: input.quotedForMessage) }
}
