import Foundation
import NIOSSL
import X509

/// Does a server certificate name `server_name`? RFC 6125 §6 rules, strictly.
///
/// Why this exists: swift-nio-ssl's own check accepts a certificate when any of its IP-address
/// names equals the connected socket's address, whatever name was expected. So with
/// `server_name: billing.internal` on `https://127.0.0.1:…`, a certificate naming only
/// `IP:127.0.0.1` passed. Here, for a DNS name only DNS names count (`subjectAltName` DNS
/// entries, or the subject's common name when the certificate has no alternative names at all);
/// for an IP literal only IP-address entries equal to it count. Never the socket's address.
enum ServerNameCheck {
    /// True when `certificate` names `serverName`.
    static func certificate(_ certificate: NIOSSLCertificate, names serverName: String) -> Bool {
        guard let der = try? certificate.toDERBytes(), let parsed = try? Certificate(derEncoded: der) else {
            return false
        }
        return Self.certificate(parsed, names: serverName)
    }

    static func certificate(_ certificate: Certificate, names serverName: String) -> Bool {
        let alternativeNames: SubjectAlternativeNames?
        do {
            alternativeNames = try certificate.extensions.subjectAlternativeNames
        } catch {
            return false  // an unreadable SAN extension is no basis for trust
        }
        if let address = IPLiteral(serverName) {
            // An IP reference identity: IP-address entries only, never the common name (RFC 6125 §1.7.2).
            return alternativeNames?.contains { name in
                if case .ipAddress(let bytes) = name { return Array(bytes.bytes) == address.bytes }
                return false
            } ?? false
        }
        let reference = normalized(serverName)
        guard !reference.isEmpty else { return false }
        if let alternativeNames, !alternativeNames.isEmpty {
            return alternativeNames.contains { name in
                if case .dnsName(let dnsName) = name { return matches(pattern: dnsName, reference: reference) }
                return false
            }
        }
        // No alternative names at all: the (last) common name, as browsers once did (RFC 6125 §6.4.4).
        var commonName: String?
        for rdn in certificate.subject {
            for attribute in rdn where attribute.type == .RDNAttributeType.commonName {
                commonName = String(attribute.value)
            }
        }
        guard let commonName else { return false }
        return matches(pattern: commonName, reference: reference)
    }

    /// `pattern` from the certificate against the (normalized) reference name. A wildcard is
    /// only the whole leftmost label (`*.example.test`), matches exactly one label, and needs at
    /// least two labels after it; no partial-label wildcards (`f*.example.test`), no IDN tricks:
    /// A-labels are compared as ASCII, case-insensitively.
    static func matches(pattern: String, reference: String) -> Bool {
        let pattern = normalized(pattern)
        guard !pattern.isEmpty, pattern.allSatisfy({ $0.isASCII }) else { return false }
        guard pattern.hasPrefix("*.") else {
            return !pattern.contains("*") && pattern == reference
        }
        let suffix = pattern.dropFirst(2)
        guard !suffix.contains("*"), suffix.contains("."),
              let dot = reference.firstIndex(of: "."), reference.startIndex != dot else { return false }
        return reference[reference.index(after: dot)...] == suffix
    }

    /// Lowercased, without the trailing dot of an absolute name.
    private static func normalized(_ name: String) -> String {
        var name = name.lowercased()
        if name.hasSuffix(".") { name.removeLast() }
        return name
    }

    /// An IPv4 or IPv6 literal, as the bytes an IP-address SAN holds.
    private struct IPLiteral {
        var bytes: [UInt8]

        init?(_ text: String) {
            let text = text.hasPrefix("[") && text.hasSuffix("]") ? String(text.dropFirst().dropLast()) : text
            var v4 = in_addr()
            if inet_pton(AF_INET, text, &v4) == 1 {
                bytes = withUnsafeBytes(of: &v4) { Array($0) }
                return
            }
            var v6 = in6_addr()
            if inet_pton(AF_INET6, text, &v6) == 1 {
                bytes = withUnsafeBytes(of: &v6) { Array($0) }
                return
            }
            return nil
        }
    }
}
