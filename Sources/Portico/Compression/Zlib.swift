import CZlib
import NIOCore

/// gzip / zlib ("deflate" content-coding) over the system zlib: the one wrapper both the
/// `compress` middleware and the URLSession transport (which re-encodes bodies curl decoded) use.
public enum Zlib {
    public enum Format: Sendable {
        /// RFC 1952, `Content-Encoding: gzip`.
        case gzip
        /// RFC 1950 zlib stream, which is what `Content-Encoding: deflate` means.
        case zlib

        /// zlib selects the wrapper through the sign and range of `windowBits`.
        func windowBits(_ bits: Int32) -> Int32 {
            switch self {
            case .gzip: bits + 16
            case .zlib: bits
            }
        }
    }

    /// How hard and with how much memory to compress. Memory per stream is about
    /// `2^(windowBits+2) + 2^(memLevel+9)` bytes (256 KiB with the defaults), plus the output.
    public struct Settings: Sendable, Equatable {
        /// 1 (fastest) to 9 (smallest).
        public var level: Int32
        /// The LZ77 window, 2^windowBits bytes: 9...15.
        public var windowBits: Int32
        /// The hash table's memory, 1...9.
        public var memLevel: Int32

        public init(level: Int32 = 6, windowBits: Int32 = 15, memLevel: Int32 = 8) {
            self.level = level
            self.windowBits = windowBits
            self.memLevel = memLevel
        }
    }

    public struct Failure: Error, Sendable, Equatable, CustomStringConvertible {
        public var code: Int32
        /// The call that failed (`deflateInit2`, `deflate`, `inflate`, …).
        public var stage: String
        /// zlib's own message, when it gave one.
        public var message: String?

        public init(code: Int32, stage: String, message: String? = nil) {
            self.code = code
            self.stage = stage
            self.message = message
        }

        public var description: String {
            "zlib \(stage) failed with \(code)" + (message.map { ": \($0)" } ?? "")
        }
    }

    /// Input is fed to zlib in slices of at most this many bytes (`avail_in` is 32 bits wide).
    static let sliceBytes = 256 * 1024

    /// Compresses a whole buffer. The output may be larger than the input (incompressible data).
    public static func compress(_ input: ByteBuffer, format: Format = .gzip,
                                settings: Settings = Settings()) throws(Failure) -> ByteBuffer {
        let deflater = try Deflater(format: format, settings: settings)
        var output = ByteBuffer()
        output.reserveCapacity(deflater.bound(input.readableBytes))
        var offset = 0
        repeat {
            let end = min(offset + sliceBytes, input.readableBytes)
            _ = try deflater.deflate(input, range: offset..<end, finish: end == input.readableBytes,
                                     into: &output, limit: .max)
            offset = end
        } while offset < input.readableBytes
        return output
    }

    public static func compress(_ input: some Collection<UInt8>, format: Format = .gzip,
                                level: Int32 = 6) throws(Failure) -> [UInt8] {
        Array(try compress(ByteBuffer(bytes: input), format: format, settings: Settings(level: level)).readableBytesView)
    }

    /// Decompresses a whole gzip or zlib stream (auto-detected), refusing output past `limit`.
    public static func decompress(_ input: some Collection<UInt8>, limit: Int = .max) throws -> [UInt8] {
        var stream = z_stream()
        var status = portico_inflateInit2(&stream, 15 + 32)
        guard status == Z_OK else { throw Failure(code: status, stage: "inflateInit2") }
        defer { inflateEnd(&stream) }
        var source = Array(input)
        guard source.count <= Int(UInt32.max) else { throw Failure(code: Z_BUF_ERROR, stage: "input too large") }
        var output: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        try source.withUnsafeMutableBufferPointer { src in
            stream.next_in = src.baseAddress
            stream.avail_in = UInt32(src.count)
            repeat {
                let produced: Int = chunk.withUnsafeMutableBufferPointer { dst in
                    stream.next_out = dst.baseAddress
                    stream.avail_out = UInt32(dst.count)
                    status = inflate(&stream, Z_NO_FLUSH)
                    return dst.count - Int(stream.avail_out)
                }
                guard status == Z_OK || status == Z_STREAM_END else { throw Failure(code: status, stage: "inflate") }
                output.append(contentsOf: chunk[..<produced])
                guard output.count <= limit else { throw Failure(code: Z_BUF_ERROR, stage: "limit") }
                if status == Z_OK, produced == 0, stream.avail_in == 0 { throw Failure(code: Z_DATA_ERROR, stage: "truncated") }
            } while status != Z_STREAM_END
        }
        return output
    }
}

/// One deflate stream. It owns the `z_stream`, which sits at a fixed address because zlib keeps
/// a pointer back to it (and refuses a moved stream). Not `Sendable`: one task drives it.
final class Deflater {
    private let stream: UnsafeMutablePointer<z_stream>

    init(format: Zlib.Format, settings: Zlib.Settings) throws(Zlib.Failure) {
        // Kept local until zlib accepted it: `deinit` must only ever see an initialised stream.
        let stream = UnsafeMutablePointer<z_stream>.allocate(capacity: 1)
        stream.initialize(to: z_stream())
        let status = portico_deflateInit2(stream, settings.level, Z_DEFLATED, format.windowBits(settings.windowBits),
                                          settings.memLevel, Z_DEFAULT_STRATEGY)
        guard status == Z_OK else {
            let failure = Self.failure(status, "deflateInit2", stream)
            stream.deinitialize(count: 1)
            stream.deallocate()
            throw failure
        }
        self.stream = stream
    }

    deinit {
        deflateEnd(stream)
        stream.deinitialize(count: 1)
        stream.deallocate()
    }

    /// zlib's bound on the compressed size of `count` input bytes, headers included.
    func bound(_ count: Int) -> Int {
        Int(deflateBound(stream, UInt(count)))
    }

    /// Compresses `input[range]` (reader-relative offsets), appending to `output` while
    /// `output` stays within `limit` readable bytes. `finish` ends the stream after this input;
    /// `syncFlush` emits everything compressed so far on a byte boundary (a streamed body's
    /// chunk goes out at once). Returns `false` when the limit was reached first (the stream is
    /// then unusable).
    func deflate(_ input: ByteBuffer, range: Range<Int>, finish: Bool, syncFlush: Bool = false,
                 into output: inout ByteBuffer, limit: Int) throws(Zlib.Failure) -> Bool {
        precondition(range.count <= Zlib.sliceBytes, "feed zlib in slices")
        let flush = finish ? Z_FINISH : syncFlush ? Z_SYNC_FLUSH : Z_NO_FLUSH
        return try input.withUnsafeReadableBytes { (raw: UnsafeRawBufferPointer) throws(Zlib.Failure) -> Bool in
            let slice = UnsafeRawBufferPointer(rebasing: raw[range])
            stream.pointee.next_in = slice.baseAddress.map { UnsafeMutablePointer(mutating: $0.assumingMemoryBound(to: Bytef.self)) }
            stream.pointee.avail_in = UInt32(slice.count)
            defer {
                stream.pointee.next_in = nil
                stream.pointee.avail_in = 0
            }
            while true {
                let room = limit - output.readableBytes
                guard room > 0 else { return false }
                var status = Z_OK
                var outputFull = false
                output.writeWithUnsafeMutableBytes(minimumWritableBytes: min(room, 16 * 1024)) { out in
                    let available = min(out.count, room, Int(UInt32.max))
                    stream.pointee.next_out = out.baseAddress!.assumingMemoryBound(to: Bytef.self)
                    stream.pointee.avail_out = UInt32(available)
                    status = CZlib.deflate(stream, flush)
                    outputFull = stream.pointee.avail_out == 0
                    let produced = available - Int(stream.pointee.avail_out)
                    stream.pointee.next_out = nil
                    stream.pointee.avail_out = 0
                    return produced
                }
                switch status {
                case Z_STREAM_END:
                    return true
                case Z_OK, Z_BUF_ERROR:
                    // More output space is all zlib needs while the last call filled it.
                    if outputFull { continue }
                    if !finish, stream.pointee.avail_in == 0 { return true }
                    // Room left, input left (or finishing), yet no progress: zlib's state is broken.
                    if status == Z_BUF_ERROR { throw Self.failure(status, "deflate", stream) }
                default:
                    throw Self.failure(status, "deflate", stream)
                }
            }
        }
    }

    private static func failure(_ status: Int32, _ stage: String, _ stream: UnsafeMutablePointer<z_stream>) -> Zlib.Failure {
        Zlib.Failure(code: status, stage: stage, message: stream.pointee.msg.map { String(cString: $0) })
    }
}
