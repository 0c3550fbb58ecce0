import NIOCore
import Synchronization
import Testing
@testable import Portico

/// `BodyPipeMachine` driven as a value (waiters are plain strings), and `BodyStream` over it.
@Suite struct BodyPipeMachineTests {
    typealias Machine = BodyPipeMachine<String, String>

    static func bytes(_ count: Int) -> ByteBuffer { ByteBuffer(repeating: 0x61, count: count) }

    static func chunkSize(_ take: Machine.Take?) -> Int? {
        if case .chunk(let buffer)? = take?.delivery { return buffer.readableBytes }
        return nil
    }

    @Test func aWriterIsToldFullAtHighWaterAndReleasedAtHalf() {
        var machine = Machine(highWater: 10)
        let first = machine.append(Self.bytes(6))
        guard case .queued(nil, full: false) = first else { Issue.record("\(first)"); return }
        let second = machine.append(Self.bytes(6))
        guard case .queued(nil, full: true) = second else { Issue.record("\(second)"); return }
        let wait = machine.wait(writer: "writer")
        guard case .parked = wait else { Issue.record("\(wait)"); return }
        #expect(machine.queued == 12)

        // Taking 6 leaves 6, above half: the writer stays parked.
        let taken = machine.take()
        #expect(Self.chunkSize(taken) == 6)
        #expect(taken?.releasedWriter == nil)
        // Taking the rest releases it.
        let rest = machine.take()
        #expect(Self.chunkSize(rest) == 6)
        #expect(rest?.releasedWriter == "writer")
        #expect(machine.queued == 0)
    }

    @Test func aWriterThatMustWaitGoesOnIfTheReaderTookTheQueueDownMeanwhile() {
        var machine = Machine(highWater: 4)
        _ = machine.append(Self.bytes(4))
        _ = machine.take()
        let wait = machine.wait(writer: "writer")
        guard case .proceed = wait else { Issue.record("\(wait)"); return }
    }

    @Test func aParkedReaderIsHandedTheNextWriteAndTheEndComesAfterTheQueue() {
        var machine = Machine(highWater: 100)
        #expect(machine.take(orPark: "reader") == nil)
        let appended = machine.append(Self.bytes(3))
        guard case .queued("reader", full: false) = appended else { Issue.record("\(appended)"); return }
        _ = machine.append(Self.bytes(5))
        #expect(machine.end(failure: nil) == nil, "the reader was handed over with the first write")
        #expect(Self.chunkSize(machine.take()) == 3)
        #expect(Self.chunkSize(machine.take()) == 5)
        let end = machine.take()
        guard case .end? = end?.delivery else { Issue.record("\(String(describing: end))"); return }
    }

    @Test func aWritersFailureIsDeliveredAfterWhatItQueuedAndOnlyTheFirstEndCounts() {
        var machine = Machine(highWater: 100)
        _ = machine.append(Self.bytes(2))
        _ = machine.end(failure: GatewayError(.upstreamConnectionClosed, message: "reset"))
        _ = machine.end(failure: nil)
        #expect(Self.chunkSize(machine.take()) == 2)
        let failed = machine.take()
        guard case .failed(let error)? = failed?.delivery else { Issue.record("\(String(describing: failed))"); return }
        #expect(error.kind == .upstreamConnectionClosed)
    }

    @Test func theReaderLeavingDropsTheQueueAndTellsEveryoneOnce() {
        var machine = Machine(highWater: 4)
        let told = Mutex<[GatewayError.Kind]>([])
        #expect(machine.onReaderGone { error in told.withLock { $0.append(error.kind) } } == nil)
        _ = machine.append(Self.bytes(8))
        _ = machine.wait(writer: "writer")
        let departure = machine.readerLeaves(.clientClosedRequest())
        #expect(departure?.writer == "writer")
        #expect(departure?.reader == nil)
        departure?.handler?(.clientClosedRequest())
        #expect(told.withLock { $0 } == [.clientClosedRequest])
        #expect(machine.queued == 0)
        #expect(machine.readerLeaves(.clientClosedRequest()) == nil, "idempotent")

        let late = machine.append(Self.bytes(1))
        guard case .readerGone(let reason) = late else { Issue.record("\(late)"); return }
        #expect(reason.kind == .clientClosedRequest)
        #expect(machine.onReaderGone { _ in }?.kind == .clientClosedRequest, "a late handler hears at once")
        #expect(machine.end(failure: nil) == nil)
    }

    @Test func theWriterIsNotToldWhenTheBodyWasReadWholeOrItFailedItself() {
        var whole = Machine(highWater: 4)
        _ = whole.onReaderGone { _ in }
        _ = whole.append(Self.bytes(1))
        _ = whole.end(failure: nil)
        _ = whole.take()
        #expect(whole.readerLeaves(.clientClosedRequest())?.handler == nil)

        var unread = Machine(highWater: 4)
        _ = unread.onReaderGone { _ in }
        _ = unread.append(Self.bytes(1))
        _ = unread.end(failure: nil)
        #expect(unread.readerLeaves(.clientClosedRequest())?.handler != nil, "finished but not read: the writer hears")

        var failed = Machine(highWater: 4)
        _ = failed.onReaderGone { _ in }
        _ = failed.end(failure: .clientClosedRequest())
        #expect(failed.readerLeaves(.clientClosedRequest())?.handler == nil)
    }

    // MARK: BodyStream over the machine

    @Test func aStreamCarriesEveryByteThroughASmallWindowWithBackpressure() async throws {
        let (stream, writer) = BodyStream.makeStream(highWater: 8)
        let total = 1000
        async let written: Void = {
            for _ in 0..<(total / 10) { try await writer.write(Self.bytes(10)) }
            writer.finish()
        }()
        var read = 0
        while let buffer = try await stream.next() { read += buffer.readableBytes }
        try await written
        #expect(read == total)
    }

    @Test func aPollingReaderIsWokenAndAPausedOfferResumed() {
        let (stream, writer) = BodyStream.makeStream(highWater: 4)
        let woken = Mutex(0)
        let resumed = Mutex(0)
        guard case .pending = stream.poll(wake: { woken.withLock { $0 += 1 } }) else { Issue.record("not pending"); return }
        #expect(writer.offer(Self.bytes(4), resume: { resumed.withLock { $0 += 1 } }) == .full)
        #expect(woken.withLock { $0 } == 1)
        guard case .chunk(let chunk) = stream.poll(wake: {}) else { Issue.record("no chunk"); return }
        #expect(chunk.readableBytes == 4)
        #expect(resumed.withLock { $0 } == 1)
        writer.finish()
        guard case .end = stream.poll(wake: {}) else { Issue.record("no end"); return }
    }

    @Test func aWriterWaitingOnAReaderThatLeavesThrowsTheReadersReason() async {
        let (stream, writer) = BodyStream.makeStream(highWater: 4)
        let gone = Mutex<GatewayError.Kind?>(nil)
        writer.onReaderGone { error in gone.withLock { $0 = error.kind } }
        let write = Task { try await writer.write(Self.bytes(8)) }
        // The write parks (8 ≥ 4); the reader leaves, and the write must end with its reason
        // whether it had parked yet or not.
        stream.cancel(GatewayError(.requestTimeout, message: "gave up"))
        let result = await write.result
        #expect(throws: GatewayError.self) { try result.get() }
        #expect((try? result.get()) == nil)
        if case .failure(let error as GatewayError) = result { #expect(error.kind == .requestTimeout) }
        #expect(gone.withLock { $0 } == .requestTimeout)
        #expect(writer.readerGone?.kind == .requestTimeout)
    }
}
