// fleet2's balancer: an HTTP/1.1 proxy that sends each request (not each connection: the
// suite's fetch keeps connections alive) of a test to the next replica in turn: the suite runs
// 25 tests at once, so one counter for all would scatter a test's requests at random; a
// counter per test (the UUID in /test/UUID...) makes request 1, 3, 5 of every test go to
// replica 0 and 2, 4 to replica 1, the same on every run. The suite's own /config/ and
// /state/ calls take turns on a counter of their own. Headers go through as received (raw order, repeats
// and case kept), less hop-by-hop fields; bodies are streamed. Each answer gets
// X-Balancer-Replica: N so a failing test's dump shows which replica answered.
// Usage: node balancer.mjs LISTEN_PORT REPLICA_PORT...
import http from 'http'

const [listenPort, ...replicas] = process.argv.slice(2).map(Number)
const agent = new http.Agent({ keepAlive: true, maxSockets: 64 })
const hopByHop = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer'])
const perTest = new Map() // uuid -> requests seen; a test's entries are dropped by its /state/ call
let next = 0

function pick (url) {
  const [, dispatch, uuid] = url.split(/[/?]/)
  if (dispatch === 'state' && uuid) perTest.delete(uuid)
  if (dispatch !== 'test' || !uuid) return next++ % replicas.length
  const n = perTest.get(uuid) || 0
  perTest.set(uuid, n + 1)
  if (perTest.size > 10000) perTest.delete(perTest.keys().next().value)
  return n % replicas.length
}

function strip (raw) {
  const out = []
  for (let i = 0; i < raw.length; i += 2) {
    if (!hopByHop.has(raw[i].toLowerCase())) out.push(raw[i], raw[i + 1])
  }
  return out
}

http.createServer((req, res) => {
  const n = pick(req.url)
  const up = http.request({
    host: '127.0.0.1', port: replicas[n], method: req.method, path: req.url, headers: strip(req.rawHeaders), agent
  }, upRes => {
    const headers = strip(upRes.rawHeaders)
    headers.push('X-Balancer-Replica', String(n))
    res.writeHead(upRes.statusCode, upRes.statusMessage, headers)
    upRes.pipe(res)
  })
  up.on('error', err => {
    if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' })
    res.end(`balancer: replica ${n}: ${err.message}\n`)
  })
  req.pipe(up)
}).listen(listenPort, '127.0.0.1', () => console.log(`balancer on ${listenPort} -> ${replicas.join(',')}`))
