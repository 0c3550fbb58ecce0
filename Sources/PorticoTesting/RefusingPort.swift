#if canImport(Glibc)
import Glibc
#endif

/// A loopback port where connections are refused, for "upstream down" tests.
///
/// The socket is bound but never listens: the kernel answers every connection with a reset,
/// and nothing else in the (parallel) test process can bind the port meanwhile — which a port
/// merely freed by a stopped server does not guarantee.
public final class RefusingPort: Sendable {
    public let port: Int
    private let descriptor: Int32

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public init() throws(Failure) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw Failure(description: "socket: \(String(cString: strerror(errno)))") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0
            }
        }
        guard bound else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw Failure(description: "bind 127.0.0.1:0: \(reason)")
        }
        descriptor = fd
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit {
        close(descriptor)
    }
}
