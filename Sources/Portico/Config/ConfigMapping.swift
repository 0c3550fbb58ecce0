import Yams

/// Reads one YAML mapping key by key. Every key a parser asks for is remembered, so
/// `finish()` can call the rest unknown and suggest the nearest known key — the allowed key
/// set is exactly what the parser reads, and cannot drift from it.
final class ConfigMapping {
    struct Entry {
        var key: String
        var keyNode: ConfigNode
        var value: ConfigNode
    }

    let node: ConfigNode
    /// In file order.
    private(set) var entries: [Entry] = []
    private(set) var asked: [String] = []
    /// Whether `finish()` ran: unknown keys in this mapping are refused.
    private(set) var refusesUnknownKeys = false

    init(_ node: ConfigNode, _ mapping: Node.Mapping) {
        self.node = node
        node.context.keyRecorder?.mappings.append(self)
        var merged: [Entry] = []
        for (key, value) in mapping {
            let keyNode = ConfigNode(node: key, path: node.path, context: node.context)
            guard case .scalar(let scalar) = key else {
                keyNode.error("expected a string key, got \(keyNode.shownKind)")
                continue
            }
            // `<<: *anchor` merges: explicit keys win, as YAML specifies.
            if scalar.string == "<<", scalar.style != .singleQuoted, scalar.style != .doubleQuoted {
                merged += Self.mergeEntries(value, into: node)
                continue
            }
            let entryKey = node.child(scalar.string, key)
            entries.append(Entry(key: scalar.string, keyNode: entryKey,
                                 value: node.child(scalar.string, value, keyLine: entryKey.line)))
        }
        for entry in merged where !entries.contains(where: { $0.key == entry.key }) {
            entries.append(entry)
        }
    }

    private static func mergeEntries(_ value: Node, into node: ConfigNode) -> [Entry] {
        switch value {
        case .mapping:
            return ConfigNode(node: value, path: node.path, context: node.context).mapping()?.entries ?? []
        case .sequence(let sources):
            return sources.flatMap { mergeEntries($0, into: node) }
        default:
            ConfigNode(node: value, path: node.path, context: node.context).typeMismatch("a mapping to merge")
            return []
        }
    }

    var keys: [String] { entries.map(\.key) }

    /// The value at `key`, or nil when absent or null. Marks the key as known.
    func value(_ key: String) -> ConfigNode? {
        guard let node = rawValue(key), !node.isNull else { return nil }
        return node
    }

    /// Like `value`, but null is returned rather than treated as absent.
    func rawValue(_ key: String) -> ConfigNode? {
        if !asked.contains(key) { asked.append(key) }
        return entries.first(where: { $0.key == key })?.value
    }

    /// Reports `missing required key` when absent.
    func required(_ key: String) -> ConfigNode? {
        guard let node = rawValue(key) else {
            error("missing required key \(key.quotedForMessage)")
            return nil
        }
        return node
    }

    /// Reports a problem with the mapping as a whole, at its own line (`ConfigNode.ownLine`).
    func error(_ message: String) {
        node.context.report(message, path: node.path, line: node.ownLine)
    }

    /// Parses `key` when present and stores it, keeping the default otherwise.
    func read<T>(_ key: String, into target: inout T, _ parse: (ConfigNode) -> T?) {
        if let node = value(key), let parsed = parse(node) {
            target = parsed
        }
    }

    /// Reports every key no parser asked for, with the nearest known key when close.
    func finish() {
        refusesUnknownKeys = true
        for entry in entries where !asked.contains(entry.key) {
            entry.keyNode.error("unknown key \(entry.key.quotedForMessage)"
                + NameSuggester.hint(for: entry.key, in: asked))
        }
    }
}
