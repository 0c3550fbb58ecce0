-- wrk: asks /api/item/0 .. /api/item/(N-1) once each, in order, over all of wrk's connections
-- (run with -t1: one Lua state, one counter), then stops. N from the environment: URLS.
-- Host as fleet-load.py sends it: the cache key includes the authority.
local n = tonumber(os.getenv("URLS") or "5000")
local sent, answered = 0, 0
request = function()
  local i = sent
  if sent < n then sent = sent + 1 else i = n - 1 end   -- past N (a connection or two): a repeat
  return wrk.format("GET", "/api/item/" .. i, { Host = "bench.fleet" })   -- the key fleet-load.py stored
end
response = function(status)
  answered = answered + 1
  if answered >= n then wrk.thread:stop() end
end
