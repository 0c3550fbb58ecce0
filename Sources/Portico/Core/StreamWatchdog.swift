import Synchronization

/// Enforces a streamed body's timeouts on the gateway's clock: `idle`, the longest silence
/// between two chunks, and `maxDuration`, the longest it may last. A writer calls `touch` for
/// every chunk; when either limit passes, `onExpire` runs once (fail the writer, cancel the
/// upstream) and the watchdog stops. One task per stream, sleeping until the next moment a
/// limit could pass, so a busy stream costs one atomic store per chunk.
public final class StreamWatchdog: Sendable {
    private let clock: any GatewayClock
    private let idle: Duration
    private let started: ContinuousClock.Instant
    private let maxEnd: ContinuousClock.Instant?
    /// Nanoseconds from `started` to the last chunk.
    private final class LastChunk: Sendable {
        let nanoseconds = Atomic<Int64>(0)
        /// Set while the stream waits on its reader (backpressure): its silence is not the writer's.
        let paused = Atomic<Bool>(false)
    }
    private let lastChunk = LastChunk()
    private let task = Mutex<Task<Void, Never>?>(nil)

    public init(clock: any GatewayClock, idle: Duration, maxDuration: Duration?,
                onExpire: @escaping @Sendable (GatewayError) -> Void) {
        self.clock = clock
        self.idle = idle
        let now = clock.now
        self.started = now
        self.maxEnd = maxDuration.map { now.advanced(by: $0) }
        let watch = Task { [clock, idle, maxEnd, started, lastChunk] in
            while !Task.isCancelled {
                let last = started.advanced(by: .nanoseconds(lastChunk.nanoseconds.load(ordering: .relaxed)))
                var wake = last.advanced(by: idle)
                if let maxEnd { wake = min(wake, maxEnd) }
                let now = clock.now
                if now >= wake, lastChunk.paused.load(ordering: .relaxed), maxEnd.map({ now < $0 }) ?? true {
                    // Waiting on the reader: look again one idle period later.
                    do { try await clock.sleep(until: now.advanced(by: idle)) } catch { return }
                    continue
                }
                if now >= wake {
                    if let maxEnd, now >= maxEnd {
                        onExpire(GatewayError(.upstreamTimeout, message: "the stream lasted longer than max_stream_duration (\(maxDuration!))"))
                    } else {
                        onExpire(GatewayError(.upstreamTimeout, message: "no data for \(idle) (stream_idle_timeout)"))
                    }
                    return
                }
                do { try await clock.sleep(until: wake) } catch { return }
            }
        }
        task.withLock { $0 = watch }
    }

    deinit {
        stop()
    }

    /// A chunk arrived: the idle limit counts from now.
    public func touch() {
        lastChunk.nanoseconds.store(GatewayMetrics.nanoseconds(started.duration(to: clock.now)), ordering: .relaxed)
    }

    /// The writer waits on the reader (its queue is full): silence from now on does not count
    /// until `resume` (`max_stream_duration` still does).
    public func pause() {
        lastChunk.paused.store(true, ordering: .relaxed)
    }

    /// The reader caught up: the idle limit counts from now again.
    public func resume() {
        touch()
        lastChunk.paused.store(false, ordering: .relaxed)
    }

    /// The stream is over: no more expiry.
    public func stop() {
        task.withLock { task in
            task?.cancel()
            task = nil
        }
    }
}
