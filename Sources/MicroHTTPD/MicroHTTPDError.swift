/// Errors from starting or running the server, each saying what was being attempted.
public enum MicroHTTPDError: Error, CustomStringConvertible, Equatable {
    case invalidAddress(String)
    case startFailed(address: String, port: UInt16, detail: String)
    case alreadyStarted
    /// The system libmicrohttpd was built without TLS (GnuTLS) support.
    case tlsUnsupported

    public var description: String {
        switch self {
        case .invalidAddress(let address):
            "invalid listen address \"\(address)\" (expected an IPv4 or IPv6 literal)"
        case .startFailed(let address, let port, let detail):
            "unable to listen on \(address):\(port): \(detail)"
        case .alreadyStarted:
            "the server is already running"
        case .tlsUnsupported:
            "this libmicrohttpd was built without TLS support (MHD_FEATURE_TLS); install one built with GnuTLS"
        }
    }
}
