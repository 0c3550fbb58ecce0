import Yams

/// What the loader asked of each mapping during one load: the evidence `ConfigSchemaDriftTests`
/// compares with `ConfigSchema`. Set on a `ConfigContext` by tests only; a normal load keeps
/// no record.
final class ConfigKeyRecorder {
    /// One mapping as the parsers left it.
    struct Read: Equatable {
        /// The mapping's key path as diagnostics print it (`routes[0].match`, `upstreams.orders`).
        var path: String
        /// Every key a parser asked for, present or not.
        var asked: Set<String>
        /// Whether the parser called `finish()`, refusing keys it did not ask for.
        var refusesUnknownKeys: Bool
        /// The mapping's `type:` word as written, when it has one.
        var type: String?
    }

    /// The mappings, kept until `reads()` (they reference the load's context, which holds this).
    var mappings: [ConfigMapping] = []

    init() {}

    /// The record, one entry per mapping (a `<<:` merge's source shares its target's path and
    /// is folded into it); clears the mappings kept.
    func reads() -> [Read] {
        var byPath: [String: Read] = [:]
        var order: [String] = []
        for mapping in mappings {
            let path = mapping.node.path
            var type: String?
            if let entry = mapping.entries.first(where: { $0.key == "type" }), case .scalar(let scalar) = entry.value.node {
                type = scalar.string
            }
            let read = Read(path: path, asked: Set(mapping.asked), refusesUnknownKeys: mapping.refusesUnknownKeys, type: type)
            if var existing = byPath[path] {
                existing.asked.formUnion(read.asked)
                existing.refusesUnknownKeys = existing.refusesUnknownKeys || read.refusesUnknownKeys
                existing.type = existing.type ?? read.type
                byPath[path] = existing
            } else {
                byPath[path] = read
                order.append(path)
            }
        }
        mappings = []
        return order.compactMap { byPath[$0] }
    }
}
