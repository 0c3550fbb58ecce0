import Foundation
import Portico
import Testing

/// `type: quota` as `portico check` reads it: what it accepts, and each refusal with the line
/// and key path a user sees.
@Suite("Quota: configuration")
struct QuotaConfigTests {
    static func yaml(_ quota: String, stores: Bool = true) -> String {
        """
        \(stores ? "stores:\n  fleet: { type: redis, url: \"redis://127.0.0.1:6379\" }\n" : "")middleware:
          q:
        \(quota)
        \(minimalRoute)
        """
    }

    @Test("the issue's example parses: limit, calendar, zone, allocations in order, store")
    func parses() throws {
        let config = try load(Self.yaml("""
                type: quota
                key: header:X-Team
                limit: 1000000
                per: month
                timezone: Europe/Paris
                allocations: { team-a: 60%, team-b: 40% }
                store: fleet
                on_store_error: deny
                headers: false
            """))
        let quota = try #require(config.middleware["q"]?.settings(as: QuotaConfig.self))
        var expected = QuotaConfig(limit: 1_000_000, per: .month, store: "fleet")
        expected.key = [.header("x-team")]
        expected.timeZone = TimeZone(identifier: "Europe/Paris")!
        expected.allocations = [.init(key: "team-a", share: 0.6), .init(key: "team-b", share: 0.4)]
        expected.onStoreError = .deny
        expected.headers = false
        #expect(quota == expected)
        #expect(QuotaAllocations(quota).all.map(\.limit) == [600_000, 400_000, 0])
    }

    @Test("defaults: UTC, no key (one count for all), on_store_error local, headers on; an offset zone")
    func defaults() throws {
        let config = try load(Self.yaml("""
                type: quota
                limit: 50
                per: hour
                store: fleet
            """))
        let quota = try #require(config.middleware["q"]?.settings(as: QuotaConfig.self))
        #expect(quota.key.isEmpty && quota.timeZone.secondsFromGMT() == 0 && quota.onStoreError == .local && quota.headers)
        #expect(QuotaAllocations(quota).all == [QuotaAllocation(index: 0, name: "default", limit: 50)])
        let offset = try load(Self.yaml("    type: quota\n    limit: 5\n    per: day\n    store: fleet\n    timezone: \"-05:30\""))
        #expect(offset.middleware["q"]?.settings(as: QuotaConfig.self)?.timeZone.secondsFromGMT() == -(5 * 3600 + 1800))
        #expect(config.warnings.isEmpty && offset.warnings.isEmpty)
        // A key without allocations picks nothing: accepted, with a word.
        let keyed = try load(Self.yaml("    type: quota\n    limit: 5\n    per: day\n    store: fleet\n    key: client_ip"))
        #expect(keyed.warnings.map(\.description) == [
            "portico.yaml:9 middleware.q.key: has no effect without allocations: every request draws from the one count of limit",
        ])
    }

    @Test("allocations: listed keys get their share (rounded down), the rest is one pool, or default's share")
    func allocationShares() throws {
        var config = QuotaConfig(limit: 100, per: .day, store: "fleet")
        config.allocations = [.init(key: "a", share: 0.29), .init(key: "b", share: 1.0 / 3)]
        #expect(QuotaAllocations(config).all.map(\.limit) == [29, 33, 38])
        #expect(QuotaAllocations(config).allocation(forKey: "a").name == "a")
        #expect(QuotaAllocations(config).allocation(forKey: "c").name == "default")
        #expect(QuotaAllocations(config).allocation(forKey: nil).name == "default")
        config.defaultShare = 0
        #expect(QuotaAllocations(config).all.map(\.limit) == [29, 33, 0])
        config.defaultShare = 0.05
        #expect(QuotaAllocations(config).pool.limit == 5)
        #expect(QuotaConfig.share(0.6, of: 1_000_000_000_000) == 600_000_000_000)
    }

    @Test("a quota without a store is refused, with the reason")
    func missingStore() {
        #expect(diagnostics(Self.yaml("    type: quota\n    limit: 10\n    per: day", stores: false)) == [
            #"portico.yaml:2 middleware.q: missing required key "store": a quota is counted in a shared store (stores.NAME, type: redis) so that it survives restarts and holds across replicas"#,
        ])
        #expect(diagnostics(Self.yaml("    type: quota\n    limit: 10\n    per: day\n    store: flet")) == [
            #"portico.yaml:8 middleware.q.store: unknown store "flet" (did you mean "fleet"?)"#,
        ])
    }

    @Test("an unknown per, with a suggestion; limit and per are required")
    func period() {
        #expect(diagnostics(Self.yaml("    type: quota\n    limit: 10\n    per: mnth\n    store: fleet")) == [
            #"portico.yaml:7 middleware.q.per: expected one of hour, day, month, got "mnth" (did you mean "month"?)"#,
        ])
        #expect(diagnostics(Self.yaml("    type: quota\n    limit: 0\n    store: fleet")) == [
            #"portico.yaml:4 middleware.q: missing required key "per""#,
            #"portico.yaml:6 middleware.q.limit: must be between 1 and 1000000000000, got 0"#,
        ])
    }

    @Test("allocations over 100 % together, percentages out of range, a key needed to pick one")
    func allocations() {
        #expect(diagnostics(Self.yaml("""
                type: quota
                key: header:X-Team
                limit: 10
                per: day
                store: fleet
                allocations: { team-a: 60%, team-b: 45%, default: 5% }
            """)) == [#"portico.yaml:10 middleware.q.allocations: allocations add up to 110%, over 100% of limit"#])
        #expect(diagnostics(Self.yaml("""
                type: quota
                key: header:X-Team
                limit: 10
                per: day
                store: fleet
                allocations:
                  team-a: 120%
                  team-b: -5%
                  team-c: 5
            """)) == [
            #"portico.yaml:11 middleware.q.allocations.team-a: must be between 0% and 100%, got "120%""#,
            #"portico.yaml:12 middleware.q.allocations.team-b: expected a percentage such as 20%, got "-5%""#,
            #"portico.yaml:13 middleware.q.allocations.team-c: expected a percentage such as 20%, got "5""#,
        ])
        #expect(diagnostics(Self.yaml("""
                type: quota
                limit: 10
                per: day
                store: fleet
                allocations: { team-a: 50% }
            """)) == [
            #"portico.yaml:9 middleware.q.allocations: needs key: (client_ip, route, header:NAME or a list): the key's value picks the allocation"#,
        ])
    }

    @Test("a time zone must be an IANA name or an offset, with a suggestion for a near miss")
    func timeZones() {
        let base = "    type: quota\n    limit: 10\n    per: day\n    store: fleet\n    timezone: "
        #expect(diagnostics(Self.yaml(base + "Europe/Pari")) == [
            #"portico.yaml:9 middleware.q.timezone: unknown time zone "Europe/Pari" (did you mean "Europe/Paris"?); expected an IANA name such as Europe/Paris, UTC, or an offset such as +02:00"#,
        ])
        #expect(diagnostics(Self.yaml(base + "\"+15:00\"")) == [
            #"portico.yaml:9 middleware.q.timezone: expected a UTC offset from -14:00 to +14:00 such as +02:00, got "+15:00""#,
        ])
        #expect(diagnostics(Self.yaml(base + "\"+2\"")).count == 1)
    }
}
