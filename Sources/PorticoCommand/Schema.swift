import ArgumentParser
import Portico

/// `portico schema`: the configuration file's JSON Schema, for editors (yaml-language-server's
/// `# yaml-language-server: $schema=…` line) and validators.
struct Schema: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the JSON Schema (draft 2020-12) of the configuration file.",
        discussion: "portico schema > portico.schema.json, then put `# yaml-language-server: $schema=portico.schema.json` at the top of the YAML file.")

    func run() {
        print(ConfigSchema.jsonText(), terminator: "")
    }
}
