import Foundation

/// `ConfigSchema` as a Markdown reference page: what `portico schema --markdown` prints and
/// `docs/configuration.md` holds (`DocumentationTests` fails when the two differ).
///
/// One heading per section, in declaration order, depth first: the top level, then each section
/// at its key path (`listen.tls`, `upstreams.NAME`, `routes[].match`), each `type:` of a typed
/// section on its own (`middleware.NAME, type: cache`). A section reached again by another path
/// (the client `tls` keys of upstreams, token endpoints and stores) is written once and linked.
/// Each key's row: its type in words, whether it is required, its default and its description.
extension ConfigSchema {
    /// The page, ending with a newline.
    public static func markdownText() -> String {
        var page = MarkdownReference()
        page.collect(root, heading: "Top level", path: "", suffix: "", typeWord: nil)
        return page.render()
    }

    /// The default a key's description states: `…; default 30s.` gives `30s`, `override
    /// (default) or keep_if_present` gives `override`. Descriptions are the one place defaults are
    /// written, so the page reads them there rather than keeping a second copy to drift.
    static func stated(defaultIn description: String) -> String? {
        // "WORD (default…": the word before it is the default.
        if let marker = description.range(of: " (default") {
            let word = description[..<marker.lowerBound].split(separator: " ").last.map(String.init) ?? ""
            return word.isEmpty ? nil : word
        }
        // "default X" or "Default: X", up to the end of its clause; "defaults" is another word.
        var searchStart = description.startIndex
        while let found = description.range(of: "default", options: .caseInsensitive, range: searchStart..<description.endIndex) {
            searchStart = found.upperBound
            let before = found.lowerBound == description.startIndex ? " " : description[description.index(before: found.lowerBound)]
            guard before == " ", found.upperBound < description.endIndex else { continue }
            let next = description[found.upperBound]
            guard next == " " || next == ":" else { continue }
            var rest = description[found.upperBound...].drop { $0 == ":" || $0 == " " }
            for end in ["; ", ". "] {
                if let stop = rest.range(of: end) { rest = rest[..<stop.lowerBound] }
            }
            if rest.hasSuffix(".") { rest = rest.dropLast() }
            let value = rest.trimmingCharacters(in: .whitespaces)
            return value.isEmpty || value.hasPrefix(")") ? nil : value
        }
        return nil
    }
}

/// Builds the page in two passes: first every section's heading (so a key can link to a
/// section written further down), then the tables.
struct MarkdownReference {
    struct Entry {
        var heading: String
        var section: ConfigSchema.Section
        /// The `type:` word of a typed section's variant.
        var typeWord: String?
    }

    private var entries: [Entry] = []
    /// A section's signature to the heading it was first written under.
    private var headings: [String: String] = [:]

    static func signature(_ section: ConfigSchema.Section, typeWord: String?) -> String {
        ([typeWord ?? "", section.description] + section.keys.map(\.name)).joined(separator: "\u{1F}")
    }

    /// GitHub's heading anchors: lower case, punctuation other than `-` and `_` dropped, spaces
    /// as hyphens.
    static func anchor(_ heading: String) -> String {
        var slug = ""
        for character in heading.lowercased() {
            if character == " " {
                slug.append("-")
            } else if character.isLetter || character.isNumber || character == "-" || character == "_" {
                slug.append(character)
            }
        }
        return slug
    }

    static func link(_ heading: String) -> String {
        "[`\(heading.replacingOccurrences(of: "`", with: ""))`](#\(anchor(heading)))"
    }

    mutating func collect(_ section: ConfigSchema.Section, heading: String, path: String, suffix: String, typeWord: String?) {
        let signature = Self.signature(section, typeWord: typeWord)
        guard headings[signature] == nil else { return }
        headings[signature] = heading
        entries.append(Entry(heading: heading, section: section, typeWord: typeWord))
        for key in section.keys {
            collect(key.value, path: path.isEmpty ? key.name : "\(path).\(key.name)", suffix: suffix)
        }
    }

    private mutating func collect(_ value: ConfigSchema.Value, path: String, suffix: String) {
        switch value {
        case .section(let section):
            collect(section, heading: "`\(path)`\(suffix)", path: path, suffix: suffix, typeWord: nil)
        case .typed(let variants):
            for variant in variants {
                let variantSuffix = "\(suffix), type: \(variant.type)"
                collect(variant.section, heading: "`\(path)`\(variantSuffix)", path: path, suffix: variantSuffix, typeWord: variant.type)
            }
        case .list(let item, _, _):
            collect(item, path: "\(path)[]", suffix: suffix)
        case .map(let item, _):
            collect(item, path: "\(path).NAME", suffix: suffix)
        case .either(let values):
            for value in values { collect(value, path: path, suffix: suffix) }
        case .text, .nonEmptyText, .pattern, .integer, .boolean, .duration, .size, .rate, .percentage, .ratio, .choice, .url, .reference:
            break
        }
    }

    func render() -> String {
        var page = """
            # Configuration reference

            <!-- Generated by `portico schema --markdown > docs/configuration.md` from
                 Sources/Portico/Config/ConfigSchema.swift; DocumentationTests fails when it is stale. -->

            Every section and key of Portico's YAML file, with its type, default and description,
            generated from the declarations the loader is checked against (`ConfigSchemaDriftTests`),
            so this page cannot fall behind the loader. `config/portico.yaml` is the commented
            reference file; `portico check --config FILE` validates a file without serving, and
            `portico schema` prints the same declarations as a JSON Schema for editors (see
            [Getting started](getting-started.md#editor-completion-the-json-schema)).

            Spellings: durations `250ms`, `10s`, `5m`, `1h`, `1.5s` or `0`; sizes `512B`, `64KiB`,
            `10MiB`, `1GiB` (binary), `10KB`, `10MB` (decimal) or a byte count; rates `100/s`, `6000/m`,
            `5/10s`; percentages `20%`. `${VAR}`, `${VAR:-default}` and `${file:/path}` are
            interpolated into values (the loader checks what they become); header value templates
            in `headers` rules are not (they take `${env:NAME}`). `NAME` in a path stands for a name
            you choose; `[]` for an item of a list.

            """
        for entry in entries {
            page += "\n## \(entry.heading)\n\n"
            page += entry.section.description + "\n"
            if let typeWord = entry.typeWord {
                page += "\nSelected by `type: \(typeWord)`.\n"
            }
            for rule in entry.section.rules {
                page += "\n" + Self.sentence(for: rule) + "\n"
            }
            page += "\n| key | type | required | default | description |\n|---|---|---|---|---|\n"
            for key in entry.section.keys {
                let cells = [
                    "`\(key.name)`",
                    typeText(key.value),
                    key.required ? "yes" : "",
                    ConfigSchema.stated(defaultIn: key.description).map(Self.defaultCell) ?? "",
                    key.description,
                ]
                page += "| " + cells.map(Self.cell).joined(separator: " | ") + " |\n"
            }
        }
        return page
    }

    static func sentence(for rule: ConfigSchema.Rule) -> String {
        switch rule {
        case .exactlyOne(let names): "Exactly one of \(names.map { "`\($0)`" }.joined(separator: ", "))."
        case .atLeastOne(let names): "At least one of \(names.map { "`\($0)`" }.joined(separator: ", "))."
        case .notTogether(let names): "Not \(names.map { "`\($0)`" }.joined(separator: " and ")) together."
        }
    }

    /// A value as code (`30s`, `round_robin`); words about one (`none`, `plain HTTP`) as prose.
    static func defaultCell(_ value: String) -> String {
        value.contains(" ") || ["none", "empty"].contains(value) ? value : "`\(value)`"
    }

    /// A table cell: pipes escaped, so a choice or a pattern cannot split the row.
    static func cell(_ text: String) -> String {
        text.replacingOccurrences(of: "|", with: "\\|")
    }

    func heading(of section: ConfigSchema.Section, typeWord: String?) -> String {
        headings[Self.signature(section, typeWord: typeWord)] ?? section.description
    }

    /// A value's kind in words.
    func typeText(_ value: ConfigSchema.Value) -> String {
        switch value {
        case .text: return "text"
        case .nonEmptyText: return "text, not empty"
        case .pattern(_, let note): return note
        case .integer(let range):
            return range.upperBound == .max ? "integer ≥ \(range.lowerBound)" : "integer \(range.lowerBound)–\(range.upperBound)"
        case .boolean: return "boolean"
        case .duration(let positive): return positive ? "duration > 0" : "duration"
        case .size(let minimum): return minimum == 1 ? "size" : minimum == 0 ? "size, 0 allowed" : "size ≥ \(minimum)"
        case .rate: return "rate"
        case .percentage: return "percentage"
        case .ratio: return "ratio 0–1 or percentage"
        case .choice(let options): return "one of " + options.map { "`\($0)`" }.joined(separator: ", ")
        case .url: return "http(s) URL"
        case .reference(let section): return "a name under `\(section):`"
        case .either(let values): return values.map(typeText).joined(separator: ", or ")
        case .list(let item, let unique, let nonEmpty):
            let qualifiers = [nonEmpty ? "not empty" : nil, unique ? "no repeats" : nil].compactMap { $0 }
            return "list of " + typeText(item) + (qualifiers.isEmpty ? "" : " (\(qualifiers.joined(separator: ", ")))")
        case .map(let item, let keys):
            return "map of " + (keys.map(typeText) ?? "name") + " to " + typeText(item)
        case .section(let section):
            return "section " + Self.link(heading(of: section, typeWord: nil))
        case .typed(let variants):
            return "by `type:` " + variants.map { Self.link(heading(of: $0.section, typeWord: $0.type)) }.joined(separator: ", ")
        }
    }
}
