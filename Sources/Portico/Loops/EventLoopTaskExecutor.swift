import NIOCore
import NIOPosix

/// Runs a request's task on the event loop paired with the libmicrohttpd thread that read it
/// (`EventLoops`). The `nio` transport's pool of that loop serves it, so the exchange's writes,
/// its response and the task's resumption all stay on one thread: a proxied request crosses
/// threads twice (libmicrohttpd → loop → libmicrohttpd) rather than four times through the
/// global executor's threads (bench/RESULTS.md, session 10).
public final class EventLoopTaskExecutor: TaskExecutor {
    public let eventLoop: any EventLoop

    init(_ eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        // `execute` from the loop itself only appends to its queue: no wake-up.
        eventLoop.execute { [self] in
            job.runSynchronously(on: asUnownedTaskExecutor())
        }
    }
}
