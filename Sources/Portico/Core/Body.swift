import NIOCore

/// A message body. Bodies start out buffered and bounded by configuration; the storage is
/// an enum so a streamed variant (an async sequence of buffers) can be added later without
/// touching middleware that never reads bodies.
public struct Body: Sendable {
    enum Storage: Sendable {
        case buffer(ByteBuffer)
    }

    var storage: Storage

    public static let empty = Body(ByteBuffer())

    public init(_ buffer: ByteBuffer) {
        storage = .buffer(buffer)
    }

    public init(bytes: some Sequence<UInt8>) {
        self.init(ByteBuffer(bytes: bytes))
    }

    public init(string: String) {
        self.init(ByteBuffer(string: string))
    }

    /// The length when it is known up front.
    public var count: Int? {
        switch storage {
        case .buffer(let buffer): buffer.readableBytes
        }
    }

    /// The whole body as one buffer; `nil` for a body that is not buffered.
    public var buffer: ByteBuffer? {
        switch storage {
        case .buffer(let buffer): buffer
        }
    }

    /// The body's bytes as an array (tests, small bodies).
    public var bytes: [UInt8] {
        switch storage {
        case .buffer(let buffer): Array(buffer.readableBytesView)
        }
    }

    /// Whether the body can be sent again (retries, 401 replays).
    public var isReplayable: Bool {
        switch storage {
        case .buffer: true
        }
    }
}

extension Body: ExpressibleByStringLiteral {
    public init(stringLiteral value: String) {
        self.init(string: value)
    }
}
