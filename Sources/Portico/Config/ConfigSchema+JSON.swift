/// `ConfigSchema` as a JSON Schema (draft 2020-12): what `portico schema` prints.
///
/// Every value is read by the loader after `${…}` interpolation, so wherever a number, a boolean
/// or a spelled value (`30s`, `10MiB`) stands, a string holding a `${…}` reference is accepted
/// too: the loader checks the interpolated value.
extension ConfigSchema {
    /// `$id` of the printed schema (its name, not a location it is fetched from).
    public static let identifier = "https://portico.example/schemas/portico-config.schema.json"

    /// The schema as pretty-printed JSON, keys in declaration order, ending with a newline.
    public static func jsonText() -> String {
        var output = ""
        jsonSchema().write(to: &output, indent: "")
        return output + "\n"
    }

    static func jsonSchema() -> SchemaJSON {
        var document = section(root)
        document.prepend([
            ("$schema", .string("https://json-schema.org/draft/2020-12/schema")),
            ("$id", .string(identifier)),
            ("title", .string("Portico configuration")),
        ])
        guard case .object(let entries) = document else { return document }
        return .object(entries + [("$defs", .object([("interpolated", interpolatedDefinition)]))])
    }

    // MARK: Values

    /// A string holding a `${VAR}`, `${VAR:-default}` or `${file:…}` reference.
    static let interpolatedDefinition: SchemaJSON = .object([
        ("type", .string("string")),
        ("pattern", .string("\\$\\{")),
        ("description", .string("interpolated when loaded (${VAR}, ${VAR:-default}, ${file:path}); the loader checks the value")),
    ])

    static let interpolated: SchemaJSON = .object([("$ref", .string("#/$defs/interpolated"))])

    static let decimal = "[0-9]+(\\.[0-9]+)?"
    static let durationPattern = "^(0|\(decimal)(ms|s|m|h))$"
    static let zeroDurationPattern = "^0+(\\.0+)?(ms|s|m|h)?$"
    static let sizePattern = "^([0-9]+|\(decimal)(KiB|MiB|GiB|TiB|KB|MB|GB|TB|B))$"
    static let ratePattern = "^\(decimal)/(ms|s|m|h|\(decimal)(ms|s|m|h))$"
    static let percentagePattern = "^\(decimal)%$"
    static let booleanWords = ["true", "True", "TRUE", "false", "False", "FALSE", "yes", "Yes", "YES",
                               "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF"]

    static func schema(for value: Value) -> SchemaJSON {
        switch value {
        case .text:
            return .object([("type", .array([.string("string"), .string("number"), .string("boolean")]))])
        case .nonEmptyText:
            return .object([("anyOf", .array([
                .object([("type", .string("string")), ("minLength", .int(1))]),
                .object([("type", .array([.string("number"), .string("boolean")]))]),
            ]))])
        case .pattern(let pattern, let note):
            return spelled([("type", .string("string")), ("pattern", .string(pattern)), ("description", .string(note))])
        case .integer(let range):
            var integer: [(String, SchemaJSON)] = [("type", .string("integer")), ("minimum", .int(range.lowerBound))]
            if range.upperBound != .max { integer.append(("maximum", .int(range.upperBound))) }
            return spelled(integer, textual: "^[0-9]+$")
        case .boolean:
            return spelled([("type", .string("boolean"))], words: booleanWords)
        case .duration(let positive):
            var text: [(String, SchemaJSON)] = [("type", .string("string")), ("pattern", .string(durationPattern)),
                                                ("description", .string(positive ? "a duration greater than 0: 250ms, 10s, 5m, 1h, 1.5s"
                                                                                 : "a duration: 250ms, 10s, 5m, 1h, 1.5s or 0"))]
            if positive {
                text.append(("not", .object([("pattern", .string(zeroDurationPattern))])))
                return spelled(text)
            }
            return .object([("anyOf", .array([.object(text), .object([("const", .int(0))]), interpolated]))])
        case .size(let minimum):
            return .object([("anyOf", .array([
                .object([("type", .string("integer")), ("minimum", .int(minimum))]),
                .object([("type", .string("string")), ("pattern", .string(sizePattern)),
                         ("description", .string("a size: 512B, 64KiB, 10MiB, 1GiB (binary), 10KB, 10MB, 1GB (decimal) or a byte count"
                                                 + (minimum > 0 ? ", at least \(minimum)" : "")))]),
                interpolated,
            ]))])
        case .rate:
            return spelled([("type", .string("string")), ("pattern", .string(ratePattern)),
                            ("description", .string("a rate: 100/s, 6000/m, 10/h, 5/10s"))])
        case .percentage:
            return spelled([("type", .string("string")), ("pattern", .string(percentagePattern)),
                            ("description", .string("a percentage from 0% to 100%"))])
        case .ratio:
            return .object([("anyOf", .array([
                .object([("type", .string("number")), ("minimum", .int(0)), ("maximum", .int(1))]),
                .object([("type", .string("string")), ("pattern", .string("^([0-9]+(\\.[0-9]+)?%|[01](\\.[0-9]+)?)$"))]),
                interpolated,
            ]))])
        case .choice(let options):
            // A word that YAML reads as a number (`1.2`) is the same word to the loader.
            var choices = options.map(SchemaJSON.string)
            choices += options.compactMap { option in
                option.allSatisfy({ $0.isNumber || $0 == "." }) ? Double(option).map(SchemaJSON.number) : nil
            }
            return spelled([("enum", .array(choices))])
        case .url:
            return spelled([("type", .string("string")), ("pattern", .string("^[Hh][Tt][Tt][Pp][Ss]?://[^/?#]")),
                            ("description", .string("an http:// or https:// URL"))])
        case .reference(let section):
            return .object([("type", .string("string")), ("minLength", .int(1)),
                            ("description", .string("a name under \(section):"))])
        case .either(let values):
            return .object([("anyOf", .array(values.map(schema(for:))))])
        case .list(let item, let unique, let nonEmpty):
            var list: [(String, SchemaJSON)] = [("type", .string("array")), ("items", schema(for: item))]
            if unique { list.append(("uniqueItems", .bool(true))) }
            if nonEmpty { list.append(("minItems", .int(1))) }
            return .object(list)
        case .map(let item, let keys):
            var map: [(String, SchemaJSON)] = [("type", .string("object"))]
            if case .pattern(let pattern, _)? = keys {
                map.append(("propertyNames", .object([("pattern", .string(pattern))])))
            }
            map.append(("additionalProperties", schema(for: item)))
            return .object(map)
        case .section(let section):
            return self.section(section)
        case .typed(let variants):
            return typed(variants)
        }
    }

    /// `schema`, or the same value as a string the loader reads alike (`"8080"`, `"yes"`), or
    /// an interpolated string.
    static func spelled(_ schema: [(String, SchemaJSON)], textual pattern: String? = nil, words: [String] = []) -> SchemaJSON {
        var options: [SchemaJSON] = [.object(schema)]
        if let pattern { options.append(.object([("type", .string("string")), ("pattern", .string(pattern))])) }
        if !words.isEmpty { options.append(.object([("enum", .array(words.map(SchemaJSON.string)))])) }
        options.append(interpolated)
        return .object([("anyOf", .array(options))])
    }

    // MARK: Sections

    static func section(_ section: Section, extraProperties: [(String, SchemaJSON)] = []) -> SchemaJSON {
        var properties = extraProperties
        for key in section.keys {
            var property = schema(for: key.value)
            property.describe(key.description)
            properties.append((key.name, property))
        }
        var object: [(String, SchemaJSON)] = [
            ("description", .string(section.description)),
            ("type", .string("object")),
            ("properties", .object(properties)),
        ]
        let required = section.keys.filter(\.required).map(\.name)
        if !required.isEmpty { object.append(("required", .array(required.map(SchemaJSON.string)))) }
        object.append(("additionalProperties", .bool(false)))
        var constraints: [SchemaJSON] = []
        for rule in section.rules {
            switch rule {
            case .exactlyOne(let names):
                constraints.append(.object([("oneOf", .array(names.map { .object([("required", .array([.string($0)]))]) }))]))
            case .atLeastOne(let names):
                constraints.append(.object([("anyOf", .array(names.map { .object([("required", .array([.string($0)]))]) }))]))
            case .notTogether(let names):
                constraints.append(.object([("not", .object([("required", .array(names.map(SchemaJSON.string)))]))]))
            }
        }
        if !constraints.isEmpty { object.append(("allOf", .array(constraints))) }
        return .object(object)
    }

    /// `type:` picks the section: each variant is closed over its own keys plus `type`.
    static func typed(_ variants: [(type: String, section: Section)]) -> SchemaJSON {
        let names = variants.map { SchemaJSON.string($0.type) }
        let branches: [SchemaJSON] = variants.map { variant in
            .object([
                ("if", .object([("properties", .object([("type", .object([("const", .string(variant.type))]))])),
                                ("required", .array([.string("type")]))])),
                ("then", section(variant.section, extraProperties: [("type", .object([("const", .string(variant.type))]))])),
            ])
        }
        return .object([
            ("type", .string("object")),
            ("required", .array([.string("type")])),
            ("properties", .object([("type", .object([("description", .string("what kind this is; the other keys depend on it")),
                                                       ("enum", .array(names))]))])),
            ("allOf", .array(branches)),
        ])
    }
}

/// JSON with object keys kept in the order written (`$schema` first, keys as declared).
enum SchemaJSON: Sendable {
    case string(String)
    case int(Int)
    case number(Double)
    case bool(Bool)
    case array([SchemaJSON])
    case object([(String, SchemaJSON)])

    /// Puts `entries` first in an object; other values are left alone.
    mutating func prepend(_ entries: [(String, SchemaJSON)]) {
        guard case .object(let existing) = self else { return }
        self = .object(entries + existing)
    }

    /// Sets an object's `description`, first (a section's own is replaced by the key's).
    mutating func describe(_ text: String) {
        guard case .object(let existing) = self else { return }
        self = .object([("description", .string(text))] + existing.filter { $0.0 != "description" })
    }

    func write(to output: inout String, indent: String) {
        switch self {
        case .string(let text): Self.quote(text, into: &output)
        case .int(let number): output += String(number)
        case .number(let number): output += number == number.rounded() && abs(number) < 1e15 ? String(Int(number)) : String(number)
        case .bool(let flag): output += flag ? "true" : "false"
        case .array(let items):
            // Short lists of scalars stay on one line.
            if items.allSatisfy(\.isScalar), items.count <= 20 {
                output += "["
                for (index, item) in items.enumerated() {
                    if index > 0 { output += ", " }
                    item.write(to: &output, indent: indent)
                }
                output += "]"
                return
            }
            output += "[\n"
            for (index, item) in items.enumerated() {
                output += indent + "  "
                item.write(to: &output, indent: indent + "  ")
                output += index == items.count - 1 ? "\n" : ",\n"
            }
            output += indent + "]"
        case .object(let entries):
            if entries.isEmpty {
                output += "{}"
                return
            }
            output += "{\n"
            for (index, (key, value)) in entries.enumerated() {
                output += indent + "  "
                Self.quote(key, into: &output)
                output += ": "
                value.write(to: &output, indent: indent + "  ")
                output += index == entries.count - 1 ? "\n" : ",\n"
            }
            output += indent + "}"
        }
    }

    private var isScalar: Bool {
        switch self {
        case .array, .object: false
        default: true
        }
    }

    private static func quote(_ text: String, into output: inout String) {
        output += "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": output += "\\\""
            case "\\": output += "\\\\"
            case "\n": output += "\\n"
            case "\r": output += "\\r"
            case "\t": output += "\\t"
            case let c where c.value < 0x20:
                let hex = String(c.value, radix: 16)
                output += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: output.unicodeScalars.append(scalar)
            }
        }
        output += "\""
    }
}
