import Foundation
import Synchronization

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
    ///
    /// The `duration` starts when the first connection's thread runs, not when this is called: on
    /// a loaded machine a thread may start late, and a window that had already passed would send
    /// nothing. `elapsed` is from that start to the last thread's end.
    public static func run(ports: [Int], path: String, connections: Int, duration: Duration) async -> [Outcome] {
        let jobs = ports.indices.flatMap { Array(repeating: $0, count: connections) }
        guard !jobs.isEmpty else { return ports.map { _ in Outcome() } }
        let gate = Gate(duration: duration, threads: jobs.count, ports: ports.count)
        return await withCheckedContinuation { continuation in
            for index in jobs {
                let thread = Thread {
                    let outcome = floodOnThisThread(port: ports[index], path: path, until: gate.deadline())
                    if let merged = gate.finish(index, outcome) { continuation.resume(returning: merged) }
                }
                thread.stackSize = 512 * 1024
                thread.start()
            }
        }
    }

    /// The window all of one run's threads share, set by the first to start, and their outcomes.
    private final class Gate: Sendable {
        private struct State {
            var started: ContinuousClock.Instant?
            var merged: [Outcome]
            var running: Int
        }

        private let duration: Duration
        private let state: Mutex<State>

        init(duration: Duration, threads: Int, ports: Int) {
            self.duration = duration
            state = Mutex(State(started: nil, merged: Array(repeating: Outcome(), count: ports), running: threads))
        }

        func deadline() -> ContinuousClock.Instant {
            state.withLock { state in
                let started = state.started ?? .now
                state.started = started
                return started.advanced(by: duration)
            }
        }

        /// The outcomes, with `elapsed`, once the last thread has finished; `nil` before.
        func finish(_ index: Int, _ outcome: Outcome) -> [Outcome]? {
            state.withLock { state in
                state.merged[index].merge(outcome)
                state.running -= 1
                guard state.running == 0 else { return nil }
                let elapsed = (state.started ?? .now).duration(to: .now)
                return state.merged.map { merged in
                    var merged = merged
                    merged.elapsed = elapsed
                    return merged
                }
            }
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
