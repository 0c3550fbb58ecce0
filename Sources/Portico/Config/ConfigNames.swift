/// The names each section defines, collected from mapping keys before any section is parsed,
/// so references resolve whatever the order in the file and a definition with its own errors
/// does not also produce "unknown upstream" noise wherever it is used.
struct ConfigNames {
    var upstreams: [String] = []
    var credentials: [String] = []
    var middleware: [String] = []
    var stores: [String] = []
    /// Filled in once the sections they come from are parsed, for the routes' WebSocket checks
    /// (`RouteConfig.checkUpgrade`): each upstream's transport, each middleware's `type`, and
    /// `defaults.middleware`.
    var upstreamTransports: [String: UpstreamConfig.Transport] = [:]
    var middlewareTypes: [String: String] = [:]
    var defaultMiddleware: [String] = []
}
