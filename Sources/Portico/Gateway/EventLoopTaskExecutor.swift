import NIOCore
import NIOPosix

/// Runs a request's task on an event loop of the group the `nio` transport's upstream
/// connections live on. The connection pool leases an idle connection of the task's own loop
/// first, so the exchange's writes, its response and the task's resumption all stay on one
/// thread: a proxied request crosses threads twice (libmicrohttpd → loop → libmicrohttpd)
/// rather than four times through the global executor's threads (bench/RESULTS.md, session 10).
final class EventLoopTaskExecutor: TaskExecutor {
    let eventLoop: any EventLoop

    init(_ eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        // `execute` from the loop itself only appends to its queue: no wake-up.
        eventLoop.execute { [self] in
            job.runSynchronously(on: asUnownedTaskExecutor())
        }
    }

    /// One executor per loop of the shared group (which has a loop per core).
    static let perLoop: [EventLoopTaskExecutor] = MultiThreadedEventLoopGroup.singleton.makeIterator().map(EventLoopTaskExecutor.init)
}
