import Foundation
import HTTPTypes
import NIOCore

/// One stored response (RFC 9111 §3): the head as it will be served, the body, the secondary
/// key it answers, and the times needed to compute its age.
public struct CacheEntry: Sendable {
    /// The primary key (authority and target).
    public var key: String
    public var vary: VaryKey
    public var status: HTTPResponse.Status
    /// Stored fields: hop-by-hop and `private="…"` fields removed, `Content-Length` exact.
    public var headerFields: HTTPFields
    public var body: ByteBuffer
    public var freshness: ResponseFreshness
    /// When the response was received, on the monotonic clock (resident time never jumps).
    public var receivedAt: ContinuousClock.Instant
    /// Whether the request that stored it carried `Authorization` (§3.5).
    public var storedWithAuthorization: Bool

    public init(key: String, vary: VaryKey, status: HTTPResponse.Status, headerFields: HTTPFields, body: ByteBuffer,
                freshness: ResponseFreshness, receivedAt: ContinuousClock.Instant, storedWithAuthorization: Bool) {
        self.key = key
        self.vary = vary
        self.status = status
        self.headerFields = headerFields
        self.body = body
        self.freshness = freshness
        self.receivedAt = receivedAt
        self.storedWithAuthorization = storedWithAuthorization
    }

    /// Bytes charged against `max_bytes`: body, fields, key and a fixed overhead for the
    /// bookkeeping around them.
    public var size: Int {
        var total = body.readableBytes + key.utf8.count + 256
        for field in headerFields { total += field.name.rawName.utf8.count + field.value.utf8.count + 32 }
        for (name, value) in zip(vary.names, vary.values) { total += name.utf8.count + (value?.utf8.count ?? 0) + 16 }
        return total
    }

    public var etag: String? { headerFields[.eTag] }
    public var lastModified: String? { headerFields[.lastModified] }
    public var hasValidators: Bool { etag != nil || lastModified != nil }

    public func age(at now: ContinuousClock.Instant) -> Duration {
        freshness.age(residentFor: receivedAt.duration(to: now))
    }

    /// Seconds of freshness left at `now` (negative when stale), as `Cache-Status` `ttl` shows it.
    public func ttlSeconds(at now: ContinuousClock.Instant) -> Int {
        let remaining = freshness.lifetime - age(at: now)
        return Int(remaining.components.seconds)
    }
}
