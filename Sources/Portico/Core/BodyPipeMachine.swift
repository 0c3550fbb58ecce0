import NIOCore

/// The decisions of one streamed body (`BodyPipe`), as a value: what is queued, how the
/// writer's side ended, whether the reader is still there, and who waits. It resumes nothing
/// itself; each step returns whom the caller must wake, so `BodyPipe` runs it under its lock
/// and resumes continuations after releasing it, and tests drive it without tasks.
///
/// Generic over what a waiting reader and writer are (a continuation or a wake-up closure in
/// the pipe, plain values in tests).
struct BodyPipeMachine<ReaderWaiter, WriterWaiter> {
    /// The body's phase. A reader that goes away ends it whatever the writer did; a writer's
    /// end is delivered only after what it queued before.
    enum Phase {
        /// The writer may still write.
        case open
        /// The writer finished: the reader gets what is queued, then the end.
        case finished
        /// The writer failed: the reader gets what is queued, then this failure.
        case failed(GatewayError)
        /// The reader went away with this reason: nothing more is queued or delivered.
        case readerGone(GatewayError)
    }

    /// What the reader is given.
    enum Delivery {
        case chunk(ByteBuffer)
        case end
        case failed(GatewayError)
    }

    /// A delivery and the writer to release because the queue fell to half of `highWater`.
    struct Take {
        var delivery: Delivery
        var releasedWriter: WriterWaiter?
    }

    /// What a write did.
    enum Append {
        /// Queued; `wake` is the waiting reader to hand it to, `full` says the writer must
        /// wait (or pause) until the reader has taken the queue down to half.
        case queued(wake: ReaderWaiter?, full: Bool)
        /// Dropped: the reader is gone with this reason.
        case readerGone(GatewayError)
    }

    /// What a writer that must wait does now.
    enum WriterWait {
        /// Waits: it was stored, and a take or the reader's going will release it.
        case parked
        /// Goes on at once: the reader took the queue down meanwhile.
        case proceed
        /// Stops: the reader is gone.
        case readerGone(GatewayError)
    }

    /// Who must be told that the reader went away.
    struct ReaderDeparture {
        var reader: ReaderWaiter?
        var writer: WriterWaiter?
        /// The writer's handler, unless the body had been read whole or the writer had
        /// failed (it knows already).
        var handler: (@Sendable (GatewayError) -> Void)?
    }

    let highWater: Int
    private(set) var phase: Phase = .open
    private var chunks = CircularBuffer<ByteBuffer>(initialCapacity: 4)
    /// Bytes queued, the sum of `chunks`' readable bytes.
    private(set) var queued = 0
    private var reader: ReaderWaiter?
    private var writer: WriterWaiter?
    private var readerGoneHandler: (@Sendable (GatewayError) -> Void)?

    init(highWater: Int) {
        self.highWater = max(1, highWater)
    }

    /// The reader's reason for going, once it has.
    var readerGoneReason: GatewayError? {
        if case .readerGone(let reason) = phase { return reason }
        return nil
    }

    // MARK: Writer side

    /// Queues `buffer` (an empty one only wakes the reader). Writing after the writer's own
    /// end is a programming error.
    mutating func append(_ buffer: ByteBuffer) -> Append {
        switch phase {
        case .readerGone(let reason):
            return .readerGone(reason)
        case .finished, .failed:
            preconditionFailure("write after the body ended")
        case .open:
            if buffer.readableBytes > 0 {
                chunks.append(buffer)
                queued += buffer.readableBytes
            }
            defer { reader = nil }
            return .queued(wake: reader, full: queued >= highWater)
        }
    }

    /// A writer told `full` waits here: parked unless the reader has gone or taken the queue
    /// down below half meanwhile. Only one writer waits at a time.
    mutating func wait(writer waiter: WriterWaiter) -> WriterWait {
        if let reason = readerGoneReason { return .readerGone(reason) }
        if queued < highWater / 2 + 1 { return .proceed }
        writer = waiter
        return .parked
    }

    /// Parks a writer that offered from a callback and was told `full`, to be resumed later.
    mutating func pause(writer waiter: WriterWaiter) {
        guard readerGoneReason == nil else { return }
        writer = waiter
    }

    /// The waiting writer, removed (its task was cancelled).
    mutating func removeWriter() -> WriterWaiter? {
        defer { writer = nil }
        return writer
    }

    /// The writer's end, whole (`nil`) or failed; only the first end counts, and none after
    /// the reader went. Returns the waiting reader to hand the end to.
    mutating func end(failure: GatewayError?) -> ReaderWaiter? {
        guard case .open = phase else { return nil }
        phase = failure.map(Phase.failed) ?? .finished
        defer { reader = nil }
        return reader
    }

    /// Keeps `handler` for the reader's going; returns the reason at once if it has gone.
    mutating func onReaderGone(_ handler: @escaping @Sendable (GatewayError) -> Void) -> GatewayError? {
        if let reason = readerGoneReason { return reason }
        readerGoneHandler = handler
        return nil
    }

    // MARK: Reader side

    /// What the reader gets now, if anything.
    mutating func take() -> Take? {
        if let reason = readerGoneReason { return Take(delivery: .failed(reason)) }
        if let buffer = chunks.popFirst() {
            queued -= buffer.readableBytes
            var released: WriterWaiter?
            if queued <= highWater / 2 {
                released = writer
                writer = nil
            }
            return Take(delivery: .chunk(buffer), releasedWriter: released)
        }
        switch phase {
        case .failed(let error): return Take(delivery: .failed(error))
        case .finished: return Take(delivery: .end)
        case .open, .readerGone: return nil
        }
    }

    /// Takes what there is, or parks `waiter` until a write or the end hands something over.
    mutating func take(orPark waiter: ReaderWaiter) -> Take? {
        if let taken = take() { return taken }
        reader = waiter
        return nil
    }

    /// The reader goes away: drops what is queued and returns everyone to tell. Idempotent.
    mutating func readerLeaves(_ reason: GatewayError) -> ReaderDeparture? {
        let tellWriter: Bool
        switch phase {
        case .readerGone: return nil
        case .open: tellWriter = true
        case .finished: tellWriter = !chunks.isEmpty
        case .failed: tellWriter = false
        }
        phase = .readerGone(reason)
        chunks.removeAll()
        queued = 0
        defer { (reader, writer, readerGoneHandler) = (nil, nil, nil) }
        return ReaderDeparture(reader: reader, writer: writer, handler: tellWriter ? readerGoneHandler : nil)
    }
}

extension BodyPipeMachine.Take {
    init(delivery: BodyPipeMachine.Delivery) {
        self.init(delivery: delivery, releasedWriter: nil)
    }
}
