import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import NIOCore
import NIOPosix

/// Words for what the network said, shared by the upstream transports and the token endpoint
/// client: what a person reads in a 502 or 503 message is "connection refused", never
/// `URLError -1004` or `errno 111`. Nothing here names a URL.
enum NetworkFailure {
    /// A Foundation URL loading code, in words.
    static func describe(_ code: URLError.Code) -> String {
        switch code {
        case .cannotConnectToHost: "connection refused"
        case .cannotFindHost, .dnsLookupFailed: "host name not found"
        case .notConnectedToInternet: "network unreachable"
        case .timedOut: "timed out"
        case .networkConnectionLost: "connection lost"
        case .badURL, .unsupportedURL: "address not usable"
        case .secureConnectionFailed, .serverCertificateUntrusted, .serverCertificateHasBadDate,
             .serverCertificateNotYetValid, .serverCertificateHasUnknownRoot, .clientCertificateRejected,
             .clientCertificateRequired:
            "TLS failure"
        case .badServerResponse: "bad response"
        case .cannotParseResponse: "unparseable response"
        case .cannotDecodeRawData, .cannotDecodeContentData: "undecodable response body"
        case .dataLengthExceedsMaximum: "response too large"
        case .cancelled: "cancelled"
        default: "transport failure"
        }
    }

    /// A system error number, in words (`connection refused`, `connection reset by peer`).
    static func describe(errno code: Int32) -> String {
        guard let text = strerror(code) else { return "system error" }
        return String(cString: text).lowercased()
    }

    /// SwiftNIO's failure to connect, in words: the first attempt's system error, or a failed
    /// name resolution. nil for any other error.
    static func describe(nioConnectError error: any Error) -> String? {
        switch error {
        case let error as IOError:
            return describe(errno: error.errnoCode)
        case let error as NIOConnectionError:
            if let first = error.connectionErrors.first {
                return describe(nioConnectError: first.error) ?? "connection failed"
            }
            return error.dnsAError != nil || error.dnsAAAAError != nil ? "host name not found" : "connection failed"
        default:
            return nil
        }
    }
}
