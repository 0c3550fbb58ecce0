import Yams

/// State shared by every node of one load: where diagnostics go and how scalars are
/// interpolated. A class so the readers below stay cheap values that all report into one list.
final class ConfigContext {
    let file: String
    let interpolator: Interpolator
    private(set) var diagnostics: [ConfigDiagnostic] = []
    /// Accepted but worth a word at load (e.g. TLS verification turned off).
    private(set) var warnings: [ConfigDiagnostic] = []
    /// Set by the schema drift test only: every mapping read during the load.
    var keyRecorder: ConfigKeyRecorder?

    init(file: String, interpolator: Interpolator) {
        self.file = file
        self.interpolator = interpolator
    }

    func report(_ message: String, path: String, line: Int?) {
        diagnostics.append(ConfigDiagnostic(file: file, line: line, path: path, message: message))
    }

    func warn(_ message: String, path: String, line: Int?) {
        warnings.append(ConfigDiagnostic(file: file, line: line, path: path, message: message))
    }
}

/// A scalar after interpolation. Messages must use `shown`, never `text`: `text` may hold a
/// secret from the environment or a file.
struct ScalarValue {
    var text: String
    /// `"abc"` for literal values, `value from ${VAR}` for interpolated ones.
    var shown: String
}

/// A Yams node plus its key path, with typed readers that report problems (with line and path)
/// instead of throwing, so one pass finds every error. Readers return nil after reporting.
struct ConfigNode {
    let node: Node
    let path: String
    let context: ConfigContext
    /// The line of the key whose value this node is (`nil` for list items and the root).
    var keyLine: Int?

    var line: Int? { node.mark?.line }

    /// Where a problem with the node as a whole goes (a mapping missing a key): the line of the
    /// key that holds it, or for a list item or the root its own first line — not the line of
    /// its first child, where a block mapping's own mark points.
    var ownLine: Int? { keyLine ?? line }

    func error(_ message: String) {
        context.report(message, path: path, line: line)
    }

    func warning(_ message: String) {
        context.warn(message, path: path, line: line)
    }

    func child(_ key: String, _ node: Node, keyLine: Int? = nil) -> ConfigNode {
        ConfigNode(node: node, path: Self.join(path, key), context: context, keyLine: keyLine)
    }

    /// `a.b`, or `a["b.c"]` when the key would be ambiguous in a dotted path.
    static func join(_ path: String, _ key: String) -> String {
        let simple = !key.isEmpty && key.unicodeScalars.allSatisfy {
            $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || $0 == "_" || $0 == "-")
        }
        if !simple { return "\(path)[\(key.quotedForMessage)]" }
        return path.isEmpty ? key : "\(path).\(key)"
    }

    /// `~`, `null` or nothing at all (`key:`), written without quotes.
    var isNull: Bool {
        guard case .scalar(let scalar) = node, scalar.style == .plain || scalar.style == .any else { return false }
        return ["", "~", "null", "Null", "NULL"].contains(scalar.string)
    }

    /// How this node is named in "expected X, got Y" — never an interpolated value.
    var shownKind: String {
        switch node {
        case .mapping: return "a mapping"
        case .sequence: return "a list"
        case .alias: return "an alias"
        case .scalar(let scalar):
            if isNull { return "null" }
            return scalar.string.contains("${") ? Self.shownInterpolated(scalar.string) : scalar.string.quotedForMessage
        }
    }

    static func shownInterpolated(_ raw: String) -> String {
        let single = raw.hasPrefix("${") && raw.hasSuffix("}") && raw.dropFirst(2).firstIndex(of: "}") == raw.index(before: raw.endIndex)
        return "value from " + (single ? raw : raw.quotedForMessage)
    }

    func typeMismatch(_ expected: String) {
        error("expected \(expected), got \(shownKind)")
    }

    // MARK: Scalars

    /// The interpolated scalar, or nil after reporting.
    func scalar(expected: String = "a string") -> ScalarValue? {
        guard case .scalar(let scalar) = node, !isNull else {
            typeMismatch(expected)
            return nil
        }
        let result = context.interpolator.interpolate(scalar.string)
        guard result.errors.isEmpty else {
            result.errors.forEach(error)
            return nil
        }
        let shown = result.references.isEmpty
            ? result.value.quotedForMessage : Self.shownInterpolated(scalar.string)
        return ScalarValue(text: result.value, shown: shown)
    }

    func string() -> String? { scalar()?.text }

    /// Whether this is the plain word `word` (a keyword such as `auto` where a number may stand).
    func isWord(_ word: String) -> Bool {
        guard case .scalar(let scalar) = node else { return false }
        return scalar.string == word
    }

    /// A string that must not be empty (names, hosts, secrets).
    func nonEmptyString() -> String? {
        guard let value = scalar() else { return nil }
        guard !value.text.isEmpty else {
            error("must not be empty")
            return nil
        }
        return value.text
    }

    func int(in range: ClosedRange<Int>, expected: String = "an integer") -> Int? {
        guard let value = scalar(expected: expected) else { return nil }
        guard let number = Int(value.text) else {
            error("expected \(expected), got \(value.shown)")
            return nil
        }
        guard range.contains(number) else {
            error(Self.rangeMessage(range) + ", got " + (value.shown.hasPrefix("value from") ? value.shown : String(number)))
            return nil
        }
        return number
    }

    static func rangeMessage(_ range: ClosedRange<Int>) -> String {
        if range.upperBound == .max { return "must be at least \(range.lowerBound)" }
        return "must be between \(range.lowerBound) and \(range.upperBound)"
    }

    func bool() -> Bool? {
        guard let value = scalar(expected: "true or false") else { return nil }
        switch value.text.lowercased() {
        case "true", "yes", "on": return true
        case "false", "no", "off": return false
        default:
            error("expected true or false, got \(value.shown)")
            return nil
        }
    }

    /// A duration; `positive` rejects `0` for timeouts that must be able to elapse.
    func duration(positive: Bool = false) -> Duration? {
        guard let value = scalar(expected: "a duration") else { return nil }
        do throws(UnitError) {
            let duration = try ConfigUnits.duration(value.text)
            if positive, duration == .zero {
                error("must be greater than 0")
                return nil
            }
            return duration
        } catch {
            self.error(error.message(showing: value.shown))
            return nil
        }
    }

    func size(minimum: Int = 1) -> Int? {
        guard let value = scalar(expected: "a size") else { return nil }
        do throws(UnitError) {
            let bytes = try ConfigUnits.byteSize(value.text)
            if bytes < minimum {
                error(minimum == 1 ? "must be greater than 0" : "must be at least \(minimum) bytes")
                return nil
            }
            return bytes
        } catch {
            self.error(error.message(showing: value.shown))
            return nil
        }
    }

    func rate() -> Rate? {
        guard let value = scalar(expected: "a rate") else { return nil }
        do throws(UnitError) {
            return try ConfigUnits.rate(value.text)
        } catch {
            self.error(error.message(showing: value.shown))
            return nil
        }
    }

    /// `20%`, `2.5%` → 0.2, 0.025; between 0% and 100%.
    func percentage() -> Double? {
        guard let value = scalar(expected: "a percentage") else { return nil }
        let number = value.text.hasSuffix("%") ? value.text.dropLast() : nil
        guard let number, !number.isEmpty, number.allSatisfy({ $0.isASCII && ($0.isNumber || $0 == ".") }),
              let percent = Double(number) else {
            error("expected a percentage such as 20%, got \(value.shown)")
            return nil
        }
        guard percent <= 100 else {
            error("must be between 0% and 100%, got \(value.shown)")
            return nil
        }
        return percent / 100
    }

    /// One of a fixed set of words, with a suggestion for near misses.
    func choice(_ options: [String]) -> String? {
        let expected = "one of " + options.joined(separator: ", ")
        guard let value = scalar(expected: expected) else { return nil }
        guard options.contains(value.text) else {
            let hint = value.shown.hasPrefix("value from") ? "" : NameSuggester.hint(for: value.text, in: options)
            error("expected \(expected), got \(value.shown)\(hint)")
            return nil
        }
        return value.text
    }

    func choice<E: RawRepresentable & CaseIterable>(_: E.Type) -> E? where E.RawValue == String {
        choice(E.allCases.map(\.rawValue)).flatMap(E.init(rawValue:))
    }

    /// A name that must be a key of another section (`routes[0].upstream` → `upstreams`).
    func reference(to kind: String, among names: [String]) -> String? {
        guard let value = scalar() else { return nil }
        guard names.contains(value.text) else {
            let hint = value.shown.hasPrefix("value from") ? "" : NameSuggester.hint(for: value.text, in: names)
            error("unknown \(kind) \(value.shown)\(hint)")
            return nil
        }
        return value.text
    }

    // MARK: Collections

    func mapping() -> ConfigMapping? {
        guard case .mapping(let mapping) = node else {
            typeMismatch("a mapping")
            return nil
        }
        return ConfigMapping(self, mapping)
    }

    func list() -> [ConfigNode]? {
        guard case .sequence(let sequence) = node else {
            typeMismatch("a list")
            return nil
        }
        return sequence.enumerated().map {
            ConfigNode(node: $1, path: "\(path)[\($0)]", context: context)
        }
    }

    /// A list of strings; items that fail are reported and left out.
    func stringList(_ item: (ConfigNode) -> String? = { $0.string() }) -> [String]? {
        list()?.compactMap(item)
    }
}
