import HTTPTypes
import NIOCore
import Synchronization

/// Stores a cacheable streamed response while it passes on to the client: a `BodyStage` that
/// copies the chunks (never delaying them) up to `max_object_bytes`, and stores the entry only
/// when the body ended complete. Past the limit it drops its copy and stops copying; a body
/// that ends any other way (the client left, the upstream reset, a timeout) is never stored —
/// a truncated body must not be served as whole.
///
/// Requests coalesced behind this fetch hear the outcome when it is known: the stored entry at
/// the end, or `notShared` (they go upstream themselves) as soon as the body is over the limit,
/// fails, or is dropped unread.
///
/// Runs on the reader's thread (libmicrohttpd's for a client): the store insert and the
/// coalescer's wake-ups take short locks and never wait.
final class CacheTee: BodyStage {
    /// The flight waiting requests follow, once the leader has attached it.
    private struct Waiters {
        var coalescer: RequestCoalescer
        var key: String
        var flight: RequestCoalescer.Flight
    }

    /// What waiters are told, and whether the key is marked uncacheable for a while.
    private struct Verdict {
        var outcome: RequestCoalescer.Outcome
        var uncacheable: Bool
    }

    private struct State {
        var copy: ByteBuffer
        /// Copying stopped: over the limit, or the body ended.
        var stopped = false
        var verdict: Verdict?
        var waiters: Waiters?
        var published = false
        /// Told the stored entry (or `nil`) once the verdict is known (the fleet lease).
        var onVerdict: (@Sendable (CacheEntry?) -> Void)?
    }

    /// The entry to store, with an empty body.
    private let template: CacheEntry
    private let maxObjectBytes: Int
    private let maxBytes: Int
    private let store: any CacheStore
    private let metrics: CacheMetrics
    private let clock: any GatewayClock
    /// Whether an older entry was being revalidated: a response too large to store must not
    /// leave it to outlive the current one (as for a buffered response).
    private let replacesStored: Bool
    private let state: Mutex<State>

    init(template: CacheEntry, expectedBytes: Int?, maxObjectBytes: Int, maxBytes: Int, store: any CacheStore,
         metrics: CacheMetrics, clock: any GatewayClock, replacesStored: Bool) {
        self.template = template
        self.maxObjectBytes = maxObjectBytes
        self.maxBytes = maxBytes
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.replacesStored = replacesStored
        var copy = ByteBuffer()
        if let expectedBytes { copy.reserveCapacity(min(expectedBytes, maxObjectBytes)) }
        state = Mutex(State(copy: copy))
    }

    deinit {
        // Dropped without being read (no reader ever made): nothing to store; waiters go on.
        decide(Verdict(outcome: .notShared, uncacheable: false))
    }

    /// The stored entry, once the body ended complete and was stored (tests, diagnostics).
    var storedEntry: CacheEntry? {
        state.withLock { state in
            guard case .stored(let entry) = state.verdict?.outcome else { return nil }
            return entry
        }
    }

    /// Whether copying stopped before the end (over the limit): the rest need not be read to store it.
    var gaveUp: Bool { state.withLock { $0.stopped && $0.verdict != nil } }

    /// Hands the coalescer's flight to the tee: its waiters hear the outcome when it is known
    /// (at once if it already is).
    func publish(to coalescer: RequestCoalescer, key: String, flight: RequestCoalescer.Flight) {
        let verdict: Verdict? = state.withLock { state in
            state.waiters = Waiters(coalescer: coalescer, key: key, flight: flight)
            guard let verdict = state.verdict, !state.published else { return nil }
            state.published = true
            return verdict
        }
        if let verdict { Self.tell(Waiters(coalescer: coalescer, key: key, flight: flight), verdict, clock: clock) }
    }

    /// Calls `action` with the stored entry (`nil`: not stored) once that is known — at once if
    /// it already is.
    func whenDecided(_ action: @escaping @Sendable (CacheEntry?) -> Void) {
        let verdict: Verdict?? = state.withLock { state in
            guard let verdict = state.verdict else {
                state.onVerdict = action
                return .none
            }
            return .some(verdict)
        }
        if let verdict { action(Self.entry(of: verdict)) }
    }

    private static func entry(of verdict: Verdict?) -> CacheEntry? {
        guard case .stored(let entry) = verdict?.outcome else { return nil }
        return entry
    }

    func process(_ chunk: ByteBuffer) throws(GatewayError) -> ByteBuffer {
        let overLimit = state.withLock { state -> Bool in
            guard !state.stopped else { return false }
            guard state.copy.readableBytes + chunk.readableBytes <= maxObjectBytes else {
                state.stopped = true
                state.copy = ByteBuffer()
                return true
            }
            state.copy.writeImmutableBuffer(chunk)
            return false
        }
        if overLimit {
            // Too large to store: waiters stop waiting now, and an older variant must not
            // outlive this answer.
            if replacesStored { metrics.record(store.removeAll(for: template.key)) }
            decide(Verdict(outcome: .notShared, uncacheable: true))
        }
        return chunk
    }

    func finish() throws(GatewayError) -> ByteBuffer? { nil }

    func ended(_ ending: StreamEnding, error: GatewayError?) {
        let body: ByteBuffer? = state.withLock { state in
            guard !state.stopped else { return nil }
            state.stopped = true
            defer { state.copy = ByteBuffer() }
            return ending == .complete ? state.copy : nil
        }
        guard let body else {
            decide(Verdict(outcome: .notShared, uncacheable: false))
            return
        }
        var entry = template
        entry.headerFields[.contentLength] = String(body.readableBytes)
        // A copy sized to the body, so the bytes charged are the bytes held.
        entry.body = body.capacity == body.readableBytes ? body : ByteBuffer(bytes: body.readableBytesView)
        metrics.record(store.insert(entry))
        let stored = entry.size <= maxBytes
        decide(Verdict(outcome: stored ? .stored(entry) : .notShared, uncacheable: !stored))
    }

    /// Records the first verdict and tells the waiters, if attached.
    private func decide(_ verdict: Verdict) {
        let (waiters, onVerdict): (Waiters?, (@Sendable (CacheEntry?) -> Void)?) = state.withLock { state in
            guard state.verdict == nil else { return (nil, nil) }
            state.verdict = verdict
            defer { state.onVerdict = nil }
            guard let waiters = state.waiters, !state.published else { return (nil, state.onVerdict) }
            state.published = true
            return (waiters, state.onVerdict)
        }
        if let waiters { Self.tell(waiters, verdict, clock: clock) }
        onVerdict?(Self.entry(of: verdict))
    }

    private static func tell(_ waiters: Waiters, _ verdict: Verdict, clock: any GatewayClock) {
        waiters.coalescer.finish(waiters.key, waiters.flight, verdict.outcome,
                                 uncacheableAt: verdict.uncacheable ? clock.now : nil)
    }
}
