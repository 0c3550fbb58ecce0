/// "Did you mean …?" for misspelled keys, names and enum values. Only close matches are
/// offered: a far-fetched suggestion is worse than none.
enum NameSuggester {
    /// The candidate nearest to `input` (optimal-string-alignment distance, case-insensitive),
    /// if it is within 2 edits and within a third of the input's length.
    static func closest(to input: String, in candidates: [String]) -> String? {
        let target = Array(input.lowercased())
        let limit = min(2, max(1, target.count / 3))
        var best: (name: String, distance: Int)?
        for candidate in candidates where candidate != input {
            let distance = self.distance(target, Array(candidate.lowercased()))
            if distance <= limit, distance < best?.distance ?? .max {
                best = (candidate, distance)
            }
        }
        return best?.name
    }

    /// ` (did you mean "x"?)`, or empty when nothing is close.
    static func hint(for input: String, in candidates: [String]) -> String {
        closest(to: input, in: candidates).map { " (did you mean \($0.quotedForMessage)?)" } ?? ""
    }

    /// Levenshtein distance that also counts a swap of two neighbours (`prot`/`port`) as one edit.
    static func distance(_ a: [Character], _ b: [Character]) -> Int {
        if a.isEmpty { return b.count }
        if b.isEmpty { return a.count }
        var previous2 = [Int](repeating: 0, count: b.count + 1)
        var previous = Array(0...b.count)
        var current = [Int](repeating: 0, count: b.count + 1)
        for i in 1...a.count {
            current[0] = i
            for j in 1...b.count {
                let cost = a[i - 1] == b[j - 1] ? 0 : 1
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
                if i > 1, j > 1, a[i - 1] == b[j - 2], a[i - 2] == b[j - 1] {
                    current[j] = min(current[j], previous2[j - 2] + 1)
                }
            }
            (previous2, previous, current) = (previous, current, previous2)
        }
        return previous[b.count]
    }
}
