import Foundation
import Logging
import Portico
import Testing

/// The README and `docs/` against the code: each test fails when a page drifts from what it
/// describes. The rules the pages follow are written down in `docs/README.md`, "How these pages
/// are checked".
@Suite("Documentation: README and docs/ match the code")
struct DocumentationTests {
    /// The package root, found from this file: Tests/PorticoTests/Docs/DocumentationTests.swift.
    static let root = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    static let regenerate = "swift run portico schema --markdown > docs/configuration.md"

    /// README.md and every page under docs/, as paths relative to the root.
    static func pages() throws -> [String] {
        let docs = try FileManager.default.contentsOfDirectory(atPath: root.appendingPathComponent("docs").path)
        return ["README.md"] + docs.filter { $0.hasSuffix(".md") }.sorted().map { "docs/\($0)" }
    }

    static func read(_ relativePath: String) throws -> String {
        try String(contentsOf: root.appendingPathComponent(relativePath), encoding: .utf8)
    }

    static func directories(in relativePath: String) throws -> Set<String> {
        let url = root.appendingPathComponent(relativePath)
        let names = try FileManager.default.contentsOfDirectory(atPath: url.path)
        return Set(names.filter { name in
            var isDirectory: ObjCBool = false
            return FileManager.default.fileExists(atPath: url.appendingPathComponent(name).path, isDirectory: &isDirectory)
                && isDirectory.boolValue
        })
    }

    // MARK: The front page

    @Test("the README stays a front page: at most 200 lines, the two quick-start commands, links into docs/")
    func readmeIsAFrontPage() throws {
        let readme = try Self.read("README.md")
        let lines = readme.components(separatedBy: "\n")
        #expect(lines.count <= 201, "README.md has \(lines.count) lines: move reference and guides to docs/")
        #expect(lines.contains { $0.hasPrefix("bash scripts/demo ") } && lines.contains { $0.hasPrefix("bash scripts/test ") })
        #expect(try Self.links(in: "README.md").filter { $0.target.hasPrefix("docs/") }.count >= 14)
    }

    // MARK: The generated reference

    @Test("docs/configuration.md is what `portico schema --markdown` prints now")
    func configurationReferenceIsCurrent() throws {
        let expected = ConfigSchema.markdownText()
        let written = (try? Self.read("docs/configuration.md")) ?? ""
        guard written != expected else { return }
        let writtenLines = written.components(separatedBy: "\n")
        let expectedLines = expected.components(separatedBy: "\n")
        let first = zip(writtenLines, expectedLines).enumerated().first { $0.element.0 != $0.element.1 }?.offset
            ?? min(writtenLines.count, expectedLines.count)
        Issue.record("""
            docs/configuration.md is stale (first difference at line \(first + 1)); regenerate it with
              \(Self.regenerate)
            written:  \(first < writtenLines.count ? writtenLines[first] : "<end of file>")
            expected: \(first < expectedLines.count ? expectedLines[first] : "<end of file>")
            """)
    }

    @Test("the rendered reference has the top-level rows and headings for nested, listed, mapped and typed sections")
    func referenceCoversTheSchema() {
        let page = ConfigSchema.markdownText()
        for section in ["listen", "admin", "logging", "tracing", "upstreams", "credentials", "stores", "middleware", "defaults", "routes"] {
            #expect(page.contains("| `\(section)` |"), "no row for \(section)")
        }
        for heading in ["## `listen`", "## `listen.tls`", "## `upstreams.NAME`", "## `upstreams.NAME.tls`",
                        "## `credentials.NAME`, type: static", "## `middleware.NAME`, type: cache", "## `routes[]`",
                        "## `routes[].match`", "## `middleware.NAME.backoff`, type: retry"] {
            #expect(page.contains("\n\(heading)\n"), "no heading \(heading)")
        }
        // Defaults are read from the descriptions; both spellings come out.
        #expect(page.contains("| `request_timeout` | duration > 0 |  | `30s` |"))
        #expect(page.contains("| `client_header` | one of `override`, `keep_if_present` |  | `override` |"))
    }

    // MARK: Complete examples

    /// A fenced ```yaml block and the line it starts on.
    struct YAMLBlock {
        var page: String
        var line: Int
        var text: String
        /// A complete example has a top-level `routes:` key; anything else is a fragment.
        var isComplete: Bool { text.split(separator: "\n").contains { $0.hasPrefix("routes:") } }
    }

    static func yamlBlocks(in page: String) throws -> [YAMLBlock] {
        var blocks: [YAMLBlock] = []
        var current: (line: Int, lines: [String])?
        var inOtherFence = false
        for (index, line) in try read(page).components(separatedBy: "\n").enumerated() {
            if var block = current {
                if line.hasPrefix("```") {
                    blocks.append(YAMLBlock(page: page, line: block.line, text: block.lines.joined(separator: "\n") + "\n"))
                    current = nil
                } else {
                    block.lines.append(line)
                    current = block
                }
            } else if line.hasPrefix("```") {
                if !inOtherFence, line.trimmingCharacters(in: .whitespaces) == "```yaml" {
                    current = (index + 1, [])
                } else {
                    inOtherFence.toggle()
                }
            }
        }
        return blocks
    }

    /// Every `${NAME}` (and `${env:NAME}` of header rules) a block refers to, set to a value.
    static func environment(for text: String) throws -> [String: String] {
        let reference = try Regex(#"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)"#)
        var environment: [String: String] = [:]
        for match in text.matches(of: reference) {
            if let name = match.output[1].substring { environment[String(name)] = "docs-example-value" }
        }
        return environment
    }

    static func completeExamples() throws -> [YAMLBlock] {
        try pages().flatMap(yamlBlocks).filter(\.isComplete)
    }

    @Test("the README and the guides have complete examples to check")
    func thereAreCompleteExamples() throws {
        let examples = try Self.completeExamples()
        #expect(examples.contains { $0.page == "README.md" }, "the README's example must be complete (a top-level routes: key)")
        #expect(Set(examples.map(\.page)).count >= 8)
    }

    @Test("every complete YAML example loads as `portico check` loads it, runtime included")
    func completeExamplesLoad() async throws {
        let logger = Logger(label: "docs", factory: { _ in SwiftLogNoOpLogHandler() })
        for example in try Self.completeExamples() {
            let place = "\(example.page):\(example.line + 1)"
            do {
                let config = try ConfigLoader.load(yaml: example.text, source: place, environment: Self.environment(for: example.text))
                let runtime = try GatewayRuntime(config: config, logger: logger)
                await runtime.shutdown()
            } catch {
                Issue.record("the example at \(place) does not pass portico check:\n\(error)")
            }
        }
    }

    // MARK: Metric names

    /// Every metric name the code declares: the `"portico_…"` string literals in Sources/.
    static func declaredMetricNames() throws -> Set<String> {
        let literal = try Regex(#""(portico_[a-z0-9_]+)""#)
        return try Set(sourceFiles(ending: ".swift").flatMap { file in
            try String(contentsOf: file, encoding: .utf8).matches(of: literal).compactMap { $0.output[1].substring.map(String.init) }
        })
    }

    /// The C shim's `portico_…` identifiers, which the architecture page may name: not metrics.
    static func shimIdentifiers() throws -> Set<String> {
        let identifier = try Regex(#"portico_[a-z0-9_]+"#)
        return try Set(sourceFiles(ending: ".h").flatMap { file in
            try String(contentsOf: file, encoding: .utf8).matches(of: identifier).map { String($0.output[0].substring ?? "") }
        })
    }

    static func sourceFiles(ending suffix: String) throws -> [URL] {
        let sources = root.appendingPathComponent("Sources")
        guard let walker = FileManager.default.enumerator(at: sources, includingPropertiesForKeys: nil) else { return [] }
        return walker.compactMap { $0 as? URL }.filter { $0.path.hasSuffix(suffix) }
    }

    @Test("the code declares metric names, and the scan finds the ones every gateway exports")
    func metricScanFindsNames() throws {
        let names = try Self.declaredMetricNames()
        #expect(names.isSuperset(of: ["portico_requests_total", "portico_request_duration_seconds", "portico_in_flight_requests",
                                      "portico_cache_hits_total", "portico_retries_total", "portico_websocket_sessions"]))
    }

    @Test("every metric name the README and docs/ mention is one the code declares")
    func mentionedMetricsExist() throws {
        let declared = try Self.declaredMetricNames()
        let shim = try Self.shimIdentifiers()
        let mention = try Regex(#"portico_[a-z0-9_]*[a-z0-9]"#)
        for page in try Self.pages() {
            for match in try Self.read(page).matches(of: mention) {
                let name = String(match.output[0].substring ?? "")
                let base = ["_bucket", "_sum", "_count"].first(where: { name.hasSuffix($0) }).map { String(name.dropLast($0.count)) }
                guard !declared.contains(name), !(base.map(declared.contains) ?? false), !shim.contains(name) else { continue }
                Issue.record("\(page) mentions \(name), which no code in Sources/ declares")
            }
        }
    }

    // MARK: The architecture page

    /// The rows of the architecture page's module table: first cell, second cell.
    static func moduleRows() throws -> [(targets: String, contents: String)] {
        let page = try read("docs/ARCHITECTURE.md")
        let section = try #require(page.components(separatedBy: "\n## Modules\n").dropFirst().first, "docs/ARCHITECTURE.md has no \"## Modules\" section")
        let body = section.components(separatedBy: "\n## ").first ?? section
        return body.components(separatedBy: "\n").filter { $0.hasPrefix("| `") }.compactMap { row in
            let cells = row.split(separator: "|", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            return cells.count >= 3 ? (cells[1], cells[2]) : nil
        }
    }

    static func backticked(_ text: String) throws -> [String] {
        try text.matches(of: Regex(#"`([^`]+)`"#)).compactMap { $0.output[1].substring.map(String.init) }
    }

    @Test("the module table names every target in Sources/, and nothing else")
    func moduleTableMatchesSources() throws {
        let listed = try Set(Self.moduleRows().flatMap { try Self.backticked($0.targets) })
        let targets = try Self.directories(in: "Sources")
        #expect(listed == targets, "docs/ARCHITECTURE.md's module table: missing \(targets.subtracting(listed).sorted()), not in Sources/ \(listed.subtracting(targets).sorted())")
    }

    @Test("the Portico row lists every folder of Sources/Portico, and nothing else")
    func folderListMatchesSources() throws {
        let row = try #require(try Self.moduleRows().first { $0.targets == "`Portico`" }, "no `Portico` row in the module table")
        let listed = try Set(Self.backticked(row.contents).filter { $0.hasSuffix("/") }.map { String($0.dropLast()) })
        let folders = try Self.directories(in: "Sources/Portico")
        #expect(listed == folders, "docs/ARCHITECTURE.md's Portico row: missing \(folders.subtracting(listed).sorted()), not in Sources/Portico \(listed.subtracting(folders).sorted())")
    }

    // MARK: Links

    /// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces as
    /// hyphens; a repeated heading gets `-1`, `-2`…
    static func anchors(in page: String) throws -> Set<String> {
        var anchors: Set<String> = []
        var inFence = false
        for line in try read(page).components(separatedBy: "\n") {
            if line.hasPrefix("```") { inFence.toggle() }
            guard !inFence, line.hasPrefix("#"), let space = line.firstIndex(of: " ") else { continue }
            guard line[..<space].allSatisfy({ $0 == "#" }) else { continue }
            var slug = ""
            for character in line[line.index(after: space)...].lowercased() {
                if character == " " {
                    slug.append("-")
                } else if character.isLetter || character.isNumber || character == "-" || character == "_" {
                    slug.append(character)
                }
            }
            var unique = slug
            var count = 0
            while anchors.contains(unique) {
                count += 1
                unique = "\(slug)-\(count)"
            }
            anchors.insert(unique)
        }
        return anchors
    }

    /// Every Markdown link target outside code blocks, with its line.
    static func links(in page: String) throws -> [(line: Int, target: String)] {
        let link = try Regex(#"\]\(([^)\s]+)\)"#)
        var found: [(Int, String)] = []
        var inFence = false
        for (index, line) in try read(page).components(separatedBy: "\n").enumerated() {
            if line.hasPrefix("```") { inFence.toggle() }
            guard !inFence else { continue }
            for match in line.matches(of: link) {
                if let target = match.output[1].substring { found.append((index + 1, String(target))) }
            }
        }
        return found
    }

    @Test("every relative link in the README and docs/ reaches a file, and its #heading a heading there")
    func relativeLinksResolve() throws {
        var checked = 0
        for page in try Self.pages() {
            let directory = (page as NSString).deletingLastPathComponent
            for (line, target) in try Self.links(in: page) where !target.contains("://") && !target.hasPrefix("mailto:") {
                checked += 1
                let parts = target.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
                let file = parts[0].isEmpty ? page : ((directory as NSString).appendingPathComponent(parts[0]) as NSString).standardizingPath
                guard FileManager.default.fileExists(atPath: Self.root.appendingPathComponent(file).path) else {
                    Issue.record("\(page):\(line) links to \(target): no file \(file)")
                    continue
                }
                if parts.count == 2, file.hasSuffix(".md"), try !Self.anchors(in: file).contains(parts[1]) {
                    Issue.record("\(page):\(line) links to \(target): \(file) has no heading with anchor #\(parts[1])")
                }
            }
        }
        #expect(checked >= 30)
    }
}
