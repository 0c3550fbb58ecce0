@testable import Portico
import RedisClient
import Testing

/// During a rolling upgrade, replicas of two releases share one Redis: each release's scripts read
/// what the other's wrote (docs/operations.md, "Upgrading a fleet that shares Redis"). Every
/// script is pinned here by its SHA-1 with the rule that keeps that safe, so a changed script
/// fails until its author has decided what the previous release makes of the new data — and
/// then pins the new hash. The provider budgets' script is pinned with its key's layout version
/// in `ProviderBudgetLayoutTests`.
@Suite("Redis scripts: each pinned with what a replica of the previous release makes of its data")
struct RedisScriptLayoutTests {
    struct Pinned: Sendable, CustomTestStringConvertible {
        let name: String
        let script: RedisScript
        let sha1: String
        /// What keeps a rolling upgrade safe: said when the script has changed.
        let rule: String
        var testDescription: String { name }
    }

    static let scripts: [Pinned] = [
        Pinned(name: "rate_limit, on_limit: reject", script: RedisBucketStore.script,
               sha1: "a97729d54eea63addaf3d85fabfd59e500e16f07",
               rule: "a bucket is a hash of `tokens` and `time` (microseconds of the server's clock); keep both and their "
                   + "units, or give the buckets another key (a bucket that is lost only refills)"),
        Pinned(name: "rate_limit, on_limit: wait", script: RedisBucketStore.reserveScript,
               sha1: "37eeb480b7694befc000721e1823c83ef7b6ae83",
               rule: "a `:w:` key is one number, when the bucket is full again in microseconds of the server's clock; "
                   + "keep it, or give the slots another key"),
        Pinned(name: "rate_limit, a reserved slot given back", script: RedisBucketStore.giveBackScript,
               sha1: "d4abc233f272404cd3175196da86b4e17686ce30",
               rule: "it edits the `:w:` number the reserve script writes: the two change together"),
        Pinned(name: "lease freed by its holder", script: RedisBucketStore.compareAndDeleteScript,
               sha1: "7f8f6677b8f2b4b65b9b9905151ced126e6b7e49",
               rule: "a lease's value is its holder's fence (token refresh, fleet cache fill): an older replica "
                   + "must still be able to free the leases it took"),
        Pinned(name: "quota count", script: RedisQuotaStore.script,
               sha1: "7c03018a64d9e37e01fceb696f18860b4b2a8752",
               rule: "a count is a plain integer under its window's key and its meaning never changes: a new key or "
                   + "field would reset every allocation's month"),
        Pinned(name: "shared token written under its lease", script: SharedTokenSource.writeScript,
               sha1: "4ddfa58decdaccbf0e3f936983cabbd6e37f1d75",
               rule: "the record is sealed JSON (a field an older reader does not know is ignored) and the lease "
                   + "holds the writer's fence"),
        Pinned(name: "fleet cache entry written", script: SharedCacheTier.writeScript,
               sha1: "f60bdaa9ae3b111de7d3bd22999a208cfa1e5276",
               rule: "each variant is a `CacheEntryCodec` record, which carries its format's version (a record a "
                   + "replica cannot read is a miss); `paths`, `expiry` and the tag sets are read by purges of both releases"),
        Pinned(name: "fleet cache purge", script: SharedCacheTier.purgeScript,
               sha1: "77f1cc312d888b1e586afeba0ab67dae825d866b",
               rule: "its stream events (`seq`, `origin`, `kind`, `value`, `authority`) are read by every replica's "
                   + "invalidation feed, of both releases: add fields, never change one's meaning"),
    ]

    @Test("each script is the one its rule was decided for", arguments: scripts)
    func pinned(_ pinned: Pinned) {
        #expect(pinned.script.sha1 == pinned.sha1, """
            The \(pinned.name) script changed. During a rolling upgrade the previous release reads \
            what it writes: \(pinned.rule). Decide what that release makes of the new data, then pin \
            the new SHA-1 here.
            """)
    }
}
