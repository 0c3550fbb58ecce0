import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// Turns an upstream's host name into the addresses it serves from (`dns_refresh`): injected,
/// so tests give answers that change.
public protocol EndpointResolver: Sendable {
    /// The addresses `host` resolves to now (IPv4 or IPv6 literals), without duplicates.
    func resolve(_ host: String) async throws -> [String]
}

/// Why a resolution failed: the resolver's own words (`getaddrinfo`'s message).
public struct ResolutionError: Error, Sendable, CustomStringConvertible {
    public var description: String
}

/// The system's resolver (`getaddrinfo`: /etc/hosts, DNS as nsswitch says), run on NIO's
/// blocking-work thread pool, never on an event loop.
public struct SystemResolver: EndpointResolver {
    public init() {}

    public func resolve(_ host: String) async throws -> [String] {
        try await NIOThreadPool.singleton.runIfActive { try Self.lookUp(host) }
    }

    static func lookUp(_ host: String) throws -> [String] {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, nil, &hints, &list)
        guard status == 0 else {
            throw ResolutionError(description: String(cString: gai_strerror(status)))
        }
        defer { freeaddrinfo(list) }
        var addresses: [String] = []
        var next = list
        while let entry = next {
            var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
            if let raw = entry.pointee.ai_addr {
                let family = Int32(entry.pointee.ai_family)
                let text: String? = switch family {
                case AF_INET:
                    raw.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { address in
                        var ip = address.pointee.sin_addr
                        return inet_ntop(AF_INET, &ip, &buffer, socklen_t(buffer.count)).map { _ in Self.text(buffer) }
                    }
                case AF_INET6:
                    raw.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { address in
                        var ip = address.pointee.sin6_addr
                        return inet_ntop(AF_INET6, &ip, &buffer, socklen_t(buffer.count)).map { _ in Self.text(buffer) }
                    }
                default: nil
                }
                if let text, !addresses.contains(text) { addresses.append(text) }
            }
            next = entry.pointee.ai_next
        }
        return addresses
    }

    private static func text(_ buffer: [CChar]) -> String {
        String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Whether `host` is an address literal (IPv4, or IPv6 with or without brackets), not a name.
    static func isAddressLiteral(_ host: String) -> Bool {
        var bytes = [UInt8](repeating: 0, count: 16)
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        return inet_pton(AF_INET, bare, &bytes) == 1 || inet_pton(AF_INET6, bare, &bytes) == 1
    }
}
