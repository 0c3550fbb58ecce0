import CMicroHTTPD

#if canImport(Glibc)
import Glibc
#endif

/// The certificate and key handed to libmicrohttpd as NUL-terminated PEM. MHD keeps the
/// pointers, so they live as long as the daemon and are released after `MHD_stop_daemon`
/// (the key bytes are zeroed first).
struct DaemonTLSMemory: @unchecked Sendable {
    // Sendable: the pointers are written once here, read by MHD, and freed once by the
    // server after its daemon has stopped; nothing mutates them in between.
    let certificate: UnsafeMutablePointer<CChar>
    let privateKey: UnsafeMutablePointer<CChar>
    let keyLength: Int

    /// GnuTLS priorities: TLS 1.2 and 1.3 only.
    static let priorities = "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"

    init(_ tls: ServerConfiguration.TLS) throws(MicroHTTPDError) {
        guard MHD_is_feature_supported(portico_feature_tls) == portico_yes else { throw .tlsUnsupported }
        certificate = Self.copy(tls.certificatePEM)
        privateKey = Self.copy(tls.privateKeyPEM)
        keyLength = tls.privateKeyPEM.count
    }

    private static func copy(_ bytes: [UInt8]) -> UnsafeMutablePointer<CChar> {
        let pointer = UnsafeMutablePointer<CChar>.allocate(capacity: bytes.count + 1)
        bytes.withUnsafeBytes { raw in
            if let base = raw.baseAddress { UnsafeMutableRawPointer(pointer).copyMemory(from: base, byteCount: raw.count) }
        }
        pointer[bytes.count] = 0
        return pointer
    }

    func release() {
        certificate.deallocate()
        privateKey.update(repeating: 0, count: keyLength)
        privateKey.deallocate()
    }
}
