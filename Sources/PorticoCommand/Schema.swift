import ArgumentParser
import Portico

/// `portico schema`: the configuration file's JSON Schema, for editors (yaml-language-server's
/// `# yaml-language-server: $schema=…` line) and validators; with `--markdown`, the same
/// declarations as the reference page `docs/configuration.md`.
struct Schema: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the JSON Schema (draft 2020-12) of the configuration file, or with --markdown its reference page.",
        discussion: "portico schema > portico.schema.json, then put `# yaml-language-server: $schema=portico.schema.json` at the top of the YAML file. portico schema --markdown > docs/configuration.md regenerates the documentation's configuration reference.")

    @Flag(help: "Print the configuration reference as Markdown (docs/configuration.md) instead of the JSON Schema.")
    var markdown = false

    func run() {
        print(markdown ? ConfigSchema.markdownText() : ConfigSchema.jsonText(), terminator: "")
    }
}
