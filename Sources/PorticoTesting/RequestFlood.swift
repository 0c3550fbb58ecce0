import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Overload for rate-limit tests: `connections` keep-alive connections, each on its own thread
/// with blocking sockets, sending `GET path` back to back for `duration`. Counts answers by
/// status and keeps the slowest one.
public enum RequestFlood {
    public struct Outcome: Sendable {
        public var statuses: [Int: Int] = [:]
        /// The longest wait for one answer.
        public var slowest: Duration = .zero
        /// Connections that failed (refused, reset) and were reopened.
        public var failures = 0
        public var elapsed: Duration = .zero

        public var total: Int { statuses.values.reduce(0, +) }
        public func count(_ status: Int) -> Int { statuses[status] ?? 0 }

        mutating func merge(_ other: Outcome) {
            statuses.merge(other.statuses, uniquingKeysWith: +)
            slowest = max(slowest, other.slowest)
            failures += other.failures
        }
    }

    /// Floods every port in `ports` at once (each with `connections`), returning one outcome per port.
    public static func run(ports: [Int], path: String, connections: Int, duration: Duration) async -> [Outcome] {
        let start = ContinuousClock.now
        let deadline = start.advanced(by: duration)
        var outcomes = await withTaskGroup(of: (Int, Outcome).self) { group in
            for (index, port) in ports.enumerated() {
                for _ in 0..<connections {
                    group.addTask { (index, await flood(port: port, path: path, until: deadline)) }
                }
            }
            var merged = Array(repeating: Outcome(), count: ports.count)
            for await (index, outcome) in group { merged[index].merge(outcome) }
            return merged
        }
        let elapsed = start.duration(to: .now)
        for index in outcomes.indices { outcomes[index].elapsed = elapsed }
        return outcomes
    }

    private static func flood(port: Int, path: String, until deadline: ContinuousClock.Instant) async -> Outcome {
        await withCheckedContinuation { continuation in
            let thread = Thread {
                continuation.resume(returning: floodOnThisThread(port: port, path: path, until: deadline))
            }
            thread.stackSize = 512 * 1024
            thread.start()
        }
    }

    private static func floodOnThisThread(port: Int, path: String, until deadline: ContinuousClock.Instant) -> Outcome {
        var outcome = Outcome()
        let request = Array("GET \(path) HTTP/1.1\r\nHost: flood.test\r\n\r\n".utf8)
        var fd: Int32 = -1
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        defer { if fd >= 0 { close(fd) } }
        while ContinuousClock.now < deadline {
            if fd < 0 {
                guard let opened = try? LoopbackSocket.connect(host: "127.0.0.1", port: port, timeout: .seconds(30)) else {
                    outcome.failures += 1
                    usleep(10_000)
                    continue
                }
                fd = opened
                buffer = []
            }
            let sent = ContinuousClock.now
            var answered = false
            if (try? LoopbackSocket.sendAll(request, on: fd)) != nil {
                while true {
                    if let (response, used) = RawHTTPResponse.parse(buffer, forHead: false) {
                        buffer.removeFirst(used)
                        outcome.statuses[response.status, default: 0] += 1
                        answered = true
                        if response.header("connection")?.lowercased() == "close" {
                            close(fd)
                            fd = -1
                        }
                        break
                    }
                    let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                    if n <= 0 { break }
                    buffer.append(contentsOf: chunk[..<n])
                }
            }
            outcome.slowest = max(outcome.slowest, sent.duration(to: .now))
            if !answered {
                outcome.failures += 1
                if fd >= 0 { close(fd) }
                fd = -1
            }
        }
        return outcome
    }
}
