import RedisClient

/// Provider budgets shared by every replica (`provider_limits.store`): one hash per upstream and
/// scope, changed by one script on the server with the server's clock, so what one replica
/// learns holds all of them — the remaining count is spent fleet-wide, and a `Retry-After` seen
/// by one pauses every one. The script is `ProviderLimiter`'s budget logic (roll, decide, claim,
/// release, learn) in Lua; times are microseconds of the server's clock, sent and returned as
/// durations from now so replicas' clocks never meet.
final class RedisProviderBudgets: Sendable {
    let backend: RedisBucketStore
    let upstream: String
    /// How far ahead of the server's clock the script's runs: a test's manual time, never set in
    /// production (the last argument of every call).
    private let ahead: @Sendable () -> Duration

    init(backend: RedisBucketStore, upstream: String, ahead: @escaping @Sendable () -> Duration = { .zero }) {
        self.backend = backend
        self.upstream = upstream
        self.ahead = ahead
    }

    /// `KEYS[1]` the scope's hash; `ARGV[1]` the operation; the rest as each op says, the last
    /// microseconds to add to the server's clock (`ahead`). Returns `{kind, micros, window}`:
    /// 0 go in window number `window`, 1 wait that long then ask again, 2 a slot in window
    /// number `window`, expected to begin that far ahead. Fields: `wnum` the window's number,
    /// `slotN` the reservations booked in window N (windows to come), `due` those of the current
    /// window not yet claimed, `sent` those gone in it (the first at `fsent`, the last at `lsent`);
    /// `srvN` the successes of requests that went in window N, `refw` the last window a silent
    /// provider refused in, `guessed`, `filled`, `clean`, `ceil`, `anchor`, `probing` and `pafter`
    /// (full windows before the next probe, 4 when absent) for a provider silent about its budget
    /// (as `ProviderLimiter.Budget`).
    static let script = RedisScript("""
        local op = ARGV[1]
        local clock = redis.call('TIME')
        local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2]) + tonumber(ARGV[#ARGV])
        local flat = redis.call('HGETALL', KEYS[1])
        local b = {}
        for i = 1, #flat, 2 do b[flat[i]] = tonumber(flat[i + 1]) end
        local function nextWindow()
          if not b.limit then return end
          local refused = b.refw == (b.wnum or 0)
          if b.guessed and refused then
            if b.clean and b.clean > b.limit then b.ceil = b.clean else b.ceil = nil end
            if b.probing then b.pafter = math.min((b.pafter or 4) * 2, 32); b.probing = nil end
          end
          if b.guessed and (b.sent or 0) >= b.limit and not refused then
            if b.probing then b.pafter = nil; b.probing = nil end
            b.clean = b.sent
            b.filled = (b.filled or 0) + 1
            if b.ceil and b.ceil > b.limit then
              b.limit = b.ceil; b.ceil = nil; b.filled = nil
            elseif b.filled >= (b.pafter or 4) then
              b.limit = b.limit + 1; b.filled = nil; b.probing = 1
            end
          elseif refused then
            b.filled = nil
          end
          b.sent = nil; b.fsent = nil; b.lsent = nil
          b.wnum = (b.wnum or 0) + 1
          b['srv' .. (b.wnum - 2)] = nil
          b.due = b['slot' .. b.wnum] or 0
          b['slot' .. b.wnum] = nil
          b.remaining = math.max(0, b.limit - b.due)
        end
        local function roll()
          if b.hold and now >= b.hold then b.hold = nil end
          while b.reset and now >= b.reset do
            -- A replica that died mid-request never says so: in-flight counts start again
            -- with each window (what went before it was counted in the window it went in).
            b.inflight = 0
            if not b.limit then
              for k, _ in pairs(b) do if string.sub(k, 1, 4) == 'slot' then b[k] = nil end end
              b.remaining = nil; b.due = nil; b.reset = nil
              break
            end
            nextWindow()
            if b.anchor and b.anchor > b.reset then
              b.reset = b.anchor
            elseif b.window and b.window > 0 then
              b.reset = b.reset + b.window
            else
              b.reset = nil
            end
            b.anchor = nil
          end
        end
        local function start(number)
          if not b.reset then return nil end
          if number <= (b.wnum or 0) + 1 or not b.window then return b.reset end
          if b.anchor and b.anchor > b.reset then return b.anchor + b.window * (number - (b.wnum or 0) - 2) end
          return b.reset + b.window * (number - (b.wnum or 0) - 1)
        end
        local function went()
          b.inflight = (b.inflight or 0) + 1
          b.sent = (b.sent or 0) + 1
          if not b.fsent then b.fsent = now end
          b.lsent = now
          return {0, 0, b.wnum or 0}
        end
        local function arg(i)
          local v = tonumber(ARGV[i])
          if v == nil or v < 0 then return nil end
          return v
        end
        roll()
        local result = {0, 0, 0}
        if op == 'decide' then
          if b.hold then
            result = {1, b.hold - now, 0}
          elseif b.remaining then
            if b.remaining > 0 then
              b.remaining = b.remaining - 1
              result = went()
            elseif b.limit and b.limit > 0 and b.reset and b.window and b.window > 0 then
              local number = (b.wnum or 0) + 1
              while (b['slot' .. number] or 0) >= b.limit do number = number + 1 end
              b['slot' .. number] = (b['slot' .. number] or 0) + 1
              result = {2, start(number) - now, number}
            else
              result = {1, (b.reset or (now + tonumber(ARGV[2]))) - now, 0}
            end
          else
            result = went()
          end
        elseif op == 'claim' then
          local number = tonumber(ARGV[2])
          if number > (b.wnum or 0) and start(number) then
            result = {2, math.max(0, start(number) - now), number}
          else
            local due = number == (b.wnum or 0) and (b.due or 0) > 0
            if due then b.due = b.due - 1 end
            if b.hold then
              if due and b.remaining and b.refw ~= (b.wnum or 0) then b.remaining = b.remaining + 1 end
              result = {1, b.hold - now, 0}
            else
              local full = false
              if b.guessed and b.limit then
                if b.refw == (b.wnum or 0) then
                  full = true
                elseif due then
                  full = (b.sent or 0) >= b.limit
                elseif b.remaining then
                  if b.remaining > 0 then b.remaining = b.remaining - 1 else full = true end
                end
              end
              local nextAt = start((b.wnum or 0) + 1)
              if full and nextAt then
                local slot = 'slot' .. ((b.wnum or 0) + 1)
                b[slot] = (b[slot] or 0) + 1
                result = {2, math.max(0, nextAt - now), (b.wnum or 0) + 1}
              else
                result = went()
              end
            end
          end
        elseif op == 'release' then
          local number = tonumber(ARGV[2])
          local slot = 'slot' .. number
          if number == (b.wnum or 0) and (b.due or 0) > 0 then
            b.due = b.due - 1
            if b.remaining then b.remaining = b.remaining + 1 end
          elseif b[slot] then
            if b[slot] > 1 then b[slot] = b[slot] - 1 else b[slot] = nil end
          end
        elseif op == 'abandon' then
          b.inflight = math.max(0, (b.inflight or 0) - 1)
        elseif op == 'observe' then
          local status = tonumber(ARGV[2])
          local remaining, reset, limit, window, retry, hold = arg(3), arg(4), arg(5), arg(6), arg(7), tonumber(ARGV[8])
          local sentIn = arg(9) or (b.wnum or 0)
          b.inflight = math.max(0, (b.inflight or 0) - 1)
          if limit then b.limit = limit; b.guessed = nil end
          local silent = remaining == nil and (not b.limit or b.guessed)
          if status >= 200 and status < 300 and sentIn >= (b.wnum or 0) - 1 then
            local served = 'srv' .. sentIn
            b[served] = (b[served] or 0) + 1
            if silent and sentIn == b.refw then b.limit = b[served]; b.guessed = 1 end
          end
          if window then
            b.window = window; b.said = 1
          elseif not b.said and reset and reset > (b.window or 0) then
            b.window = reset
          end
          if remaining then
            local left = math.max(0, remaining - (b.inflight or 0) - (b.due or 0))
            local at = nil
            if reset then at = now + reset end
            if b.reset and at and at <= b.reset + 1000000 and b.remaining then
              b.remaining = math.min(b.remaining, left)
              b.reset = math.max(b.reset, at)
            else
              if b.reset and at and at > b.reset then nextWindow() end
              b.remaining = math.max(0, remaining - (b.inflight or 0) - (b.due or 0))
              if at then b.reset = at end
            end
          end
          local pause = retry
          if pause == nil and status == 429 then pause = reset or hold end
          if pause and pause > 0 then
            local untilAt = now + pause
            b.hold = math.max(b.hold or untilAt, untilAt)
            if status == 429 then
              if silent then
                if not b.said then b.window = math.max(b.window or 0, pause) end
                if sentIn >= (b.refw or sentIn) then
                  b.refw = sentIn
                  local served = b['srv' .. sentIn] or 0
                  if served > 0 then b.limit = served; b.guessed = 1 end
                end
              end
              b.remaining = 0
              local nextAt = untilAt
              if silent and b.guessed and sentIn == (b.wnum or 0) and (b.wnum or 0) > 0 and b.window then
                if b.clean and (b.sent or 0) <= b.clean then
                  if b.fsent and b.lsent then nextAt = untilAt + math.min(b.lsent - b.fsent, b.window / 2) end
                  b.anchor = nil
                elseif not b.anchor and b.reset and b.reset + b.window > untilAt then
                  b.anchor = b.reset + b.window
                end
              end
              b.reset = math.max(b.reset or nextAt, nextAt)
            end
          end
        end
        redis.call('DEL', KEYS[1])
        local fields = {}
        local last = now
        for k, v in pairs(b) do
          table.insert(fields, k); table.insert(fields, string.format('%.0f', v))
          if (k == 'reset' or k == 'hold') and v > last then last = v end
        end
        if #fields > 0 then
          redis.call('HSET', KEYS[1], unpack(fields))
          redis.call('PEXPIRE', KEYS[1], math.max(60000, math.ceil((last - now + (b.window or 0)) / 1000) + 60000))
        end
        return result
        """)

    /// The version of the hash's fields, in its key. A script whose fields change meaning bumps
    /// it, so during a rolling upgrade the old and the new replicas keep budgets apart (each still
    /// learning from the provider's answers) instead of reading each other's fields wrongly.
    /// `ProviderBudgetLayoutTests` pins the script to this version.
    static let layout = 2

    private func key(_ scope: String) -> [UInt8] {
        Array(Self.hashName(prefix: backend.config.keyPrefix, upstream: upstream, scope: scope).utf8)
    }

    /// `PREFIXprovider:vLAYOUT:UPSTREAM:SCOPE`.
    static func hashName(prefix: String, upstream: String, scope: String) -> String {
        prefix + "provider:v\(layout):" + upstream + ":" + scope
    }

    private static func micros(_ duration: Duration?) -> String {
        guard let duration else { return "-1" }
        return String(max(0, GatewayMetrics.nanoseconds(duration) / 1_000))
    }

    func decide(_ scope: String, defaultHold: Duration, at now: ContinuousClock.Instant) async throws(RedisError) -> ProviderLimiter.Admission {
        try await admission(run(scope, ["decide", Self.micros(defaultHold)]), at: now)
    }

    func claim(_ scope: String, window: Int, at now: ContinuousClock.Instant) async throws(RedisError) -> ProviderLimiter.Admission {
        try await admission(run(scope, ["claim", String(window)]), at: now)
    }

    func release(_ scope: String, window: Int) async throws(RedisError) {
        _ = try await run(scope, ["release", String(window)])
    }

    func abandon(_ scope: String) async throws(RedisError) {
        _ = try await run(scope, ["abandon"])
    }

    /// `window`: the one the request went in (from this store's `decide` or `claim`); nil, the current.
    func observe(_ scope: String, window: Int?, status: Int, _ seen: ProviderLimitObservation,
                 defaultHold: Duration) async throws(RedisError) {
        _ = try await run(scope, [
            "observe", String(status), seen.remaining.map(String.init) ?? "-1", Self.micros(seen.reset),
            seen.limit.map(String.init) ?? "-1", Self.micros(seen.window), Self.micros(seen.retryAfter), Self.micros(defaultHold),
            window.map(String.init) ?? "-1",
        ])
    }

    private func run(_ scope: String, _ arguments: [String]) async throws(RedisError) -> [Int64] {
        let reply = try await backend.evaluate(Self.script, key: key(scope), arguments: arguments + [Self.micros(ahead())])
        guard let values = reply.array, values.count == 3, let kind = values[0].int, let micros = values[1].int,
              let window = values[2].int else {
            throw RedisError(.protocolViolation, "unexpected reply from the provider limit script")
        }
        return [kind, micros, window]
    }

    private func admission(_ reply: [Int64], at now: ContinuousClock.Instant) -> ProviderLimiter.Admission {
        let at = now.advanced(by: .microseconds(max(0, reply[1])))
        switch reply[0] {
        case 1: return .waitUntil(at)
        case 2: return .reserved(at: at, window: Int(reply[2]))
        default: return .go(window: Int(reply[2]))
        }
    }
}
