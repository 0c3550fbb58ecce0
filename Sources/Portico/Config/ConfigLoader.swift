import Foundation
import Yams

/// Turns a YAML file into a validated `PorticoConfig`, or a `ConfigError` listing every problem
/// with file, line and key path. The file is composed into nodes (not decoded with Codable) so
/// each value keeps its line, and interpolation happens per scalar after composing.
public enum ConfigLoader {
    /// Loads `path`. Diagnostics name the file as given, so `config/portico.yaml` stays that.
    /// Relative `${file:…}` paths are resolved against the file's directory.
    public static func load(file path: String,
                            environment: [String: String] = ProcessInfo.processInfo.environment)
        throws(ConfigError) -> PorticoConfig {
        func fail(_ message: String) -> ConfigError {
            ConfigError(diagnostics: [ConfigDiagnostic(file: path, line: nil, path: "", message: message)])
        }
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw fail("cannot read configuration file (no such file)")
        }
        guard !isDirectory.boolValue, let data = FileManager.default.contents(atPath: path) else {
            throw fail("cannot read configuration file (\(isDirectory.boolValue ? "is a directory" : "permission denied"))")
        }
        guard let yaml = String(data: data, encoding: .utf8) else {
            throw fail("configuration file is not valid UTF-8")
        }
        let directory = NSString(string: path).deletingLastPathComponent
        return try load(yaml: yaml, source: path, environment: environment,
                        baseDirectory: directory.isEmpty ? nil : directory)
    }

    /// Loads YAML text; `source` names it in diagnostics and becomes `PorticoConfig.source`.
    public static func load(yaml: String, source: String = "<embedded>",
                            environment: [String: String] = ProcessInfo.processInfo.environment)
        throws(ConfigError) -> PorticoConfig {
        try load(yaml: yaml, source: source, environment: environment, baseDirectory: nil)
    }

    /// `registry`: the middleware types `type:` may name (tests add their own).
    /// `keyRecorder`: collects every mapping read (the schema drift test).
    static func load(yaml: String, source: String, environment: [String: String],
                     baseDirectory: String?, registry: MiddlewareRegistry = .standard,
                     keyRecorder: ConfigKeyRecorder? = nil) throws(ConfigError) -> PorticoConfig {
        let root: Node?
        do {
            root = try Yams.compose(yaml: yaml)
        } catch {
            throw ConfigError(diagnostics: [syntaxDiagnostic(error, file: source)])
        }
        let context = ConfigContext(file: source,
                                    interpolator: Interpolator(environment: environment, baseDirectory: baseDirectory))
        context.keyRecorder = keyRecorder
        var config = PorticoConfig(source: source)
        if let root {
            parseRoot(ConfigNode(node: root, path: "", context: context), into: &config, registry: registry)
        } else {
            context.report("the file is empty: missing required key \"routes\"", path: "", line: 1)
        }
        guard context.diagnostics.isEmpty else {
            // File order reads best; problems without a line (missing sections) go last.
            let sorted = context.diagnostics.enumerated()
                .sorted { ($0.element.line ?? .max, $0.offset) < ($1.element.line ?? .max, $1.offset) }
                .map(\.element)
            throw ConfigError(diagnostics: sorted)
        }
        config.warnings = context.warnings
        return config
    }

    private static func parseRoot(_ root: ConfigNode, into config: inout PorticoConfig, registry: MiddlewareRegistry) {
        guard let m = root.mapping() else { return }
        let upstreams = m.value("upstreams")?.mapping()
        let credentials = m.value("credentials")?.mapping()
        let middleware = m.value("middleware")?.mapping()
        let stores = m.value("stores")?.mapping()
        // Names first, so references resolve whatever the section order.
        var names = ConfigNames(upstreams: upstreams?.keys ?? [], credentials: credentials?.keys ?? [],
                                middleware: middleware?.keys ?? [])
        names.stores = stores?.keys ?? []

        var listenMapping: ConfigMapping?
        m.read("listen", into: &config.listen) { node in
            listenMapping = node.mapping()
            return listenMapping.map(ListenConfig.parse)
        }
        let adminMapping = m.value("admin")?.mapping()
        config.admin = adminMapping.map(AdminConfig.parse) ?? AdminConfig()
        m.read("logging", into: &config.logging) { $0.mapping().map(LoggingConfig.parse) }

        for entry in upstreams?.entries ?? [] {
            if let section = entry.value.mapping(), let upstream = UpstreamConfig.parse(section, name: entry.key, names: names) {
                config.upstreams[entry.key] = upstream
            }
        }
        for entry in credentials?.entries ?? [] {
            if let section = entry.value.mapping(), let credential = CredentialConfig.parse(section, names: names) {
                config.credentials[entry.key] = credential
            }
        }
        for entry in stores?.entries ?? [] {
            if let section = entry.value.mapping(), let store = StoreConfig.parse(section) {
                config.stores[entry.key] = store
            }
        }
        for entry in middleware?.entries ?? [] {
            if let section = entry.value.mapping(), let parsed = MiddlewareConfig.parse(section, names: names, registry: registry) {
                config.middleware[entry.key] = parsed
            }
        }
        m.read("defaults", into: &config.defaults) { $0.mapping().map { DefaultsConfig.parse($0, names: names) } }
        m.read("tracing", into: &config.tracing) { $0.mapping().flatMap(TracingConfig.parse) }

        names.upstreamTransports = config.upstreams.mapValues(\.transport)
        names.middlewareTypes = config.middleware.mapValues(\.typeName)
        names.defaultMiddleware = config.defaults.middleware
        if let routes = m.required("routes"), !routes.isNull {
            config.routes = RouteConfig.parseList(routes, names: names)
            if case .sequence(let items) = routes.node, items.isEmpty {
                routes.error("no routes defined")
            }
        } else if let routes = m.rawValue("routes") {
            root.context.report("no routes defined", path: routes.path, line: routes.ownLine)
        }
        m.finish()

        let admin = config.admin, listen = config.listen
        let wildcard: Set<String> = ["0.0.0.0", "::", "[::]"]
        if admin.enabled, admin.port != 0, admin.port == listen.port,
           admin.address == listen.address || wildcard.contains(admin.address) || wildcard.contains(listen.address) {
            let message = "port \(admin.port) is already used by listen.port"
            if let portNode = adminMapping?.value("port") {
                portNode.error(message)
            } else if let listenPort = listenMapping?.value("port") {
                listenPort.error("port \(listen.port) is also the admin listener's default (admin.port): set another admin.port")
            } else {
                root.context.report(message, path: "admin.port", line: nil)
            }
        }
    }

    /// A YAML syntax error as one diagnostic at the line libyaml reports.
    static func syntaxDiagnostic(_ error: any Error, file: String) -> ConfigDiagnostic {
        func diagnostic(_ line: Int?, _ message: String) -> ConfigDiagnostic {
            ConfigDiagnostic(file: file, line: line, path: "", message: message)
        }
        guard let yamlError = error as? YamlError else { return diagnostic(nil, "invalid YAML: \(error)") }
        switch yamlError {
        case .scanner(let context, let problem, let mark, _),
             .parser(let context, let problem, let mark, _),
             .composer(let context, let problem, let mark, _):
            let detail = context.map { " (\($0.text) at line \($0.mark.line))" } ?? ""
            return diagnostic(mark.line, "invalid YAML: \(problem)\(detail)")
        case .duplicatedKeysInMapping(let duplicates, let context):
            let keys = duplicates.map(\.quotedForMessage).joined(separator: ", ")
            return diagnostic(context.mark.line, "duplicate key \(keys)")
        case .reader(let problem, _, _, _):
            return diagnostic(nil, "invalid YAML: \(problem)")
        default:
            return diagnostic(nil, "invalid YAML")
        }
    }
}
