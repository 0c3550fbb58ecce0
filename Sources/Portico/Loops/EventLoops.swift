import NIOCore
import NIOPosix
import Synchronization

/// The event loops a gateway's requests run on: one per libmicrohttpd daemon thread, paired by
/// index. Daemon thread `i` starts its requests' tasks on `executors[i]`, and everything a
/// request touches after that — its upstream connection (the pool of loop `i`), its deadline,
/// its stats — belongs to loop `i`, so no other core writes it (issue #33).
///
/// A gateway owns its loops (`init(count:)`) and shuts them down when it stops. Code that runs
/// without a gateway (tests calling a runtime directly, token endpoints of a runtime made on its
/// own) uses `shared`: NIO's process-wide group, never shut down.
public final class EventLoops: Sendable {
    public let group: MultiThreadedEventLoopGroup
    /// The loops, in the order daemon threads are paired with them.
    public let loops: [any EventLoop]
    /// One task executor per loop, same order.
    public let executors: [EventLoopTaskExecutor]
    /// Loop identity → index (built once; read-only afterwards, so lookups share nothing writable).
    private let indices: [ObjectIdentifier: Int]
    private let owned: Bool
    /// The next loop `nextHomeIndex` deals.
    private let homeTurn = Atomic<Int>(0)

    /// `count` loops of a group of this gateway's own.
    public convenience init(count: Int) {
        self.init(group: MultiThreadedEventLoopGroup(numberOfThreads: max(1, count)), owned: true)
    }

    private init(group: MultiThreadedEventLoopGroup, owned: Bool) {
        self.group = group
        self.owned = owned
        let loops = Array(group.makeIterator())
        self.loops = loops
        self.executors = loops.map(EventLoopTaskExecutor.init)
        var indices: [ObjectIdentifier: Int] = [:]
        for (index, loop) in loops.enumerated() { indices[ObjectIdentifier(loop)] = index }
        self.indices = indices
    }

    /// NIO's process-wide loops (one per core); never shut down.
    public static let shared = EventLoops(group: .singleton, owned: false)

    public var count: Int { loops.count }

    /// The index of the loop the caller runs on, or `nil` when it is not on one of these loops.
    public var currentIndex: Int? {
        guard let current = MultiThreadedEventLoopGroup.currentEventLoop else { return nil }
        return indices[ObjectIdentifier(current)]
    }

    /// A loop for something made once that serves callers on none of these loops (a pool's
    /// requests from tests or token fetches): dealt in turn, so such things spread over the
    /// loops. Called when the thing is made, never per request.
    public func nextHomeIndex() -> Int {
        Int(UInt(bitPattern: homeTurn.wrappingAdd(1, ordering: .relaxed).oldValue) % UInt(loops.count))
    }

    /// Stops the loops of a gateway's own group (after its last request and connection).
    public func shutdown() async {
        guard owned else { return }
        try? await group.shutdownGracefully()
    }
}
