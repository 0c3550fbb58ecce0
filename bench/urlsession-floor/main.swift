// The floor under Portico's `urlsession` transport: a bare URLSession client, no gateway, sending
// GETs to one URL from N concurrent loops for a while, and reporting its own CPU time per
// request. `bench/urlsession-floor/run` compiles it (swiftc -O) and runs it beside Portico.
//
//   urlsession-floor URL CONCURRENCY SECONDS [data|delegate]
//
// `data` (the default) awaits `URLSession.data(from:)`: the whole body, handed over once.
// `delegate` receives the response through a `URLSessionDataDelegate`, the head and each piece of
// the body as they arrive, on a serial queue, and resumes a waiting continuation at the end: the
// least a client that streams bodies (as a gateway must, to keep memory bounded) asks of
// URLSession, and what Portico's bridge does.
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Synchronization

let arguments = CommandLine.arguments
guard arguments.count == 4 || arguments.count == 5, let url = URL(string: arguments[1]),
      let concurrency = Int(arguments[2]), let seconds = Double(arguments[3]),
      arguments.count == 4 || ["data", "delegate"].contains(arguments[4]) else {
    print("usage: urlsession-floor URL CONCURRENCY SECONDS [data|delegate]")
    exit(2)
}
let streams = arguments.count == 5 && arguments[4] == "delegate"

/// Each task's continuation, resumed with the status when the task completes.
final class StreamingDelegate: NSObject, URLSessionDataDelegate, Sendable {
    struct Call {
        var continuation: CheckedContinuation<Int, any Error>
        var status = 0
        var bytes = 0
    }
    let calls = Mutex<[Int: Call]>([:])

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                    completionHandler: @escaping (URLSession.ResponseDisposition) -> Void) {
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        calls.withLock { $0[dataTask.taskIdentifier]?.status = status }
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        calls.withLock { $0[dataTask.taskIdentifier]?.bytes += data.count }
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard let call = calls.withLock({ $0.removeValue(forKey: task.taskIdentifier) }) else { return }
        if let error { call.continuation.resume(throwing: error) } else { call.continuation.resume(returning: call.status) }
    }
}

// The same session settings Portico uses for an upstream (URLSessionConfiguration+Portico).
let configuration = URLSessionConfiguration.ephemeral
configuration.httpMaximumConnectionsPerHost = concurrency
configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
configuration.urlCache = nil
configuration.httpCookieStorage = nil
let delegate = StreamingDelegate()
let callbackQueue = DispatchQueue(label: "urlsession-floor.delegate")
let session: URLSession
if streams {
    // The delegate queue Portico's bridge uses: one operation at a time, on a serial dispatch queue.
    let delegateQueue = OperationQueue()
    delegateQueue.maxConcurrentOperationCount = 1
    delegateQueue.underlyingQueue = callbackQueue
    session = URLSession(configuration: configuration, delegate: delegate, delegateQueue: delegateQueue)
} else {
    session = URLSession(configuration: configuration)
}

/// One GET; its status.
func get() async throws -> Int {
    guard streams else {
        let (_, response) = try await session.data(from: url)
        return (response as? HTTPURLResponse)?.statusCode ?? 0
    }
    let task = session.dataTask(with: url)
    return try await withCheckedThrowingContinuation { continuation in
        delegate.calls.withLock { $0[task.taskIdentifier] = StreamingDelegate.Call(continuation: continuation) }
        task.resume()
    }
}

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
                        if try await get() == 200 { done += 1 } else { failed += 1 }
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
