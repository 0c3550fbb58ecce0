/// Reads back the Prometheus text exposition the admin listener serves, so the dashboard's
/// JSON comes from the very numbers `/metrics` shows (the registry lives in the executable).
enum PrometheusText {
    struct Sample: Sendable, Equatable {
        var name: String
        var labels: [String: String]
        var value: Double
    }

    /// Every sample line; comments, blank and malformed lines are skipped.
    static func parse(_ bytes: [UInt8]) -> [Sample] {
        String(decoding: bytes, as: UTF8.self).split(separator: "\n").compactMap { sample(Substring($0)) }
    }

    /// `name{a="x",b="y\"z"} 1.5 [timestamp]`
    static func sample(_ line: Substring) -> Sample? {
        guard let first = line.first, first != "#" else { return nil }
        var index = line.startIndex
        while index < line.endIndex, line[index] != "{", line[index] != " " { index = line.index(after: index) }
        let name = String(line[..<index])
        var labels: [String: String] = [:]
        if index < line.endIndex, line[index] == "{" {
            index = line.index(after: index)
            while index < line.endIndex, line[index] != "}" {
                guard let equals = line[index...].firstIndex(of: "="), line.index(after: equals) < line.endIndex,
                      line[line.index(after: equals)] == "\"" else { return nil }
                let key = line[index..<equals].drop { $0 == "," || $0 == " " }
                var value = ""
                var cursor = line.index(equals, offsetBy: 2)
                while cursor < line.endIndex, line[cursor] != "\"" {
                    if line[cursor] == "\\", line.index(after: cursor) < line.endIndex {
                        cursor = line.index(after: cursor)
                        value.append(line[cursor] == "n" ? "\n" : line[cursor])
                    } else {
                        value.append(line[cursor])
                    }
                    cursor = line.index(after: cursor)
                }
                guard cursor < line.endIndex else { return nil }
                labels[String(key)] = value
                index = line.index(after: cursor)
                if index < line.endIndex, line[index] == "," { index = line.index(after: index) }
            }
            guard index < line.endIndex else { return nil }
            index = line.index(after: index)
        }
        guard let token = line[index...].split(separator: " ").first, let value = number(token) else { return nil }
        return Sample(name: name, labels: labels, value: value)
    }

    static func number(_ text: Substring) -> Double? {
        switch text {
        case "+Inf": .infinity
        case "-Inf": -.infinity
        default: Double(text)
        }
    }
}
