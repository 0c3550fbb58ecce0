@testable import Portico
import Testing

/// The fleet's provider budgets live in one Redis hash per scope, written by one script. During a
/// rolling upgrade old and new replicas run side by side on that hash: a script whose fields change
/// meaning must move to a new key (`RedisProviderBudgets.layout`), or each version would read the
/// other's fields as its own.
@Suite("Provider limits: the fleet's hash layout is versioned with its script")
struct ProviderBudgetLayoutTests {
    @Test("the budget script is pinned to its layout version: a changed script fails here until its layout is decided")
    func scriptPinnedToItsLayout() {
        // When this fails: if the script reads or writes a field with another meaning (or drops
        // one an older replica still reads), bump `RedisProviderBudgets.layout`; either way record
        // the new hash here.
        let pinned: [Int: String] = [2: "81383522c1edb8ba421040e0971bf4ceb6ea03bf"]
        #expect(pinned[RedisProviderBudgets.layout] == RedisProviderBudgets.script.sha1,
                "the provider budget script changed: decide its layout (RedisProviderBudgets.layout), then pin its hash")
    }

    @Test("the layout version is part of every scope's key, after the store's prefix")
    func keyCarriesTheLayout() {
        #expect(RedisProviderBudgets.hashName(prefix: "portico:", upstream: "vendor", scope: "key-a")
                == "portico:provider:v\(RedisProviderBudgets.layout):vendor:key-a")
    }
}
