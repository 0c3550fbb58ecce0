import NIOCore
import NIOHTTP1
#if canImport(Glibc)
import Glibc
#endif

/// A request failed on a reused connection before any byte of its response arrived: the
/// server had closed the connection while it sat idle, or closed it as the request went out
/// (keep-alive's race: an nginx reload closes every idle keep-alive connection, and one the
/// pool hands out before its loop has read the FIN fails). `HTTP1ConnectionPool` sends such a
/// request once more on a new connection when `allowsResend` says so, as nginx and HAProxy do;
/// otherwise the caller hears `failure`. Never on a new connection (nothing was stale there),
/// so never twice.
struct StaleConnection: Error, Sendable, Equatable {
    enum Moment: Sendable, Equatable {
        /// Found closed before the request was written (the channel gone, or the kernel already
        /// had the server's FIN or reset): nothing went out, so nothing could have been read.
        case beforeWrite
        /// The request went out, then the connection ended (EOF or reset) before any byte of the
        /// response: the server may have read it, and acted on it.
        case afterWrite
    }

    var moment: Moment
    /// What the caller hears when the request is not sent again.
    var failure: UpstreamError

    /// Any request that never went out; after the write only one that may be sent twice
    /// (`HTTP1Exchange.resendableAfterWrite`).
    func allowsResend(of exchange: HTTP1Exchange) -> Bool {
        switch moment {
        case .beforeWrite: true
        case .afterWrite: exchange.resendableAfterWrite
        }
    }

    /// RFC 9110 §9.2.2: the methods whose effect is the same sent once or twice.
    static func isIdempotent(_ method: HTTPMethod) -> Bool {
        switch method {
        case .GET, .HEAD, .OPTIONS, .TRACE, .PUT, .DELETE: true
        default: false
        }
    }

    /// The errors that end a connection before any response byte came: a reset or broken pipe
    /// (reading, or writing the request). A parser error is not one: it means bytes came.
    static func endsConnection(_ error: any Error) -> Bool {
        guard let error = error as? IOError else { return false }
        switch error.errnoCode {
        case ECONNRESET, EPIPE, ECONNABORTED: return true
        default: return false
        }
    }
}

extension HTTP1Exchange {
    /// The request may go out again after it was written on a connection that then ended before
    /// any byte of the response: an idempotent method, and a body that can be sent again (a
    /// buffered one; a streamed one is consumed as it goes).
    var resendableAfterWrite: Bool {
        upload == nil && StaleConnection.isIdempotent(head.method)
    }
}

/// Whether the server has already closed a connection, as the kernel knows before the event
/// loop has read it: the socket's TCP state is no longer ESTABLISHED (the FIN is in, or a reset
/// came). Asked before a request that could not be sent again after its write goes out on a
/// reused connection (one `getsockopt`, about 0.5 µs): such a request is then refused unsent and
/// goes out on a new connection instead. libcurl asks the same of every connection it reuses.
enum PeerLiveness {
    static func hasClosed(_ channel: any Channel) -> Bool {
        #if os(Linux)
        // `struct tcp_info` begins with the state byte, and Linux copies as much of the struct as
        // the caller's buffer holds: an Int32-sized option reads it without the whole struct.
        guard let options = channel.syncOptions,
              let value = try? options.getOption(ChannelOptions.tcpOption(.tcp_info)) else { return false }
        let state = withUnsafeBytes(of: value) { $0[0] }
        return state != Self.tcpEstablished
        #else
        return false
        #endif
    }

    /// `TCP_ESTABLISHED` of linux/tcp_states.h.
    static let tcpEstablished: UInt8 = 1
}
