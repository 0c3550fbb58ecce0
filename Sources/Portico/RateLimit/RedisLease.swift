import RedisClient

/// A short lease on a Redis key, so that one replica of the fleet does a job for all (a token
/// fetch, a cache fill): taken with `SET NX PX` under a random fence, freed only by the holder of
/// that fence, and lapsing by itself if the holder is gone.
enum RedisLease {
    /// A fence no other taker will draw (128 random bits, hex).
    static func fence() -> String {
        (0..<2).map { _ in String(UInt64.random(in: .min ... .max), radix: 16) }.joined()
    }

    /// Whether `fence` now holds `key` for `duration` (at least 1 ms); `false`: another does.
    static func take(_ key: [UInt8], fence: String, for duration: Duration, on backend: RedisBucketStore,
                     timeout: Duration? = nil) async throws(RedisError) -> Bool {
        let reply = try await backend.send(["SET", .bytes(key), .string(fence), "NX", "PX",
                                            .string(String(max(1, duration.wholeMilliseconds)))], timeout: timeout)
        return reply.string == "OK"
    }

    /// Frees `key` if `fence` still holds it (a lease that lapsed and was taken again is not ours).
    static func release(_ key: [UInt8], fence: String, on backend: RedisBucketStore, timeout: Duration?) async throws(RedisError) {
        _ = try await backend.evaluate(RedisBucketStore.compareAndDeleteScript, keys: [key], arguments: [.string(fence)],
                                       timeout: timeout)
    }
}

extension Duration {
    /// Whole milliseconds, rounded toward zero (Redis's `PX` and the fleet records' unit).
    var wholeMilliseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1000 + attoseconds / 1_000_000_000_000_000
    }
}
