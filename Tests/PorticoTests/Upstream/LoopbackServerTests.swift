import Foundation
import PorticoTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("Test servers")
struct LoopbackServerTests {
    @Test("a test upstream shut down while clients keep connecting closes every connection and never traps")
    func shutdownWhileConnecting() async throws {
        for _ in 0..<20 {
            let upstream = TestUpstream()
            try await upstream.start()
            let port = UInt16(upstream.port)
            // Raw connects from threads of their own, racing the shutdown below.
            let connector = Thread {
                for _ in 0..<50 {
                    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                    guard fd >= 0 else { continue }
                    var address = sockaddr_in()
                    address.sin_family = sa_family_t(AF_INET)
                    address.sin_port = port.bigEndian
                    address.sin_addr.s_addr = inet_addr("127.0.0.1")
                    _ = withUnsafePointer(to: &address) {
                        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
                    }
                    close(fd)
                }
            }
            connector.start()
            await upstream.shutdown()
        }
    }
}
