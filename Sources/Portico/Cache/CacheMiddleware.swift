import Foundation
import HTTPTypes
import NIOCore

// Over 450 lines on purpose: this is RFC 9111's request flow (lookup, freshness, validation,
// stale serving, coalescing, invalidation), read top to bottom as one sequence; what stands
// alone already lives beside it (CacheStore, CacheTee, ResponseFreshness, ConditionalRequest,
// RequestCoalescer, CachePolicy, VaryKey).

/// `type: cache` — a shared HTTP cache (RFC 9111) in memory. GET responses are stored when
/// the upstream allows it and served to later GET and HEAD requests while fresh; stale ones
/// are validated with a conditional request, served stale where `stale-while-revalidate`,
/// `stale-if-error` or the client's `max-stale` allow, and concurrent misses for one key
/// share one upstream fetch. Unsafe methods pass through and invalidate what they change.
///
/// A streamed response (no `Content-Length`, or a long one) is passed on at once and stored as
/// it flows (`CacheTee`): only when it ends complete within `max_object_bytes`. Requests
/// waiting on its fetch get the stored copy then, or go upstream themselves as soon as it
/// cannot be stored.
///
/// Place it after rate limiting and before `retry` and `auth`: hits cost no upstream request
/// and no retry budget, and the credential `auth` injects never reaches the cache key.
public struct CacheMiddleware: ImmediateMiddleware {
    public let name: String
    public let config: CacheConfig
    public let policy: CachePolicy
    public let store: any CacheStore
    let coalescer: RequestCoalescer
    let refresher: BackgroundRefresher
    let metrics: CacheMetrics
    /// The fleet tier (`store:`), below the memory tier; `nil` without one.
    let tiers: TieredCacheStore?
    /// Other replicas' invalidations, applied to this memory tier while the runtime serves.
    let feed: CacheInvalidationFeed?

    public init(name: String, _ config: CacheConfig, store: (any CacheStore)? = nil, metrics: CacheMetrics? = nil) {
        self.init(name: name, config, store: store, metrics: metrics, feed: nil)
    }

    init(name: String, _ config: CacheConfig, store: (any CacheStore)?, metrics: CacheMetrics?, feed: CacheInvalidationFeed?) {
        self.name = name
        self.config = config
        policy = CachePolicy(config)
        self.store = store ?? InMemoryCacheStore(maxBytes: config.maxBytes)
        coalescer = RequestCoalescer(limit: config.maxInFlight)
        refresher = BackgroundRefresher(limit: config.maxInFlight)
        self.metrics = metrics ?? CacheMetrics(cache: name)
        tiers = store as? TieredCacheStore
        self.feed = feed
    }

    /// Starts following the fleet's invalidations; called once the runtime is built.
    func start() {
        feed?.start()
    }

    /// Cancels background refreshes and waits for them; called when the runtime is retired.
    public func shutdown() async {
        await feed?.stop()
        await refresher.shutdown()
    }

    /// Background refreshes running now.
    public var backgroundRefreshes: Int { refresher.running }

    /// Requests waiting on another request's fetch right now.
    public var waitingRequests: Int { coalescer.waiting }

    /// The primary key: authority and target as the client sent them (before `strip_prefix`).
    /// A route's `auth` runs inside the cache, so an injected credential is never part of it.
    public static func key(for request: GatewayRequest) -> String {
        key(authority: request.head.authority, target: request.target)
    }

    /// The key for a target on an authority (case-insensitive) — built in one allocation: a hit
    /// pays for it.
    static func key(authority: String?, target: String) -> String {
        var host = authority ?? ""
        if host.utf8.contains(where: { $0 &- UInt8(ascii: "A") < 26 || $0 >= 0x80 }) { host = host.lowercased() }
        var key = ""
        key.reserveCapacity(host.utf8.count + 1 + target.utf8.count)
        key += host
        key += "\u{0}"
        key += target
        return key
    }

    public func handle(_ request: GatewayRequest, context: RequestContext, next: @escaping NextHandler) async throws -> GatewayResponse {
        switch request.method {
        case .get, .head:
            break
        case .options, .trace, .connect:
            return try await passThrough(request, context: context, next: next,
                                         status: CacheStatus(.bypass, forward: .method))
        default:
            return try await forwardUnsafe(request, context: context, next: next)
        }
        if request.headerFields[.range] != nil {
            return try await passThrough(request, context: context, next: next,
                                         status: CacheStatus(.bypass, forward: .bypass, detail: "range"))
        }

        let now = context.clock.now
        var found = lookup(request, at: now)
        if let response = answerFromStore(found, to: request, context: context, at: now) { return response }
        if let tiers {
            // Not in this replica's memory: another replica may have stored it. Read even for a
            // request's `no-cache`: what the fleet holds gives the validators its fetch sends.
            if await consultFleet(tiers, key: found.key, context: context) {
                found = lookup(request, key: found.key, directives: found.directives, at: now)
                if let response = answerFromStore(found, to: request, context: context, at: now) {
                    tiers.fleet.count(.hit)
                    return response
                }
            }
            tiers.fleet.count(.miss)
        }
        let (key, directives) = (found.key, found.directives)
        var reason: CacheStatus.Forward = found.variantCount == 0 ? .uriMiss : .varyMiss
        if let selected = found.selected {
            switch found.usability {
            case .staleWhileRevalidate:
                metrics.stale(.staleWhileRevalidate)
                refreshInBackground(request, key: key, stored: selected, context: context, next: next)
                return serve(selected, to: request, context: context, validated: false,
                             status: CacheStatus(.stale, ttl: selected.ttlSeconds(at: now), detail: CacheControl.Name.staleWhileRevalidate.rawValue))
            case .validate(let why):
                reason = why == .stale ? .stale : .request
            case .fresh, .staleAccepted, nil:
                break
            }
        }
        if directives.onlyIfCached {
            let status = CacheStatus(.onlyIfCached, detail: CacheControl.Name.onlyIfCached.rawValue)
            var error = GatewayError(.notCached, message: "only-if-cached: no stored response can answer this request")
            record(status, in: &error.headerFields, context: context)
            throw error
        }
        if request.method == .head {
            // A HEAD is answered from a stored GET, never stored itself.
            metrics.misses.increment()
            return try await passThrough(request, context: context, next: next, status: CacheStatus(.miss, forward: reason))
        }
        return try await fetch(request, key: key, stored: found.selected, reason: reason, directives: directives,
                               context: context, next: next)
    }

    /// Hits answered on the server's thread: a fresh stored response, or a stale one the
    /// client's `max-stale` accepts. Everything else (misses, validation, background refresh)
    /// returns `nil` untouched, for `handle`.
    public func handleImmediately(_ request: GatewayRequest, context: RequestContext,
                                  next: ImmediateNextHandler) throws -> GatewayResponse? {
        guard request.method == .get || request.method == .head, request.headerFields[.range] == nil else { return nil }
        let now = context.clock.now
        return answerFromStore(lookup(request, at: now), to: request, context: context, at: now)
    }

    /// What the store holds for a GET or HEAD.
    private struct Lookup {
        var key: String
        var directives: RequestDirectives
        var variantCount: Int
        /// The variant that matches the request's `Vary` values and may answer it.
        var selected: CacheEntry?
        /// How `selected` may be used; `nil` when none was selected.
        var usability: CachePolicy.Usability?
    }

    private func lookup(_ request: GatewayRequest, at now: ContinuousClock.Instant) -> Lookup {
        lookup(request, key: Self.key(for: request), directives: RequestDirectives(request.headerFields), at: now)
    }

    /// Again, with what the first lookup worked out (after the fleet tier filled memory).
    private func lookup(_ request: GatewayRequest, key: String, directives: RequestDirectives,
                        at now: ContinuousClock.Instant) -> Lookup {
        let variants = store.variants(for: key)
        let selected = variants.first { $0.mayAnswer(request, directives) }
        return Lookup(key: key, directives: directives, variantCount: variants.count, selected: selected,
                      usability: selected.map { policy.usability(of: $0, for: directives, at: now) })
    }

    /// The answer when the selected entry may be served as it is, counted in the metrics.
    private func answerFromStore(_ found: Lookup, to request: GatewayRequest, context: RequestContext,
                                 at now: ContinuousClock.Instant) -> GatewayResponse? {
        guard let selected = found.selected else { return nil }
        switch found.usability {
        case .fresh:
            metrics.hits.increment()
            return serve(selected, to: request, context: context, validated: false,
                         status: CacheStatus(.hit, ttl: selected.ttlSeconds(at: now)))
        case .staleAccepted:
            metrics.stale(.maxStale)
            return serve(selected, to: request, context: context, validated: false,
                         status: CacheStatus(.stale, ttl: selected.ttlSeconds(at: now), detail: CacheControl.Name.maxStale.rawValue))
        case .staleWhileRevalidate, .validate, nil:
            return nil
        }
    }

    // MARK: Fetching

    /// A miss or a validation, coalesced with concurrent ones for the same key.
    private func fetch(_ request: GatewayRequest, key: String, stored: CacheEntry?, reason: CacheStatus.Forward,
                       directives: RequestDirectives, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
        switch coalescer.join(key, at: context.clock.now) {
        case .follower(let flight):
            metrics.coalesced.increment()
            let outcome: RequestCoalescer.Outcome
            do {
                outcome = try await flight.wait(until: context.deadline, clock: context.clock)
            } catch var error as GatewayError {
                record(CacheStatus(.collapsed, forward: reason, collapsed: true), in: &error.headerFields, context: context)
                throw error
            }
            if case .stored(let entry) = outcome, entry.mayAnswer(request, directives) {
                // Fetched after this request arrived: as fresh as its own fetch would have been.
                let status = CacheStatus(.collapsed, forward: reason, forwardStatus: entry.status.code,
                                         ttl: entry.ttlSeconds(at: context.clock.now), collapsed: true)
                return serve(entry, to: request, context: context, validated: true, status: status)
            }
            return try await forward(request, key: key, stored: stored, reason: reason, directives: directives,
                                     context: context, next: next).response
        case .leader(let flight):
            var lease: String?
            if let tiers, stored == nil {
                switch await tiers.fleet.takeLease(key) {
                case .some(let fence?):
                    // Another replica may have stored it and freed its lease between this
                    // request's read of the store and the lease: read again, holding it.
                    if let entry = await freshFromFleet(tiers, request: request, key: key, directives: directives, context: context) {
                        tiers.fleet.releaseLease(key, fence: fence)
                        coalescer.finish(key, flight, .stored(entry))
                        tiers.fleet.count(.hit)
                        metrics.hits.increment()
                        return serve(entry, to: request, context: context, validated: false,
                                     status: CacheStatus(.hit, ttl: entry.ttlSeconds(at: context.clock.now)))
                    }
                    lease = fence
                case .some(nil):
                    // Another replica is fetching it for the fleet: wait for its response.
                    if let entry = await waitForFleet(tiers, request: request, key: key, directives: directives, context: context) {
                        coalescer.finish(key, flight, .stored(entry))
                        let status = CacheStatus(.collapsed, forward: reason, forwardStatus: entry.status.code,
                                                 ttl: entry.ttlSeconds(at: context.clock.now), collapsed: true, detail: "fleet")
                        return serve(entry, to: request, context: context, validated: true, status: status)
                    }
                case .none:
                    break  // the store did not answer: fetch as without one
                }
            }
            do {
                let result = try await forward(request, key: key, stored: stored, reason: reason, directives: directives,
                                               context: context, next: next)
                if let lease, let tiers {
                    releaseUnlessShared(lease, key: key, result: result, tiers: tiers, now: context.clock.now)
                }
                if let tee = result.tee {
                    // A streamed response: waiters hear when it is stored, or cannot be.
                    tee.publish(to: coalescer, key: key, flight: flight)
                } else if let entry = result.stored {
                    coalescer.finish(key, flight, .stored(entry))
                } else {
                    // An uncacheable answer marks the key, so concurrent requests for it stop
                    // queueing behind each other; a failure does not.
                    coalescer.finish(key, flight, .notShared, uncacheableAt: result.uncacheable ? context.clock.now : nil)
                }
                return result.response
            } catch {
                if let lease, let tiers { tiers.fleet.releaseLease(key, fence: lease) }
                coalescer.finish(key, flight, .notShared)
                throw error
            }
        case .alone:
            let result = try await forward(request, key: key, stored: stored, reason: reason, directives: directives,
                                           context: context, next: next)
            if result.uncacheable { coalescer.passed(key, uncacheableAt: context.clock.now) }
            return result.response
        }
    }

    // MARK: The fleet tier

    /// Reads the fleet tier for `key` and copies into memory what it has that memory lacks (or
    /// holds older); whether anything was copied. A store that does not answer in its `timeout`
    /// is no answer.
    private func consultFleet(_ tiers: TieredCacheStore, key: String, context: RequestContext) async -> Bool {
        let now = context.clock.now
        guard let entries = await tiers.fleet.read(key, now: now, wallNow: context.clock.wallNow), !entries.isEmpty else {
            return false
        }
        let held = tiers.memory.variants(for: key)
        var copied = false
        for entry in entries.reversed() {
            // Freshest last, so it is the first variant memory offers.
            if let mine = held.first(where: { $0.vary == entry.vary }), mine.age(at: now) <= entry.age(at: now) { continue }
            metrics.record(tiers.memory.insert(entry))
            copied = true
        }
        return copied
    }

    /// Waits (polling the store, within `store_wait` and the request's deadline) for the
    /// replica holding `key`'s lease to store its response; the entry when it did and it
    /// answers this request, `nil` when the wait ends without one (the lease freed unshared,
    /// or the time up): the caller then fetches itself.
    private func waitForFleet(_ tiers: TieredCacheStore, request: GatewayRequest, key: String, directives: RequestDirectives,
                              context: RequestContext) async -> CacheEntry? {
        let clock = context.clock
        let deadline = min(context.deadline, clock.now.advanced(by: tiers.fleet.peerWait))
        while clock.now < deadline {
            do {
                try await clock.sleep(until: min(deadline, clock.now.advanced(by: tiers.fleet.pollInterval)))
            } catch {
                return nil
            }
            // The lease first, then the entry: the holder's write stores the entry and frees the
            // lease at once, so a lease seen gone means the read after it sees what was written.
            let held = await tiers.fleet.leaseHeld(key)
            if let entry = await freshFromFleet(tiers, request: request, key: key, directives: directives, context: context) {
                tiers.fleet.count(.collapsed)
                return entry
            }
            guard held else { return nil }
        }
        return nil
    }

    /// What the fleet tier holds for `key` (copied into memory) when it answers `request` fresh.
    private func freshFromFleet(_ tiers: TieredCacheStore, request: GatewayRequest, key: String, directives: RequestDirectives,
                                context: RequestContext) async -> CacheEntry? {
        _ = await consultFleet(tiers, key: key, context: context)
        let now = context.clock.now
        return tiers.memory.variants(for: key).first { entry in
            entry.mayAnswer(request, directives) && policy.usability(of: entry, for: directives, at: now) == .fresh
        }
    }

    /// Frees the fleet lease of a fetch whose response will not reach the store (a write that
    /// will be made frees it itself, so waiters never see the lease gone before the entry).
    private func releaseUnlessShared(_ lease: String, key: String, result: Fetched, tiers: TieredCacheStore,
                                     now: ContinuousClock.Instant) {
        if let tee = result.tee {
            tee.whenDecided { stored in
                if stored.map({ !tiers.fleet.willWrite($0, now: now) }) ?? true { tiers.fleet.releaseLease(key, fence: lease) }
            }
        } else if result.stored.map({ !tiers.fleet.willWrite($0, now: now) }) ?? true {
            tiers.fleet.releaseLease(key, fence: lease)
        }
    }

    /// Asks the upstream (conditionally when `stored` has validators), stores what may be
    /// stored, and falls back to `stored` where `stale-if-error` allows.
    private func forward(_ request: GatewayRequest, key: String, stored: CacheEntry?, reason: CacheStatus.Forward,
                         directives: RequestDirectives, context: RequestContext,
                         next: NextHandler) async throws -> Fetched {
        let clock = context.clock
        let (upstreamRequest, validating) = Self.conditionalRequest(for: request, validating: stored)
        let requestTime = clock.wallNow
        let response: GatewayResponse
        do {
            response = try await next(upstreamRequest, context)
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            return try failed(error, request: request, stored: stored, validating: validating, reason: reason,
                              directives: directives, context: context)
        }
        let exchange = Fetch(request: request, key: key, reason: reason, directives: directives, context: context,
                                requestTime: requestTime, responseTime: clock.wallNow, now: clock.now)

        if response.status == .notModified, validating, let stored {
            if let merged = merge(notModified: response, into: stored, exchange) { return merged }
            // The 304 describes another response than the stored one: ask again, unconditionally.
            return try await forward(request, key: key, stored: nil, reason: reason, directives: directives,
                                     context: context, next: next)
        }
        if let stored, CachePolicy.isServerError(response.status),
           policy.canServeStaleOnError(stored, for: directives, at: exchange.now) {
            if validating { metrics.revalidated(.failed) }
            response.discardBody()
            return Fetched(response: serveStaleOnError(stored, to: request, context: context, reason: reason,
                                                       upstreamStatus: response.status.code))
        }
        if validating {
            metrics.revalidated(CachePolicy.isServerError(response.status) ? .failed : .modified)
        } else {
            metrics.misses.increment()
        }
        return storeAndAnswer(response, replacing: stored, exchange)
    }

    /// What the steps of one fetch from the upstream (a miss or a revalidation) share.
    private struct Fetch {
        var request: GatewayRequest
        var key: String
        var reason: CacheStatus.Forward
        var directives: RequestDirectives
        var context: RequestContext
        var requestTime: Date
        var responseTime: Date
        var now: ContinuousClock.Instant
    }

    /// The request sent upstream: the client's own validators are answered here, against the
    /// full response, so that it can be stored; the stored response's validators go instead.
    private static func conditionalRequest(for request: GatewayRequest,
                                           validating stored: CacheEntry?) -> (GatewayRequest, validating: Bool) {
        var upstreamRequest = request
        upstreamRequest.headerFields[values: .ifNoneMatch] = []
        upstreamRequest.headerFields[values: .ifModifiedSince] = []
        guard let stored, stored.hasValidators else { return (upstreamRequest, false) }
        if let etag = stored.etag { upstreamRequest.headerFields[.ifNoneMatch] = etag }
        if let lastModified = stored.lastModified { upstreamRequest.headerFields[.ifModifiedSince] = lastModified }
        return (upstreamRequest, true)
    }

    /// The upstream failed: the stored response where `stale-if-error` allows, else the error,
    /// with the cache status recorded on it.
    private func failed(_ error: any Error, request: GatewayRequest, stored: CacheEntry?, validating: Bool,
                        reason: CacheStatus.Forward, directives: RequestDirectives,
                        context: RequestContext) throws -> Fetched {
        if validating { metrics.revalidated(.failed) }
        if let stored, policy.canServeStaleOnError(stored, for: directives, at: context.clock.now) {
            return Fetched(response: serveStaleOnError(stored, to: request, context: context, reason: reason, upstreamStatus: nil))
        }
        if !validating { metrics.misses.increment() }
        let status = CacheStatus(.miss, forward: reason)
        guard var gatewayError = error as? GatewayError else {
            context.stats.update { $0.cacheStatus = status.outcome.rawValue }
            throw error
        }
        record(status, in: &gatewayError.headerFields, context: context)
        throw gatewayError
    }

    /// A 304 to a revalidation, merged into the stored response (RFC 9111 §4.3.4); `nil` when it
    /// describes another response than the stored one.
    private func merge(notModified response: GatewayResponse, into stored: CacheEntry, _ exchange: Fetch) -> Fetched? {
        let governing = policy.directives(of: response.headerFields).directives
        let excluded = governing.fieldNames(.private) ?? []
        guard let updated = policy.freshen(stored, with: response, requestTime: exchange.requestTime,
                                           responseTime: exchange.responseTime, now: exchange.now,
                                           excludingFields: excluded) else { return nil }
        metrics.revalidated(.notModified)
        // The upstream forbidding storage drops the entry; a client's no-store only keeps this
        // exchange out of the cache.
        let upstreamNoStore = governing.contains(.noStore)
        let keep = !exchange.directives.noStore && !upstreamNoStore
        if keep {
            metrics.record(store.insert(updated))
        } else if upstreamNoStore {
            metrics.record(store.removeAll(for: exchange.key))
        }
        let status = CacheStatus(.revalidated, forward: exchange.reason, forwardStatus: 304,
                                 ttl: updated.ttlSeconds(at: exchange.now), stored: keep)
        return Fetched(response: serve(updated, to: exchange.request, context: exchange.context, validated: true, status: status),
                       stored: keep ? updated : nil)
    }

    /// A full response: stored when it may be, and answered (a 304 when the client's own
    /// validators match it).
    private func storeAndAnswer(_ response: GatewayResponse, replacing stored: CacheEntry?, _ exchange: Fetch) -> Fetched {
        if response.body.isStreamed { return teeAndAnswer(response, replacing: stored, exchange) }
        var status = CacheStatus(.miss, forward: exchange.reason, forwardStatus: response.status.code)
        var entry = makeEntry(request: exchange.request, response: response, key: exchange.key, directives: exchange.directives,
                              requestTime: exchange.requestTime, responseTime: exchange.responseTime, now: exchange.now)
        if let candidate = entry {
            let change = store.insert(candidate)
            metrics.record(change)
            if candidate.size <= config.maxBytes {
                status.stored = true
                status.ttl = candidate.ttlSeconds(at: exchange.now)
            } else {
                entry = nil
            }
        } else if stored != nil, response.status.code < 500 {
            // The upstream's current answer may not be stored: older variants must not outlive it.
            metrics.record(store.removeAll(for: exchange.key))
        }
        var outgoing = response
        let requestFields = exchange.request.headerFields
        if response.status == .ok, ConditionalRequest.isConditional(requestFields),
           ConditionalRequest.isNotModified(request: requestFields, response: response.headerFields) {
            outgoing = ConditionalRequest.notModified(from: response)
        }
        record(status, in: &outgoing.headerFields, context: exchange.context)
        return Fetched(response: outgoing, stored: entry, uncacheable: entry == nil && response.status.code < 500)
    }

    /// A streamed response: passed on at once, and stored as it flows when it may be (a
    /// `CacheTee` copies it and stores it if it ends complete within `max_object_bytes`). Its
    /// `Cache-Status` cannot say `stored`: that is known only at the end.
    private func teeAndAnswer(_ response: GatewayResponse, replacing stored: CacheEntry?, _ exchange: Fetch) -> Fetched {
        let status = CacheStatus(.miss, forward: exchange.reason, forwardStatus: response.status.code)
        let requestFields = exchange.request.headerFields
        if response.status == .ok, ConditionalRequest.isConditional(requestFields),
           ConditionalRequest.isNotModified(request: requestFields, response: response.headerFields) {
            // The client gets a 304: the body is not needed, and not read to be stored.
            response.discardBody()
            var outgoing = ConditionalRequest.notModified(from: response)
            record(status, in: &outgoing.headerFields, context: exchange.context)
            return Fetched(response: outgoing)
        }
        var outgoing = response
        let declared = response.body.count
        let template: CacheEntry? = if let declared, declared > config.maxObjectBytes { nil } else {
            storableEntry(request: exchange.request, response: response, body: ByteBuffer(), key: exchange.key,
                          directives: exchange.directives, requestTime: exchange.requestTime,
                          responseTime: exchange.responseTime, now: exchange.now)
        }
        guard let template else {
            if stored != nil, response.status.code < 500 {
                // The upstream's current answer may not be stored: older variants must not outlive it.
                metrics.record(store.removeAll(for: exchange.key))
            }
            record(status, in: &outgoing.headerFields, context: exchange.context)
            return Fetched(response: outgoing, uncacheable: response.status.code < 500)
        }
        let tee = CacheTee(template: template, expectedBytes: declared, maxObjectBytes: config.maxObjectBytes,
                           maxBytes: config.maxBytes, store: store, metrics: metrics, clock: exchange.context.clock,
                           replacesStored: stored != nil)
        outgoing.body.append(tee, keepsLength: true)
        record(status, in: &outgoing.headerFields, context: exchange.context)
        return Fetched(response: outgoing, tee: tee)
    }

    /// What one upstream exchange produced.
    struct Fetched {
        var response: GatewayResponse
        /// The entry stored from it, which waiting requests may share.
        var stored: CacheEntry?
        /// The upstream answered with something that may not be stored.
        var uncacheable = false
        /// A streamed response being stored as it flows: the outcome is known at its end.
        var tee: CacheTee?
    }

    /// The entry for a full response, or `nil` when it may not (or need not) be stored.
    private func makeEntry(request: GatewayRequest, response: GatewayResponse, key: String, directives: RequestDirectives,
                           requestTime: Date, responseTime: Date, now: ContinuousClock.Instant) -> CacheEntry? {
        guard let body = response.body.buffer, body.readableBytes <= config.maxObjectBytes else { return nil }
        return storableEntry(request: request, response: response, body: body, key: key, directives: directives,
                             requestTime: requestTime, responseTime: responseTime, now: now)
    }

    /// The entry for `response` with `body`, or `nil` when it may not be stored. An empty
    /// `body` for a streamed response (its `Content-Length` is set when it is complete).
    private func storableEntry(request: GatewayRequest, response: GatewayResponse, body: ByteBuffer, key: String,
                               directives: RequestDirectives, requestTime: Date, responseTime: Date,
                               now: ContinuousClock.Instant) -> CacheEntry? {
        let freshness = policy.freshness(status: response.status.code, headerFields: response.headerFields,
                                         requestTime: requestTime, responseTime: responseTime)
        guard case .store(let excluded) = policy.storability(request: directives, response: response, freshness: freshness),
              let vary = VaryKey(response: response.headerFields, request: request.headerFields) else {
            return nil
        }
        var fields = response.headerFields
        for name in excluded {
            if let fieldName = HTTPField.Name(name) { fields[values: fieldName] = [] }
        }
        // Age is recomputed on every reuse; the upstream's value is already in `initialAge`.
        fields[values: .age] = []
        if !response.body.isStreamed { fields[.contentLength] = String(body.readableBytes) }
        if fields[.date] == nil { fields[.date] = HTTPDate.format(responseTime) }
        // A copy sized to the body, so the bytes charged are the bytes held.
        return CacheEntry(key: key, vary: vary, status: response.status, headerFields: fields,
                          body: ByteBuffer(bytes: body.readableBytesView), freshness: freshness,
                          receivedAt: now, storedWithAuthorization: directives.hasAuthorization)
    }

    /// One background refresh per key, under its own deadline, sharing the coalescing table
    /// with foreground misses so the upstream still sees one request per key.
    private func refreshInBackground(_ request: GatewayRequest, key: String, stored: CacheEntry,
                                     context: RequestContext, next: @escaping NextHandler) {
        let clock = context.clock
        let timeout = config.revalidationTimeout
        // A HEAD may trigger the refresh, but only a GET's response can replace the entry.
        var refreshRequest = request
        refreshRequest.head.method = .get
        refresher.start(key) { [self, refreshRequest] in
            guard case .leader(let flight) = coalescer.join(key, at: clock.now) else { return }  // a fetch is already under way
            let refreshContext = RequestContext(requestID: context.requestID, route: context.route, upstream: context.upstream,
                                                deadline: clock.now.advanced(by: timeout), logger: context.logger, clock: clock)
            var directives = RequestDirectives(refreshRequest.headerFields)
            directives.noCache = false
            do {
                let result = try await forward(refreshRequest, key: key, stored: stored, reason: .stale, directives: directives,
                                               context: refreshContext, next: next)
                if let tee = result.tee {
                    tee.publish(to: coalescer, key: key, flight: flight)
                    // Nobody else reads this response: read it here, so the tee can store it.
                    try await Self.drain(result.response.body, for: tee)
                } else {
                    result.response.discardBody()
                    coalescer.finish(key, flight, result.stored.map(RequestCoalescer.Outcome.stored) ?? .notShared)
                }
            } catch {
                coalescer.finish(key, flight, .notShared)
                context.logger.debug("cache background refresh failed", metadata: ["error": .string(String(describing: error))])
            }
        }
    }

    /// Reads a streamed body to its end for `tee` alone, stopping as soon as it cannot be stored.
    static func drain(_ body: Body, for tee: CacheTee) async throws {
        let reader = body.reader()
        while try await reader.next() != nil {
            if tee.gaveUp {
                reader.close(GatewayError(.upstreamResponseTooLarge, message: "larger than the cache's max_object_bytes"))
                return
            }
        }
    }

    // MARK: Answering

    /// The stored response as an answer to `request`: current `Age`, no body for HEAD, and a
    /// 304 when the client's own validators match. Fields named by `no-cache="…"` are only
    /// sent right after a successful validation.
    private func serve(_ entry: CacheEntry, to request: GatewayRequest, context: RequestContext, validated: Bool,
                       status: CacheStatus) -> GatewayResponse {
        // The stored fields shared, then copied once (with room for what is added) by the
        // first change: a hit is mostly this copy, not a field-by-field rebuild.
        var fields = entry.headerFields
        let withheld = validated ? [] : entry.freshness.noCacheFields.compactMap { HTTPField.Name($0) }
        if !withheld.isEmpty || fields.contains(where: { $0.name == .age }) {
            fields.removeAll { $0.name == .age || withheld.contains($0.name) }
        }
        fields.reserveCapacity(fields.count + 3)
        let age = entry.age(at: context.clock.now).components.seconds
        fields.append(HTTPField(name: .age, value: String(max(0, age))))
        let notModified = entry.status == .ok && ConditionalRequest.isConditional(request.headerFields)
            && ConditionalRequest.isNotModified(request: request.headerFields, response: fields)
        record(status, in: &fields, context: context)
        let response = GatewayResponse(status: entry.status, headerFields: fields,
                                       body: request.method == .head ? .empty : Body(entry.body))
        return notModified ? ConditionalRequest.notModified(from: response) : response
    }

    private func serveStaleOnError(_ entry: CacheEntry, to request: GatewayRequest, context: RequestContext,
                                   reason: CacheStatus.Forward, upstreamStatus: Int?) -> GatewayResponse {
        metrics.stale(.staleIfError)
        let status = CacheStatus(.stale, forward: reason, forwardStatus: upstreamStatus,
                                 ttl: entry.ttlSeconds(at: context.clock.now), detail: CacheControl.Name.staleIfError.rawValue)
        return serve(entry, to: request, context: context, validated: false, status: status)
    }

    /// Forwards without looking at the cache (methods it does not answer, `Range`, HEAD misses).
    private func passThrough(_ request: GatewayRequest, context: RequestContext, next: NextHandler,
                             status: CacheStatus) async throws -> GatewayResponse {
        do {
            var response = try await next(request, context)
            var status = status
            status.forwardStatus = response.status.code
            record(status, in: &response.headerFields, context: context)
            return response
        } catch var error as GatewayError {
            record(status, in: &error.headerFields, context: context)
            throw error
        }
    }

    /// §4.4: a successful unsafe request invalidates its target and the same-origin URIs in
    /// `Location` and `Content-Location`.
    private func forwardUnsafe(_ request: GatewayRequest, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
        let response = try await passThrough(request, context: context, next: next,
                                             status: CacheStatus(.bypass, forward: .method))
        guard (200..<400).contains(response.status.code) else { return response }
        var keys = [Self.key(for: request)]
        for name in [HTTPField.Name.location, .contentLocation] {
            guard let value = response.headerFields[name],
                  let target = Self.sameOriginTarget(value, authority: request.head.authority, base: request.target) else { continue }
            keys.append(Self.key(authority: request.head.authority, target: target))
        }
        guard let tiers else {
            for key in keys { metrics.record(store.removeAll(for: key)) }
            return response
        }
        // With the fleet tier the invalidation reaches Redis before the answer goes out: the
        // client's next GET, here or on another replica, must not read back what it changed
        // (cache-tests' invalidate-PUT found a fire-and-forget delete losing that race).
        for key in keys {
            metrics.record(tiers.memory.removeAll(for: key))
            _ = try? await tiers.fleet.purge(.key(key), timeout: tiers.fleet.backend.config.timeout)
        }
        return response
    }

    /// The origin-form target `reference` points to, when it is on the request's own authority.
    public static func sameOriginTarget(_ reference: String, authority: String?, base: String) -> String? {
        guard let authority, let baseURL = URL(string: "http://\(authority)\(base)"),
              let resolved = URL(string: reference.trimmingWhitespace(), relativeTo: baseURL)?.absoluteURL,
              let components = URLComponents(url: resolved, resolvingAgainstBaseURL: true),
              let baseComponents = URLComponents(url: baseURL, resolvingAgainstBaseURL: false),
              components.host?.lowercased() == baseComponents.host?.lowercased(),
              components.port == baseComponents.port else { return nil }
        var target = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
        if let query = components.percentEncodedQuery { target += "?" + query }
        return target
    }

    /// Adds the status headers and tells the access log.
    private func record(_ status: CacheStatus, in fields: inout HTTPFields, context: RequestContext) {
        status.apply(to: &fields, xCache: config.xCache)
        context.stats.update { $0.cacheStatus = status.outcome.rawValue }
    }
}

extension CacheEntry {
    /// Whether this stored response may answer `request` at all, fresh or not: its `Vary` values
    /// match the request's, and a credentialed request gets it only when it was marked shareable.
    func mayAnswer(_ request: GatewayRequest, _ directives: RequestDirectives) -> Bool {
        vary.matches(request.headerFields) && (!directives.hasAuthorization || freshness.sharedWithAuthorization)
    }
}
