import Dispatch
import MicroHTTPD
import PorticoTesting
import Synchronization
import Testing

/// A task executor that runs jobs on its own serial queue, which a handler can recognise.
final class QueueExecutor: TaskExecutor {
    let name: String
    let queue: DispatchQueue
    let jobs = Atomic<Int>(0)
    static let key = DispatchSpecificKey<String>()

    init(_ name: String) {
        self.name = name
        queue = DispatchQueue(label: "test.executor.\(name)")
        queue.setSpecific(key: Self.key, value: name)
    }

    func enqueue(_ job: consuming ExecutorJob) {
        jobs.add(1, ordering: .relaxed)
        let job = UnownedJob(job)
        queue.async { [self] in job.runSynchronously(on: asUnownedTaskExecutor()) }
    }
}

@Suite("MicroHTTPD server: task executors")
struct TaskExecutorTests {
    /// Answers with the name of the executor queue the handler's task runs on ("none" off them).
    static let whereAmI: HTTPServer.Handler = { _ in
        ServerResponse(status: 200, body: Array((DispatchQueue.getSpecific(key: QueueExecutor.key) ?? "none").utf8))
    }

    @Test("each daemon thread is paired with one executor: connections are dealt to threads in turn, and a thread's requests run on its executor")
    func dealtInTurn() async throws {
        let executors = [QueueExecutor("a"), QueueExecutor("b")]
        try await withServer({ $0.taskExecutors = executors }, handler: Self.whereAmI) { server in
            var seen: [String] = []
            for _ in 0..<4 {
                let connection = try RawHTTPConnection(port: Int(server.port))
                // Two requests on one connection: both on that connection's executor.
                try await connection.send("GET /1 HTTP/1.1\r\nHost: x\r\n\r\n")
                let first = try #require(try await connection.readResponse()).bodyText
                try await connection.send("GET /2 HTTP/1.1\r\nHost: x\r\n\r\n")
                let second = try #require(try await connection.readResponse()).bodyText
                #expect(first == second)
                seen.append(first)
            }
            #expect(seen == ["a", "b", "a", "b"])
            #expect(executors.allSatisfy { $0.jobs.load(ordering: .relaxed) >= 4 })
        }
    }

    @Test("with threads: 3, three daemon threads each run their requests on their own executor of three")
    func pairedByThread() async throws {
        let executors = [QueueExecutor("a"), QueueExecutor("b"), QueueExecutor("c")]
        let handler: HTTPServer.Handler = { request in
            let queue = DispatchQueue.getSpecific(key: QueueExecutor.key) ?? "none"
            return ServerResponse(status: 200, body: Array("\(request.thread) \(queue)".utf8))
        }
        try await withServer({ $0.threads = 3; $0.taskExecutors = executors }, handler: handler) { server in
            #expect(server.threads == 3)
            var seen: Set<String> = []
            for _ in 0..<9 {
                let connection = try RawHTTPConnection(port: Int(server.port))
                try await connection.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                seen.insert(try #require(try await connection.readResponse()).bodyText)
            }
            // Thread i always with executor i, and every thread used.
            #expect(seen == ["0 a", "1 b", "2 c"])
        }
    }

    @Test("without executors, handlers' tasks run on the global executor")
    func globalByDefault() async throws {
        try await withServer(handler: Self.whereAmI) { server in
            let connection = try RawHTTPConnection(port: Int(server.port))
            try await connection.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(try #require(try await connection.readResponse()).bodyText == "none")
        }
    }
}
