/// The names each section defines, collected from mapping keys before any section is parsed,
/// so references resolve whatever the order in the file and a definition with its own errors
/// does not also produce "unknown upstream" noise wherever it is used.
struct ConfigNames {
    var upstreams: [String] = []
    var credentials: [String] = []
    var middleware: [String] = []
    var stores: [String] = []
}
