import Crypto

/// A Lua script and its SHA-1, the name `EVALSHA` calls it by (computed here, so the first call
/// needs no `SCRIPT LOAD` round trip).
public struct RedisScript: Sendable, Equatable {
    public let source: String
    /// Lower-case hex, as Redis prints it.
    public let sha1: String

    public init(_ source: String) {
        self.source = source
        self.sha1 = Self.sha1Hex(Array(source.utf8))
    }

    /// SHA-1 (swift-crypto's). Only names scripts (Redis' choice), never used for security.
    static func sha1Hex(_ message: [UInt8]) -> String {
        Insecure.SHA1.hash(data: message).map { byte in
            let hex = String(byte, radix: 16)
            return byte < 16 ? "0" + hex : hex
        }.joined()
    }
}
