// The floor under Portico's `urlsession` transport: a bare URLSession client, no gateway, sending
// GETs to one URL from N concurrent loops for a while, and reporting its own CPU time per
// request. `bench/urlsession-floor/run` compiles it (swiftc -O) and runs it beside Portico.
//
//   urlsession-floor URL CONCURRENCY SECONDS
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

let arguments = CommandLine.arguments
guard arguments.count == 4, let url = URL(string: arguments[1]), let concurrency = Int(arguments[2]),
      let seconds = Double(arguments[3]) else {
    print("usage: urlsession-floor URL CONCURRENCY SECONDS")
    exit(2)
}

// The same session settings Portico uses for an upstream (URLSessionConfiguration+Portico).
let configuration = URLSessionConfiguration.ephemeral
configuration.httpMaximumConnectionsPerHost = concurrency
configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
configuration.urlCache = nil
configuration.httpCookieStorage = nil
let session = URLSession(configuration: configuration)

func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
        + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

func run(for duration: Double) async -> (requests: Int, failures: Int) {
    let end = Date().addingTimeInterval(duration)
    return await withTaskGroup(of: (Int, Int).self) { group in
        for _ in 0..<concurrency {
            group.addTask {
                var done = 0, failed = 0
                while Date() < end {
                    do {
                        let (_, response) = try await session.data(from: url)
                        if (response as? HTTPURLResponse)?.statusCode == 200 { done += 1 } else { failed += 1 }
                    } catch {
                        failed += 1
                    }
                }
                return (done, failed)
            }
        }
        var total = (0, 0)
        for await (done, failed) in group { total = (total.0 + done, total.1 + failed) }
        return total
    }
}

_ = await run(for: 1)  // warm-up: connections open, code paged in
let cpuBefore = cpuSeconds()
let wallBefore = Date()
let (requests, failures) = await run(for: seconds)
let cpu = cpuSeconds() - cpuBefore
let wall = Date().timeIntervalSince(wallBefore)
print(String(format: "requests %d failures %d req/s %.0f cpu_us_per_request %.1f", requests, failures,
             Double(requests) / wall, cpu * 1e6 / Double(max(1, requests))))
