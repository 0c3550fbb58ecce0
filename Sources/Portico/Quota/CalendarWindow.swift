import Foundation

/// One calendar window of a quota — an hour, a day or a month of a time zone — as the span of
/// absolute time `[start, end)` it covers. Windows follow the zone's calendar: a month is 28 to
/// 31 days, a day across a daylight-saving change 23 or 25 hours, an hour of a zone offset by
/// half an hour starts at :30 UTC.
public struct CalendarWindow: Sendable, Equatable, CustomStringConvertible {
    public var period: QuotaConfig.Period
    public var start: Date
    public var end: Date

    public init(period: QuotaConfig.Period, start: Date, end: Date) {
        self.period = period
        self.start = start
        self.end = end
    }

    /// The window's name in store keys: its period and its start in UTC, `month:20261130T2200Z`.
    /// Unique across zones (a day of UTC+02:00 and a day of UTC share no name), readable in Redis.
    public var id: String { "\(period.rawValue):\(Self.utcStamp(start))" }

    /// How long the window lasts: the `w` of `RateLimit-Policy`.
    public var length: Duration { Self.duration(end.timeIntervalSince(start)) }

    /// From `now` to the window's end (zero once it is over): `t` and `Retry-After`.
    public func remaining(at now: Date) -> Duration {
        Self.duration(max(0, end.timeIntervalSince(now)))
    }

    public var description: String { "\(period.rawValue) from \(Self.utcStamp(start)) to \(Self.utcStamp(end))" }

    static func duration(_ seconds: TimeInterval) -> Duration {
        .milliseconds(Int64((seconds * 1000).rounded()))
    }

    /// `20261130T2200Z`: minutes are enough, no window starts within a minute.
    static func utcStamp(_ date: Date) -> String {
        let parts = CalendarWindows.utc.dateComponents([.year, .month, .day, .hour, .minute], from: date)
        return "\(parts.year ?? 0)\(two(parts.month))\(two(parts.day))T\(two(parts.hour))\(two(parts.minute))Z"
    }

    /// `2027-01-01T00:00:00Z`, for messages.
    static func iso8601(_ date: Date) -> String {
        let parts = CalendarWindows.utc.dateComponents([.year, .month, .day, .hour, .minute, .second], from: date)
        return "\(parts.year ?? 0)-\(two(parts.month))-\(two(parts.day))T\(two(parts.hour)):\(two(parts.minute)):\(two(parts.second))Z"
    }

    private static func two(_ value: Int?) -> String {
        let value = value ?? 0
        return value < 10 ? "0\(value)" : String(value)
    }
}

/// The windows of one period in one zone: which window an instant falls in.
public struct CalendarWindows: Sendable, Equatable {
    public let period: QuotaConfig.Period
    public let timeZone: TimeZone
    private let calendar: Calendar

    static let utc: Calendar = {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(secondsFromGMT: 0) ?? calendar.timeZone
        return calendar
    }()

    public init(period: QuotaConfig.Period, timeZone: TimeZone) {
        self.period = period
        self.timeZone = timeZone
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = timeZone
        self.calendar = calendar
    }

    /// The window `date` falls in; a date on a boundary starts the next window.
    public func window(containing date: Date) -> CalendarWindow {
        let component: Calendar.Component = switch period {
        case .hour: .hour
        case .day: .day
        case .month: .month
        }
        if let interval = calendar.dateInterval(of: component, for: date) {
            return CalendarWindow(period: period, start: interval.start, end: interval.end)
        }
        // Foundation answers nil only for dates outside the calendar's range: fixed-length
        // windows counted from 1970 keep a quota counting rather than failing requests.
        let length: TimeInterval = switch period {
        case .hour: 3600
        case .day: 86_400
        case .month: 30 * 86_400
        }
        let start = (date.timeIntervalSince1970 / length).rounded(.down) * length
        return CalendarWindow(period: period, start: Date(timeIntervalSince1970: start),
                              end: Date(timeIntervalSince1970: start + length))
    }
}
