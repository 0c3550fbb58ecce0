// Summarises a cache-tests results JSON (what test-engine/cli.mjs prints) with the suite's own
// verdict logic (test-engine/lib/results.mjs, dependencies honoured as on cache-tests.fyi).
// Usage: node count.mjs SUITE_DIR RESULTS.json [BASELINE.json]
//   prints counts per verdict, then every test that is not a pass/yes, grouped by suite section;
//   with BASELINE, also the tests that fail here but pass (or are yes) there.
import fs from 'fs'
import path from 'path'
import { pathToFileURL } from 'url'

const [suiteDir, resultsFile, baselineFile] = process.argv.slice(2)
const load = rel => import(pathToFileURL(path.join(suiteDir, rel)).href)
const { default: suites } = await load('tests/index.mjs')
const { determineTestResult, resultTypes } = await load('test-engine/lib/results.mjs')

const names = new Map(Object.entries(resultTypes).map(([name, type]) => [type, name]))
const verdicts = results => {
  const out = new Map()
  for (const suite of suites) {
    for (const test of suite.tests) {
      if (test.browser_only === true) continue
      let verdict = names.get(determineTestResult(suites, test.id, results))
      const detail = results[test.id]
      // The interim-* tests import the undici package (not part of node); without it the client
      // throws before any request, which the suite scores as the test's failure.
      if (Array.isArray(detail) && /Cannot find package 'undici'/.test(String(detail[1]))) verdict = 'not_run'
      out.set(test.id, { suite, test, verdict, detail })
    }
  }
  return out
}

const results = JSON.parse(fs.readFileSync(resultsFile, 'utf8'))
const here = verdicts(results)
const counts = {}
for (const { verdict } of here.values()) counts[verdict] = (counts[verdict] || 0) + 1
const order = ['pass', 'fail', 'optional_fail', 'yes', 'no', 'setup_fail', 'harness_fail', 'dependency_fail', 'retry', 'not_run', 'untested']
console.log(order.filter(k => counts[k]).map(k => `${k} ${counts[k]}`).join(', ') + ` (of ${here.size})`)

const good = new Set(['pass', 'yes'])
const describe = detail => (Array.isArray(detail) ? detail.join(': ') : String(detail)).replace(/\s+/g, ' ').slice(0, 160)
function listing (title, pick) {
  let section = null
  let any = false
  for (const { suite, test, verdict, detail } of here.values()) {
    if (!pick(test, verdict)) continue
    if (!any) { console.log(`\n${title}`); any = true }
    if (section !== suite.id) { console.log(`  [${suite.id}] ${suite.name}`); section = suite.id }
    console.log(`    ${verdict.padEnd(15)} ${test.id} — ${describe(detail)}`)
  }
}
listing('not passing (check-kind "no" answers are informational):', (test, verdict) => !good.has(verdict))
if (baselineFile) {
  const there = verdicts(JSON.parse(fs.readFileSync(baselineFile, 'utf8')))
  listing(`not passing here but passing in ${path.basename(baselineFile)}:`,
    (test, verdict) => !good.has(verdict) && good.has(there.get(test.id)?.verdict))
}
