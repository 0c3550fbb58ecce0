import NIOCore
import NIOPosix
import Synchronization

/// Waiting until an instant on a timer of the caller's own event loop, when the clock is one
/// NIO's timers keep (the real one) and the caller runs on a loop (a gateway request's task):
/// nothing sleeps on another thread, and a cancelled wait removes its timer at once (a cancelled
/// `Task.sleep` leaves its timer queued in libdispatch until the deadline; see
/// `withUpstreamDeadline`). Any other clock (a test's) sleeps on the clock itself.
enum LoopTimer {
    /// Returns at `deadline`; throws `CancellationError` when the task is cancelled first.
    /// `interrupt`: ends the wait early (it returns normally) when fired; on a clock NIO does
    /// not keep (a test's), the wait runs to `deadline` regardless.
    static func sleep(until deadline: ContinuousClock.Instant, clock: any GatewayClock,
                      interrupt: PriorityLine.Interrupt? = nil) async throws {
        guard let loopDeadline = clock.eventLoopDeadline(for: deadline),
              let loop = MultiThreadedEventLoopGroup.currentEventLoop else {
            try await clock.sleep(until: deadline)
            return
        }
        let waiter = Waiter()
        try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<Void, any Error>) in
                let scheduled = loop.scheduleTask(deadline: loopDeadline) { waiter.finish(nil) }
                waiter.start(continuation, timer: scheduled)
                interrupt?.onFire { waiter.finish(nil) }
            }
        } onCancel: {
            waiter.finish(CancellationError())
        }
    }

    /// The continuation and its timer; whichever of the timer and cancellation comes first
    /// resumes it, once (the state's move to `.done` under the lock decides which; so an unsafe
    /// continuation, which holds no heap canary of its own while a request waits).
    private final class Waiter: Sendable {
        private enum State {
            case idle
            case waiting(UnsafeContinuation<Void, any Error>, Scheduled<Void>)
            case cancelledEarly
            case firedEarly
            case done
        }

        private let state = Mutex(State.idle)

        func start(_ continuation: UnsafeContinuation<Void, any Error>, timer: Scheduled<Void>) {
            let early: State? = state.withLock { state in
                switch state {
                case .idle:
                    state = .waiting(continuation, timer)
                    return nil
                case .cancelledEarly, .firedEarly:
                    defer { state = .done }
                    return state
                case .waiting, .done:
                    preconditionFailure("LoopTimer started twice")
                }
            }
            switch early {
            case .cancelledEarly?:
                timer.cancel()
                continuation.resume(throwing: CancellationError())
            case .firedEarly?:
                continuation.resume()
            default:
                break
            }
        }

        func finish(_ error: (any Error)?) {
            let taken: (UnsafeContinuation<Void, any Error>, Scheduled<Void>)? = state.withLock { state in
                switch state {
                case .idle:
                    state = error == nil ? .firedEarly : .cancelledEarly
                    return nil
                case .waiting(let continuation, let timer):
                    state = .done
                    return (continuation, timer)
                case .cancelledEarly, .firedEarly, .done:
                    return nil
                }
            }
            guard let (continuation, timer) = taken else { return }
            // Cancelling a timer that fired is a no-op; one an interrupt beat is removed at once.
            timer.cancel()
            if let error {
                continuation.resume(throwing: error)
            } else {
                continuation.resume()
            }
        }
    }
}
