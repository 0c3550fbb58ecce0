import Foundation
import Portico
import Testing

/// Calendar windows: which hour, day or month an instant falls in, in a zone.
@Suite("Quota: calendar windows")
struct CalendarWindowTests {
    static let utc = TimeZone(secondsFromGMT: 0)!

    /// `2026-12-01T21:38:12Z` (UTC, whole seconds, or with `.SSS`).
    static func date(_ text: String) -> Date {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = text.contains(".") ? [.withInternetDateTime, .withFractionalSeconds] : [.withInternetDateTime]
        return formatter.date(from: text)!
    }

    static func window(_ per: QuotaConfig.Period, _ text: String, zone: TimeZone = utc) -> CalendarWindow {
        CalendarWindows(period: per, timeZone: zone).window(containing: date(text))
    }

    @Test("an hour in UTC: from its start to the next, named by its start")
    func hour() {
        let window = Self.window(.hour, "2026-12-01T21:38:12Z")
        #expect(window.start == Self.date("2026-12-01T21:00:00Z"))
        #expect(window.end == Self.date("2026-12-01T22:00:00Z"))
        #expect(window.length == .seconds(3600))
        #expect(window.id == "hour:20261201T2100Z")
        #expect(window.remaining(at: Self.date("2026-12-01T21:38:12Z")) == .seconds(21 * 60 + 48))
    }

    @Test("an instant on a boundary starts the next window; the last millisecond before it is in the old one")
    func boundaries() {
        #expect(Self.window(.hour, "2026-12-01T22:00:00Z").start == Self.date("2026-12-01T22:00:00Z"))
        #expect(Self.window(.hour, "2026-12-01T21:59:59.999Z").end == Self.date("2026-12-01T22:00:00Z"))
        #expect(Self.window(.day, "2026-12-01T23:59:59.999Z").start == Self.date("2026-12-01T00:00:00Z"))
        #expect(Self.window(.day, "2026-12-02T00:00:00Z").start == Self.date("2026-12-02T00:00:00Z"))
        let lastOfYear = Self.window(.month, "2026-12-31T23:59:59.999Z")
        #expect(lastOfYear.start == Self.date("2026-12-01T00:00:00Z") && lastOfYear.end == Self.date("2027-01-01T00:00:00Z"))
        #expect(Self.window(.month, "2027-01-01T00:00:00Z").id == "month:20270101T0000Z")
        #expect(Self.window(.day, "2026-12-01T12:00:00Z").length == .seconds(86_400))
    }

    @Test("months are as long as the calendar says, leap years included", arguments: [
        ("2026-01-15T00:00:00Z", 31), ("2026-02-10T00:00:00Z", 28), ("2026-04-30T23:00:00Z", 30),
        ("2028-02-29T12:00:00Z", 29), ("2000-02-01T00:00:00Z", 29), ("2100-02-01T00:00:00Z", 28),
    ])
    func monthLengths(instant: String, days: Int) {
        let window = Self.window(.month, instant)
        #expect(window.length == .seconds(days * 86_400))
        #expect(CalendarWindows.utcDay(window.start) == 1)
    }

    @Test("a zone with a fixed offset: its days and months start at its midnight")
    func fixedOffset() throws {
        let plusTwo = try #require(TimeZone(secondsFromGMT: 2 * 3600))
        // 23:30 UTC is 01:30 on the 2nd in UTC+02:00.
        let day = Self.window(.day, "2026-12-01T23:30:00Z", zone: plusTwo)
        #expect(day.start == Self.date("2026-12-01T22:00:00Z") && day.end == Self.date("2026-12-02T22:00:00Z"))
        let month = Self.window(.month, "2026-11-30T22:00:00Z", zone: plusTwo)
        #expect(month.start == Self.date("2026-11-30T22:00:00Z") && month.end == Self.date("2026-12-31T22:00:00Z"))
        #expect(month.id == "month:20261130T2200Z")
        // The same instant in UTC is still November: another window, another name.
        #expect(Self.window(.month, "2026-11-30T22:00:00Z").id == "month:20261101T0000Z")
        let minusFive = try #require(TimeZone(secondsFromGMT: -5 * 3600))
        #expect(Self.window(.day, "2026-12-02T03:00:00Z", zone: minusFive).start == Self.date("2026-12-01T05:00:00Z"))
    }

    @Test("a half-hour zone's hours start at :30 UTC; a daylight-saving day lasts 23 hours")
    func namedZones() throws {
        let kolkata = try #require(TimeZone(identifier: "Asia/Kolkata"))
        let hour = Self.window(.hour, "2026-12-01T10:10:00Z", zone: kolkata)
        #expect(hour.start == Self.date("2026-12-01T09:30:00Z") && hour.end == Self.date("2026-12-01T10:30:00Z"))
        let paris = try #require(TimeZone(identifier: "Europe/Paris"))
        // Clocks go forward on 29 March 2026: midnight to midnight is 23 hours.
        let spring = Self.window(.day, "2026-03-29T12:00:00Z", zone: paris)
        #expect(spring.start == Self.date("2026-03-28T23:00:00Z") && spring.length == .seconds(23 * 3600))
        let winter = Self.window(.month, "2026-12-15T00:00:00Z", zone: paris)
        #expect(winter.start == Self.date("2026-11-30T23:00:00Z"))
    }
}

extension CalendarWindows {
    /// The day of the month in UTC (tests).
    static func utcDay(_ date: Date) -> Int {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(secondsFromGMT: 0)!
        return calendar.component(.day, from: date)
    }
}
