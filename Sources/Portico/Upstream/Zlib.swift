import CZlib

/// gzip / zlib ("deflate" content-coding) compression over the system zlib.
public enum Zlib {
    public enum Format: Sendable {
        /// RFC 1952, `Content-Encoding: gzip`.
        case gzip
        /// RFC 1950 zlib stream, which is what `Content-Encoding: deflate` means.
        case zlib

        var windowBits: Int32 {
            switch self {
            case .gzip: 15 + 16
            case .zlib: 15
            }
        }
    }

    public struct Failure: Error, Sendable, Equatable {
        public var code: Int32
        public var stage: String
    }

    public static func compress(_ input: some Collection<UInt8>, format: Format = .gzip, level: Int32 = 6) throws -> [UInt8] {
        var stream = z_stream()
        var status = portico_deflateInit2(&stream, level, Z_DEFLATED, format.windowBits, 8, Z_DEFAULT_STRATEGY)
        guard status == Z_OK else { throw Failure(code: status, stage: "deflateInit2") }
        defer { deflateEnd(&stream) }
        var source = Array(input)
        var output = [UInt8](repeating: 0, count: Int(deflateBound(&stream, UInt(source.count))) + 32)
        let produced: Int = try source.withUnsafeMutableBufferPointer { src in
            try output.withUnsafeMutableBufferPointer { dst in
                stream.next_in = src.baseAddress
                stream.avail_in = UInt32(src.count)
                stream.next_out = dst.baseAddress
                stream.avail_out = UInt32(dst.count)
                status = deflate(&stream, Z_FINISH)
                guard status == Z_STREAM_END else { throw Failure(code: status, stage: "deflate") }
                return dst.count - Int(stream.avail_out)
            }
        }
        output.removeSubrange(produced...)
        return output
    }

    /// Decompresses a whole gzip or zlib stream (auto-detected), refusing output past `limit`.
    public static func decompress(_ input: some Collection<UInt8>, limit: Int = .max) throws -> [UInt8] {
        var stream = z_stream()
        var status = portico_inflateInit2(&stream, 15 + 32)
        guard status == Z_OK else { throw Failure(code: status, stage: "inflateInit2") }
        defer { inflateEnd(&stream) }
        var source = Array(input)
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
