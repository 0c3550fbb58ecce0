// The suite's origin server (test-engine/server/server.mjs), bound to 127.0.0.1 instead of
// every interface: server.mjs calls listen(port) without a host, so listen is wrapped here.
// Usage: node origin.mjs SUITE_DIR (port from npm_config_port, as `npm run server` passes it).
import http from 'http'
import path from 'path'
import { pathToFileURL } from 'url'

const listen = http.Server.prototype.listen
http.Server.prototype.listen = function (port, ...rest) {
  if (typeof port === 'number' || typeof port === 'string') return listen.call(this, Number(port), '127.0.0.1', ...rest)
  return listen.call(this, port, ...rest)
}
await import(pathToFileURL(path.join(process.argv[2], 'test-engine/server/server.mjs')).href)
