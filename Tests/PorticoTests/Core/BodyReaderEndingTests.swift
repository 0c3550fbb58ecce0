import NIOCore
import Portico
import Synchronization
import Testing

/// The stages of a body read with `next()` hear how it ended as soon as `next` reports it.
@Suite("BodyReader: endings")
struct BodyReaderEndingTests {
    final class Recorder: BodyStage {
        let endings = Mutex<[StreamEnding]>([])
        func process(_ chunk: ByteBuffer) throws(GatewayError) -> ByteBuffer { chunk }
        func finish() throws(GatewayError) -> ByteBuffer? { nil }
        func ended(_ ending: StreamEnding, error: GatewayError?) { endings.withLock { $0.append(ending) } }
    }

    @Test("a writer's failure thrown by next() reaches the stages at once, not when the reader goes")
    func failureReported() async throws {
        var (body, writer) = MiddlewareStreamFixture.body()
        let recorder = Recorder()
        body.append(recorder, keepsLength: true)
        let reader = body.reader()
        try await writer.write(ByteBuffer(string: "a"))
        _ = try await reader.next()
        writer.fail(GatewayError(.upstreamTimeout, message: "idle"))
        await #expect(throws: GatewayError.self) { try await reader.next() }
        #expect(recorder.endings.withLock { $0 } == [.timeout])
        reader.close(nil)
        #expect(recorder.endings.withLock { $0 } == [.timeout])
    }

    @Test("a stage's failure thrown by next() reaches the stages at once")
    func stageFailureReported() async throws {
        final class Refusing: BodyStage {
            func process(_ chunk: ByteBuffer) throws(GatewayError) -> ByteBuffer {
                throw GatewayError(.upstreamResponseTooLarge, message: "too large")
            }
            func finish() throws(GatewayError) -> ByteBuffer? { nil }
            func ended(_ ending: StreamEnding, error: GatewayError?) {}
        }
        var (body, writer) = MiddlewareStreamFixture.body()
        let recorder = Recorder()
        body.append(Refusing(), keepsLength: true)
        body.append(recorder, keepsLength: true)
        let reader = body.reader()
        try await writer.write(ByteBuffer(string: "a"))
        await #expect(throws: GatewayError.self) { try await reader.next() }
        #expect(recorder.endings.withLock { $0 } == [.tooLarge])
        #expect(writer.readerGone != nil)
    }
}
