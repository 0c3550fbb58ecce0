import Crypto
import Foundation

/// `encryption_key` of a credential shared on a store: one or more 256-bit AES keys. The first
/// seals what this replica writes; every one opens, so a key can be rotated (add the new one
/// first, keep the old one until every token sealed with it has expired). Never printed.
public struct TokenEncryptionKeys: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    /// The raw keys, 32 bytes each, the sealing one first.
    let keys: [[UInt8]]

    /// `nil` unless every key is 32 bytes and there is at least one.
    public init?(_ keys: [[UInt8]]) {
        guard !keys.isEmpty, keys.allSatisfy({ $0.count == 32 }) else { return nil }
        self.keys = keys
    }

    public var count: Int { keys.count }
    public var description: String { "TokenEncryptionKeys(\(keys.count) key(s), <redacted>)" }
    public var debugDescription: String { description }
}

/// Seals a token record for the store and opens one read from it: AES-256-GCM (swift-crypto)
/// with a random nonce, the record's Redis key as additional data (a record copied under
/// another credential's key does not open), and the sealing key's id beside it, so a reader
/// knows which key to use and a record sealed with a retired key is told apart from a damaged
/// one. Key id: the first 8 hex digits of the key's SHA-256 — it names a key without revealing it.
struct TokenVault: Sendable {
    enum OpenFailure: Error, Equatable {
        /// Not a record this format writes.
        case malformed
        /// Sealed with a key this replica does not have (rotated out, or another deployment's).
        case unknownKey(id: String)
        /// The key is known but the record does not open: damaged, or moved from another key.
        case rejected
    }

    private let sealing: (id: String, key: SymmetricKey)
    private let opening: [String: SymmetricKey]

    init(_ keys: TokenEncryptionKeys) {
        let named = keys.keys.map { (Self.id(of: $0), SymmetricKey(data: $0)) }
        sealing = named[0]
        opening = Dictionary(named, uniquingKeysWith: { first, _ in first })
    }

    static func id(of key: [UInt8]) -> String {
        SHA256.hash(data: key).prefix(4).map { String(format: "%02x", $0) }.joined()
    }

    /// `v1.<key id>.<base64 of nonce, ciphertext and tag>`.
    func seal(_ plaintext: [UInt8], boundTo context: [UInt8]) throws -> String {
        let box = try AES.GCM.seal(plaintext, using: sealing.key, nonce: AES.GCM.Nonce(), authenticating: context)
        guard let combined = box.combined else { throw OpenFailure.malformed }
        return "v1.\(sealing.id).\(combined.base64EncodedString())"
    }

    func open(_ record: String, boundTo context: [UInt8]) throws(OpenFailure) -> [UInt8] {
        let parts = record.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == "v1", let combined = Data(base64Encoded: String(parts[2])) else {
            throw .malformed
        }
        let id = String(parts[1])
        guard let key = opening[id] else { throw .unknownKey(id: id) }
        do {
            let box = try AES.GCM.SealedBox(combined: combined)
            return Array(try AES.GCM.open(box, using: key, authenticating: context))
        } catch {
            throw .rejected
        }
    }
}
