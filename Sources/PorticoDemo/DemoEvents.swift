import MicroHTTPD
import Synchronization

/// The demo upstream's Server-Sent Events stream: one event a second, `count` of them (at most
/// 60), then the stream ends. Shows streaming through the gateway: `curl -N` prints each event
/// as it is sent, not all of them at the end.
final class DemoEvents: ResponseBodySource {
    private struct State {
        var queued: [UInt8] = []
        var ended = false
        var wake: (@Sendable () -> Void)?
        var closed = false
    }

    private let state = Mutex(State())
    private let ticker = Mutex<Task<Void, Never>?>(nil)

    init(count: Int) {
        let total = min(max(count, 1), 60)
        let task = Task { [weak self] in
            for n in 1...total {
                if n > 1 {
                    do { try await Task.sleep(for: .seconds(1)) } catch { return }
                }
                guard let self else { return }
                let event = "id: \(n)\nevent: tick\ndata: {\"n\":\(n),\"of\":\(total)}\n\n"
                self.append(Array(event.utf8), last: n == total)
            }
        }
        ticker.withLock { $0 = task }
    }

    private func append(_ bytes: [UInt8], last: Bool) {
        let wake = state.withLock { state -> (@Sendable () -> Void)? in
            guard !state.closed else { return nil }
            state.queued += bytes
            state.ended = last
            defer { state.wake = nil }
            return state.wake
        }
        wake?()
    }

    func read(into buffer: UnsafeMutableRawBufferPointer, wake: @escaping @Sendable () -> Void) -> ResponseBodyRead {
        state.withLock { state in
            if !state.queued.isEmpty {
                let count = min(state.queued.count, buffer.count)
                state.queued.withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: count) }
                state.queued.removeFirst(count)
                return .bytes(count)
            }
            if state.ended { return .end }
            state.wake = wake
            return .pending
        }
    }

    func close(delivered: Bool) {
        state.withLock { $0.closed = true }
        ticker.withLock { task in
            task?.cancel()
            task = nil
        }
    }
}
