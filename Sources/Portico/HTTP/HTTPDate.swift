import Foundation

/// HTTP-date parsing (RFC 9110 §5.6.7): IMF-fixdate, and the obsolete RFC 850 and asctime
/// forms recipients must still accept. Hand-written because `DateFormatter` is neither cheap
/// nor documented thread-safe on Linux.
public enum HTTPDate {
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    private static let shortDays = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    private static let longDays = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

    public static func parse(_ text: String) -> Date? {
        // Exactly one space between the parts: `Sun,  06 Nov …` is not a date (http-tests'
        // `freshness-expires-invalid-multiple-spaces`). asctime alone pads a one-digit day.
        var words = text.split(separator: " ", omittingEmptySubsequences: false).map(String.init)
        var padded = false  // asctime's `Nov  6`
        if words.count == 6, words[2].isEmpty, words[3].count == 1 {
            words.remove(at: 2)
            padded = true
        }
        guard !words.contains(where: \.isEmpty) else { return nil }
        // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
        if words.count == 6, words[0].hasSuffix(","), shortDays.contains(String(words[0].dropLast())), words[5] == "GMT",
           words[1].count == 2, let day = Int(words[1]), let month = months.firstIndex(of: words[2]),
           words[3].count == 4, let year = Int(words[3]), let time = clock(words[4]) {
            return date(year: year, month: month + 1, day: day, time: time)
        }
        // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
        if words.count == 4, words[0].hasSuffix(","), longDays.contains(String(words[0].dropLast())), words[3] == "GMT" {
            let parts = words[1].split(separator: "-").map(String.init)
            if parts.count == 3, parts[0].count == 2, let day = Int(parts[0]), let month = months.firstIndex(of: parts[1]),
               parts[2].count == 2, let yy = Int(parts[2]), let time = clock(words[2]) {
                // Two-digit years: RFC 9110 says a date more than 50 years ahead is in the past century.
                let year = yy < 70 ? 2000 + yy : 1900 + yy
                return date(year: year, month: month + 1, day: day, time: time)
            }
        }
        // asctime: Sun Nov  6 08:49:37 1994
        if words.count == 5, shortDays.contains(words[0]), let month = months.firstIndex(of: words[1]),
           words[2].count == 2 || padded, let day = Int(words[2]), let time = clock(words[3]),
           words[4].count == 4, let year = Int(words[4]) {
            return date(year: year, month: month + 1, day: day, time: time)
        }
        return nil
    }

    /// `HH:MM:SS` → seconds into the day.
    private static func clock(_ text: String) -> Int? {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 3, parts.allSatisfy({ $0.count == 2 && $0.allSatisfy(\.isASCII) }),
              let h = Int(parts[0]), let m = Int(parts[1]), let s = Int(parts[2]),
              (0...23).contains(h), (0...59).contains(m), (0...60).contains(s) else { return nil }
        return h * 3600 + m * 60 + s
    }

    private static func date(year: Int, month: Int, day: Int, time: Int) -> Date? {
        guard (1...31).contains(day), year >= 1900 else { return nil }
        // Days from the civil date (Howard Hinnant's algorithm), proleptic Gregorian, UTC.
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146_097 + doe - 719_468
        return Date(timeIntervalSince1970: TimeInterval(days * 86_400 + time))
    }
}
