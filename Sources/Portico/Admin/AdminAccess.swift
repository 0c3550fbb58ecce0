import Yams

/// Who may use the admin listener.
///
/// Without `admin.token` the listener must stay on loopback, where only the host (and the pod)
/// can reach it, and every endpoint is open. With a token, every endpoint except the probes
/// (`/healthz`, `/readyz`: kubelets and load balancers send no credentials) and the dashboard's
/// page itself (`/`: static HTML with no data; it asks for the token and sends it with each of
/// its requests) requires `Authorization: Bearer <token>`; `/metrics` too unless
/// `admin.public_metrics: true`.
public struct AdminAccess: Sendable {
    /// What a request to the admin listener is allowed.
    public enum Decision: Sendable, Equatable {
        case allowed
        /// No `Authorization` header, or another scheme than `Bearer`.
        case missingToken
        /// A bearer token that is not `admin.token`.
        case wrongToken
    }

    private let token: [UInt8]?
    private let publicMetrics: Bool

    public init(_ config: AdminConfig) {
        token = config.token.map { Array($0.utf8) }
        publicMetrics = config.publicMetrics
    }

    /// Paths anyone may ask whatever the token: the probes, and the dashboard page (no data in it).
    static let open: Set<String> = ["/healthz", "/readyz", "/"]

    /// Whether a request for `path` with this `Authorization` value may be answered.
    public func decide(path: String, authorization: String?) -> Decision {
        guard let token, !Self.open.contains(path), !(publicMetrics && path == "/metrics") else { return .allowed }
        guard let authorization, let presented = Self.bearer(authorization) else { return .missingToken }
        return Self.constantTimeEquals(Array(presented.utf8), token) ? .allowed : .wrongToken
    }

    /// The credentials of a `Bearer` authorization value (the scheme is case-insensitive).
    static func bearer(_ value: String) -> Substring? {
        let parts = value.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return nil }
        return parts[1].drop { $0 == " " }
    }

    /// Compares every byte of the presented value whatever the first difference, so the time
    /// taken tells an attacker nothing about how much of a guess was right; it depends only on
    /// the length of the presented value (the token's own length is not hidden, and need not be).
    static func constantTimeEquals(_ presented: [UInt8], _ expected: [UInt8]) -> Bool {
        var difference = UInt(bitPattern: presented.count ^ expected.count)
        for index in presented.indices {
            let other = expected.isEmpty ? 0 : expected[index % expected.count]
            difference |= UInt(presented[index] ^ other)
        }
        return difference == 0 && !expected.isEmpty
    }

    /// Addresses only this host can reach.
    static func isLoopback(_ address: String) -> Bool {
        let bare = address.hasPrefix("[") && address.hasSuffix("]") ? String(address.dropFirst().dropLast()) : address
        if bare == "::1" || bare.lowercased() == "localhost" { return true }
        let octets = bare.split(separator: ".", omittingEmptySubsequences: false)
        return octets.count == 4 && octets[0] == "127" && octets.allSatisfy { UInt8($0) != nil }
    }

    /// `admin.address` off loopback without `admin.token` is refused; a token written in the
    /// file rather than taken from `${VAR}` or `${file:…}` gets a warning.
    static func checkExposure(_ config: AdminConfig, section: ConfigMapping) {
        if let tokenNode = section.value("token"), case .scalar(let scalar) = tokenNode.node,
           !scalar.string.contains("${") {
            tokenNode.warning("the admin token is written in the file: take it from ${VAR} or ${file:/path}")
        }
        guard config.enabled, config.token == nil, !isLoopback(config.address) else { return }
        let message = "\(config.address.quotedForMessage) is not a loopback address: the admin listener "
            + "(reload, credentials, configuration) would be open to the network; set admin.token "
            + "(e.g. ${file:/run/secrets/portico-admin-token}) or bind it to 127.0.0.1"
        if let addressNode = section.value("address") {
            addressNode.error(message)
        } else {
            section.error(message)
        }
    }
}
