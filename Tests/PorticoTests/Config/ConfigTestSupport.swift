import Portico
import Testing

/// The smallest valid tail: tests prepend what they exercise.
let minimalRoute = """
    routes:
      - name: ping
        match: { path: /ping }
        direct: { body: pong }
    """

/// Loads `yaml` as `portico.yaml` and returns the diagnostics' descriptions (empty when valid).
func diagnostics(_ yaml: String, environment: [String: String] = [:]) -> [String] {
    do throws(ConfigError) {
        _ = try ConfigLoader.load(yaml: yaml, source: "portico.yaml", environment: environment)
        return []
    } catch {
        return error.diagnostics.map(\.description)
    }
}

/// Loads `yaml`, recording an issue with all diagnostics when it fails.
func load(_ yaml: String, environment: [String: String] = [:],
          sourceLocation: SourceLocation = #_sourceLocation) throws -> PorticoConfig {
    do {
        return try ConfigLoader.load(yaml: yaml, source: "portico.yaml", environment: environment)
    } catch {
        Issue.record("unexpected diagnostics:\n\(error)", sourceLocation: sourceLocation)
        throw error
    }
}
