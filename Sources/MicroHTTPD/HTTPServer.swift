import CMicroHTTPD
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A small async HTTP/1.1 server over libmicrohttpd.
///
/// libmicrohttpd's threads never wait on Swift work. When a request is complete they ask the
/// handler for an `Answer`: one it can give at once (a cache hit, an error) is queued right
/// there, on the connection's own thread; for any other the connection is suspended and a task
/// runs the handler's work, whose answer resumes the connection for the next handler call to
/// queue.
public final class HTTPServer: Sendable {
    public typealias Handler = @Sendable (ServerRequest) async -> ServerResponse

    /// How a request is answered.
    public enum Answer: Sendable {
        /// Answered already: queued at once, on libmicrohttpd's thread, with no task and no
        /// suspension.
        case now(ServerResponse)
        /// Answered by this work, run in a task while the connection is suspended. `requestID`
        /// (the handler's own name for the request) is passed to `refusalResponse` when the
        /// server answers instead: past the deadline, or while stopping. For a request with a
        /// `streamedBody`, `upload` takes the body as it arrives (without one it is discarded).
        case later(Work, requestID: String? = nil, upload: (any RequestBodySink)? = nil)
    }

    /// The work that answers a request, run in a task of its own. It runs where that task does,
    /// on the executor given by `ServerConfiguration.taskExecutors` (`nonisolated(nonsending)`:
    /// no executor switch on the way in and out).
    public typealias Work = nonisolated(nonsending) @Sendable () async -> ServerResponse

    /// Called on a libmicrohttpd thread for every complete request (for a streamed body, as
    /// soon as its head is in). It must not block or wait:
    /// whatever cannot be answered straight away is returned as `.later` work.
    public typealias Answering = @Sendable (ServerRequest) -> Answer

    let core: ServerCore

    public init(configuration: ServerConfiguration, answering: @escaping Answering) {
        core = ServerCore(configuration: configuration, answering: answering)
    }

    /// A server whose every request is answered by `handler` in a task.
    public convenience init(configuration: ServerConfiguration, handler: @escaping Handler) {
        self.init(configuration: configuration) { (request: ServerRequest) -> Answer in
            .later { await handler(request) }
        }
    }

    /// Binds and starts serving; returns the bound port (the kernel's choice when the configured port is 0).
    @discardableResult
    public func start() throws(MicroHTTPDError) -> UInt16 {
        try core.start()
    }

    /// The bound port (0 before `start`).
    public var port: UInt16 { core.port }

    /// Requests whose handlers are running.
    public var inFlightRequests: Int { core.inFlightCount }

    /// Responses whose bodies are streaming to their clients.
    public var activeStreams: Int { core.streamCount }

    /// Clients noticed leaving while their request was suspended, whose handlers' tasks were
    /// cancelled (libmicrohttpd itself does not watch a suspended connection).
    public var clientHangUps: Int { core.hangUpCount.load(ordering: .relaxed) }

    /// Where the server is in its life.
    public var lifecycle: ServerLifecycle { core.lifecycle }

    /// Keeps accepting and serving, but asks every client to close its connection after its
    /// answer (`ServerLifecycle.draining`). Returns false when the server was not running. Any thread.
    @discardableResult
    public func beginDraining() -> Bool {
        core.advance(from: .running, to: .draining)
    }

    /// Open client connections.
    public var openConnections: Int { core.openConnectionsPerThread.reduce(0, +) }

    /// Open client connections by thread (connections are dealt to the threads in turn).
    public var openConnectionsPerThread: [Int] { core.openConnectionsPerThread }

    /// Stops accepting, lets in-flight requests finish for up to `grace`, answers those still
    /// running with 503, then stops the daemons. Idempotent; any thread; the first call does the work.
    ///
    /// `listenerClosed` runs as soon as the listening socket is closed, before open connections
    /// are drained: what must take the port over at once (a test server reserving it) does it there.
    public func stop(grace: Duration = .seconds(10), listenerClosed: () -> Void = {}) async {
        await core.stop(grace: grace, listenerClosed: listenerClosed)
    }
}

/// Everything the C callbacks reach through their context pointer.
final class ServerCore: Sendable {
    /// The daemons, one per thread, set once by `start` and cleared by `stop`. libmicrohttpd's
    /// daemon functions used here (`MHD_stop_daemon`, `MHD_get_daemon_info`) are called under
    /// `state`'s lock or after it is cleared, never concurrently with each other;
    /// `MHD_add_connection` comes from the listener's thread, which `stop` ends first.
    struct Daemon: @unchecked Sendable {
        let pointers: [OpaquePointer]
        let listener: Listener
        let logTarget: UnsafeMutablePointer<portico_log_target>
        let tls: DaemonTLSMemory?
    }

    struct State {
        var daemon: Daemon?
        var port: UInt16 = 0
        var watchdog: Task<Void, Never>?
        var inFlight: [ObjectIdentifier: PendingResponse] = [:]
        /// Pending requests not yet in the hang-up watch, by the watchdog tick they arrived in:
        /// a request still waiting after a whole tick is watched; most are answered before and
        /// never cost the two `epoll_ctl` calls (and the locks) of a watch.
        var unwatchedNew: [ObjectIdentifier: (PendingResponse, ConnectionTimer)] = [:]
        var unwatchedOld: [ObjectIdentifier: (PendingResponse, ConnectionTimer)] = [:]
        /// Response streams being sent: `stop` ends them before stopping the daemons.
        var streams: [ObjectIdentifier: StreamingResponse] = [:]
        /// Every open connection, by its timer: the timer for the watchdog, the handle for its own
        /// thread (`answerRefusal`). Its count is what `connectionLimit` limits.
        var connections: [ObjectIdentifier: (timer: ConnectionTimer, handle: ConnectionHandle?)] = [:]
        /// Connections refused past `connectionLimit` since the watchdog last logged them.
        var refusedSinceLog = 0
        /// libmicrohttpd's messages about clients that left mid-exchange, since the watchdog last logged them.
        var departuresSinceLog = 0
    }

    let configuration: ServerConfiguration
    let answering: HTTPServer.Answering
    let state = Mutex(State())
    /// A `ServerLifecycle` raw value. Read by every answer on every thread (draining asks
    /// clients to close), so it is an atomic rather than part of `state`.
    private let phase = Atomic<Int>(ServerLifecycle.created.rawValue)
    /// Connections suspended or resumed but not yet answered: `MHD_stop_daemon` aborts on them,
    /// so `stop` waits for this to reach zero once the lifecycle is `closing`. Admitting counts
    /// first and checks the lifecycle second, and `stop` moves the lifecycle first and reads the
    /// count second (both sequentially consistent): a request either sees `closing` and backs
    /// out, or is in the count `stop` reads. No lock on the request path.
    private let admissions = Atomic<Int>(0)
    /// Suspended requests' connections, watched for their clients leaving.
    let hangUps = HangUpWatch()
    /// Clients noticed leaving while their request was suspended (its work cancelled).
    let hangUpCount = Atomic<Int>(0)
    /// Turns of `nextExecutor`.
    private let executorTurn = Atomic<UInt>(0)
    /// Refused connections one libmicrohttpd thread can hold while they close (each for one turn of its event loop).
    static let refusalHeadroom = 1024

    init(configuration: ServerConfiguration, answering: @escaping HTTPServer.Answering) {
        self.configuration = configuration
        self.answering = answering
    }

    var port: UInt16 { state.withLock { $0.port } }
    var inFlightCount: Int { state.withLock { $0.inFlight.count } }
    var streamCount: Int { state.withLock { $0.streams.count } }
    var lifecycle: ServerLifecycle { ServerLifecycle(rawValue: phase.load(ordering: .sequentiallyConsistent))! }
    /// Answers ask their clients to close the connection from `draining` on. Any thread.
    var isDraining: Bool { phase.load(ordering: .relaxed) >= ServerLifecycle.draining.rawValue }

    /// Moves the lifecycle forward to `next` if it is at `expected`; returns whether it moved.
    @discardableResult
    func advance(from expected: ServerLifecycle, to next: ServerLifecycle) -> Bool {
        precondition(expected < next, "the lifecycle only moves forward: \(expected) → \(next)")
        return phase.compareExchange(expected: expected.rawValue, desired: next.rawValue, ordering: .sequentiallyConsistent).exchanged
    }

    /// Moves the lifecycle forward to `next` from wherever it is before it; returns whether it moved.
    @discardableResult
    func advance(to next: ServerLifecycle) -> Bool {
        var current = phase.load(ordering: .sequentiallyConsistent)
        while current < next.rawValue {
            let (exchanged, found) = phase.compareExchange(expected: current, desired: next.rawValue,
                                                           ordering: .sequentiallyConsistent)
            if exchanged { return true }
            current = found
        }
        return false
    }
    var openConnectionsPerThread: [Int] {
        state.withLock { state in
            state.daemon.map { $0.pointers.map { Int(portico_mhd_current_connections($0)) } } ?? []
        }
    }

    /// Called by the owner; a server starts once (a failed start may be tried again).
    func start() throws(MicroHTTPDError) -> UInt16 {
        let context = Unmanaged.passUnretained(self).toOpaque()
        // No listening socket: `Listener` accepts, and deals connections evenly over the threads.
        // poll(), not epoll: libmicrohttpd 0.9.75's edge-triggered epoll misses a client's FIN
        // that arrives together with half a request head, and such connections stayed open
        // until the head timeout (bench/floods b and c failed with it; poll passes, and measured
        // no slower at 32 connections). poll() costs O(connections per thread) per wake-up.
        var flags = MHD_USE_POLL_INTERNAL_THREAD.rawValue | MHD_USE_NO_LISTEN_SOCKET.rawValue | MHD_USE_ITC.rawValue
            | MHD_ALLOW_SUSPEND_RESUME.rawValue | MHD_USE_ERROR_LOG.rawValue

        if lifecycle != .created { throw .alreadyStarted }
        var tls: DaemonTLSMemory?
        if let settings = configuration.tls {
            tls = try DaemonTLSMemory(settings)
            flags |= MHD_USE_TLS.rawValue
        }
        let listener: Listener
        do {
            listener = try Listener(address: configuration.address, port: configuration.port,
                                    backlog: configuration.listenBacklog)
        } catch {
            tls?.release()
            throw error
        }
        ensureDescriptorLimit()
        let logTarget = UnsafeMutablePointer<portico_log_target>.allocate(capacity: 1)
        logTarget.initialize(to: portico_log_target(sink: mhdLogSink, context: context))

        // One daemon per thread, each with its own internal thread, and the listener deals
        // connections to them in turn: a thread pool inside one daemon picks the thread by
        // descriptor number, and descriptors come in pairs here (see ConnectionTimer).
        var daemons: [OpaquePointer] = []
        for _ in 0..<max(1, configuration.threads) {
            var c = portico_mhd_config()
            c.flags = flags
            // The limit is enforced by `opened`, which closes a connection past it at once:
            // libmicrohttpd's own would leave connections unserved. Every daemon gets room for
            // all the allowed connections and the refused ones closing.
            c.connection_limit = UInt32(clamping: max(1, configuration.connectionLimit) + Self.refusalHeadroom)
            c.connection_timeout_seconds = UInt32(clamping: configuration.idleTimeout.components.seconds)
            // The request head, libmicrohttpd's record of each field (about 56 bytes) and then
            // the response head share this per-connection pool. libmicrohttpd zeroes all of it
            // before every request on a connection, so its size is a per-request cost: 80 KiB
            // cost 11 % of a core serving cache hits (bench/RESULTS.md).
            c.connection_memory_limit = configuration.connectionMemoryBytes
            // 0, not 1: at 1 libmicrohttpd 0.9.75 refuses a request without Host itself, writing
            // its status line twice; `RequestHeadRules` checks Host and the target instead.
            c.strict_level = 0
            c.access_handler = mhdAccessHandler
            c.access_context = context
            c.uri_log_callback = mhdURILog
            c.uri_log_context = context
            c.completed_callback = mhdRequestCompleted
            c.completed_context = context
            c.connection_callback = mhdConnectionNotify
            c.connection_context = context
            c.log_target = logTarget
            let daemon = DaemonTLSMemory.priorities.withCString { priorities in
                c.tls_cert_pem = UnsafePointer(tls?.certificate)
                c.tls_key_pem = UnsafePointer(tls?.privateKey)
                c.tls_priorities = tls == nil ? nil : priorities
                return portico_mhd_start(&c)
            }
            guard let daemon else { break }
            daemons.append(daemon)
        }
        func release() {
            listener.stop(handingTo: [])
            for daemon in daemons { MHD_stop_daemon(daemon) }
            logTarget.deinitialize(count: 1)
            logTarget.deallocate()
            tls?.release()
        }
        guard daemons.count == max(1, configuration.threads) else {
            var detail = String(cString: strerror(errno))
            release()
            // GnuTLS refusing the certificate or key is reported through the error log only.
            if tls != nil { detail += " (or libmicrohttpd refused the TLS certificate or key: see its log)" }
            throw .startFailed(address: configuration.address, port: configuration.port, detail: detail)
        }
        do {
            try listener.start(handingTo: daemons) { [weak self] message in self?.log(message) }
        } catch {
            release()
            throw error
        }
        let port = listener.port
        let watchdog = Task { [weak self] () -> Void in
            await self?.watchDeadlines()
        }
        state.withLock { state in
            state.daemon = Daemon(pointers: daemons, listener: listener, logTarget: logTarget, tls: tls)
            state.port = port
            state.watchdog = watchdog
        }
        advance(from: .created, to: .running)
        return port
    }

    func stop(grace: Duration, listenerClosed: () -> Void = {}) async {
        // The first caller moves the lifecycle to `stopping` and does the work.
        guard let daemon = state.withLock({ $0.daemon }), advance(to: .stopping) else { return }

        // Stop accepting: connections the kernel already completed are served, new ones refused.
        daemon.listener.stop(handingTo: daemon.pointers)
        listenerClosed()

        // Open connections are still served (with `Connection: close`) until no request is in
        // flight; in that same instant the server starts closing, so a request arriving on an
        // open connection later is answered 503 rather than suspended (MHD_stop_daemon aborts on
        // suspended connections). Connections accepted just now get a moment to deliver theirs.
        let clock = ContinuousClock()
        let graceDeadline = clock.now.advanced(by: grace)
        let settled = clock.now.advanced(by: min(grace, .milliseconds(250)))
        while clock.now < graceDeadline {
            let idle = clock.now >= settled && state.withLock { state -> Bool in
                guard state.inFlight.isEmpty, state.streams.isEmpty else { return false }
                advance(to: .closing)
                return true
            }
            if idle { break }
            try? await Task.sleep(for: .milliseconds(10))
        }
        advance(to: .closing)
        // Whatever is still running (or was admitted just before closing) is answered now, and
        // resumed connections get a turn of their thread to queue their answer.
        let flushDeadline = clock.now.advanced(by: .seconds(5))
        while clock.now < flushDeadline {
            let (remaining, streams) = state.withLock { (Array($0.inFlight.values), Array($0.streams.values)) }
            let suspended = admissions.load(ordering: .sequentiallyConsistent)
            for pending in remaining {
                pending.complete(configuration.refusalResponse(.shuttingDown, nil, pending.requestID))
            }
            // Streams past the grace are cut (closed short of their framing, never passed off as whole).
            for stream in streams { stream.abort() }
            if suspended == 0 && streams.isEmpty { break }
            try? await Task.sleep(for: .milliseconds(5))
        }
        let watchdog = state.withLock { state -> Task<Void, Never>? in
            state.daemon = nil
            return state.watchdog
        }
        watchdog?.cancel()
        await watchdog?.value
        for pointer in daemon.pointers { MHD_stop_daemon(pointer) }
        advance(to: .stopped)
        // Connections libmicrohttpd closed without a close notification keep no descriptor of ours.
        let timers = state.withLock { state in
            defer { state.connections.removeAll() }
            return state.connections.values.map(\.timer)
        }
        for timer in timers { timer.markClosed() }
        daemon.logTarget.deinitialize(count: 1)
        daemon.logTarget.deallocate()
        daemon.tls?.release()
    }

    /// Raises the soft descriptor limit (up to the hard one) to what the connection limit needs,
    /// and says so when even the hard limit is short: out of descriptors, libmicrohttpd stops
    /// accepting and new connections wait in the backlog instead of being served or refused.
    private func ensureDescriptorLimit() {
        var limit = rlimit()
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        guard getrlimit(resource, &limit) == 0 else { return }
        let wanted = rlim_t(clamping: ServerConfiguration.descriptorsNeeded(connectionLimit: configuration.connectionLimit))
        if limit.rlim_cur < wanted && limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = min(wanted, limit.rlim_max)
            if setrlimit(resource, &raised) == 0 { limit = raised }
        }
        if limit.rlim_cur < wanted {
            log("a connection limit of \(configuration.connectionLimit) needs about \(wanted) file descriptors "
                + "(two per connection, and upstream connections); the process may open \(limit.rlim_cur): "
                + "raise its limit (LimitNOFILE) or lower the connection limit")
        }
    }

    /// Answers requests whose handlers overrun their deadline (a little grace lets a handler's
    /// own, more specific timeout answer win), and every half second disconnects clients too
    /// slow to deliver a head or body.
    private func watchDeadlines() async {
        let interval = Duration.milliseconds(50)
        let grace = Duration.milliseconds(250)
        var tick = 0
        while !Task.isCancelled {
            do { try await Task.sleep(for: interval) } catch { return }
            tick += 1
            watchLingering()
            cancelDeparted()
            if tick % 10 == 0 { expireSlowConnections() }
            let now = ContinuousClock.now
            let overdue = state.withLock { state in
                state.inFlight.values.filter { now > $0.deadline.advanced(by: grace) }
            }
            for pending in overdue {
                pending.complete(configuration.refusalResponse(.deadlineExceeded, nil, pending.requestID))
            }
        }
    }

    /// Puts the requests that have waited a whole tick into the hang-up watch. A client that
    /// leaves is then noticed within two ticks (100 ms) instead of one.
    private func watchLingering() {
        let lingering = state.withLock { state in
            defer {
                state.unwatchedOld = state.unwatchedNew
                state.unwatchedNew = [:]
            }
            return state.unwatchedOld.values
        }
        for (pending, timer) in lingering { hangUps.watch(pending, on: timer) }
    }

    /// Ends the work of exchanges whose clients have left while libmicrohttpd was not looking
    /// (`HangUpWatch`): a request's task is cancelled, a response stream's source told.
    private func cancelDeparted() {
        let departed = hangUps.departed()
        guard !departed.isEmpty else { return }
        var cancelled = 0
        for (listener, timer) in departed where listener.clientLeft(timer: timer) {
            cancelled += 1
        }
        guard cancelled > 0 else { return }
        hangUpCount.wrappingAdd(cancelled, ordering: .relaxed)
        state.withLock { $0.departuresSinceLog += cancelled }
    }

    private func expireSlowConnections() {
        let now = ContinuousClock.now
        let timers = state.withLock { $0.connections.values.map(\.timer) }
        var heads = 0, bodies = 0
        for timer in timers {
            switch timer.expire(now: now) {
            case .head: heads += 1
            case .body: bodies += 1
            case nil: break
            }
        }
        if heads > 0 {
            log("closed \(heads) connection(s) whose request head took longer than \(configuration.headerTimeout)")
        }
        if bodies > 0 {
            log("closed \(bodies) connection(s) whose request body took longer than \(configuration.requestTimeout)")
        }
        let (refused, departures) = state.withLock { state in
            defer { (state.refusedSinceLog, state.departuresSinceLog) = (0, 0) }
            return (state.refusedSinceLog, state.departuresSinceLog)
        }
        if refused > 0 {
            log("closed \(refused) new connection(s) at once: \(configuration.connectionLimit) connections open (the connection limit)")
        }
        if departures > 0 {
            log("\(departures) connection error(s): clients closed or reset connections mid-request or mid-response")
        }
    }

    // MARK: - Called from libmicrohttpd threads

    /// The task executor for a new connection, dealt in turn. libmicrohttpd threads.
    func nextExecutor() -> (any TaskExecutor)? {
        let executors = configuration.taskExecutors
        guard !executors.isEmpty else { return nil }
        return executors[Int(executorTurn.wrappingAdd(1, ordering: .relaxed).oldValue % UInt(executors.count))]
    }

    /// Admits a new connection unless `connectionLimit` connections are open already.
    func opened(_ timer: ConnectionTimer, handle: ConnectionHandle?) -> Bool {
        state.withLock { state in
            guard state.connections.count < max(1, configuration.connectionLimit) else {
                state.refusedSinceLog += 1
                return false
            }
            state.connections[ObjectIdentifier(timer)] = (timer, handle)
            return true
        }
    }

    func closed(_ timer: ConnectionTimer) {
        _ = state.withLock { $0.connections.removeValue(forKey: ObjectIdentifier(timer)) }
    }

    /// Reserves a suspension for a complete request; false once the server is closing.
    /// libmicrohttpd threads.
    func admit() -> Bool {
        admissions.wrappingAdd(1, ordering: .sequentiallyConsistent)
        guard phase.load(ordering: .sequentiallyConsistent) < ServerLifecycle.closing.rawValue else {
            withdraw()
            return false
        }
        return true
    }

    /// Gives back an admission the request did not need (it was answered at once), or no longer
    /// needs (its answer was queued). libmicrohttpd threads.
    func withdraw() {
        admissions.wrappingSubtract(1, ordering: .sequentiallyConsistent)
    }

    /// A suspended request whose handler is about to run (deadline watchdog, shutdown, and
    /// from the next tick on, the hang-up watch).
    func register(_ pending: PendingResponse, timer: ConnectionTimer) {
        state.withLock { state in
            state.inFlight[ObjectIdentifier(pending)] = pending
            state.unwatchedNew[ObjectIdentifier(pending)] = (pending, timer)
        }
    }

    /// A response stream starts: watched for its client leaving and for `stop`.
    func streaming(_ stream: StreamingResponse) {
        state.withLock { $0.streams[ObjectIdentifier(stream)] = stream }
        hangUps.watch(stream, on: stream.timer)
    }

    /// A response stream's request completed (or its connection closed).
    func streamEnded(_ stream: StreamingResponse) {
        _ = state.withLock { $0.streams.removeValue(forKey: ObjectIdentifier(stream)) }
        hangUps.unwatch(stream, on: stream.timer)
    }

    func completed(_ pending: PendingResponse, timer: ConnectionTimer) {
        let id = ObjectIdentifier(pending)
        let watched = state.withLock { state in
            state.inFlight.removeValue(forKey: id)
            return state.unwatchedNew.removeValue(forKey: id) == nil && state.unwatchedOld.removeValue(forKey: id) == nil
        }
        if watched { hangUps.unwatch(pending, on: timer) }
    }

    /// The connection no longer waits on `pending`: its response was queued or the request ended.
    func released(_ context: ConnectionContext) {
        guard context.pending != nil else { return }
        context.pending = nil
        withdraw()
    }

    func log(_ message: String) {
        configuration.errorLog?(message)
    }

    /// libmicrohttpd's messages about a client that went away come one (or two) per connection,
    /// and some quote the request target: a flood of dropped connections would be a flood of log
    /// lines. They are counted and summarized every half second instead.
    func libraryLog(_ message: String) {
        if Self.clientDepartures.contains(where: { message.hasPrefix($0) }) {
            state.withLock { $0.departuresSinceLog += 1 }
        } else if let refusal = LibraryRefusal(message: message) {
            answerRefusal(refusal)
        } else {
            log(message)
        }
    }

    /// Answers a request libmicrohttpd is refusing with a doubled head (`LibraryRefusal`).
    /// Called on the refusing connection's own thread, from inside its state machine: of that
    /// thread's connections, it is the one whose head is in (libmicrohttpd knows its size), that
    /// the access handler has not seen yet and that has no response queued. Heads are parsed
    /// and handed to the access handler in one go, so no other connection is in that state.
    private func answerRefusal(_ refusal: LibraryRefusal) {
        let current = pthread_self()
        let handles = state.withLock { state in
            state.connections.values.compactMap { $0.handle }.filter { pthread_equal($0.thread, current) != 0 }
        }
        let refusing = handles.filter { handle in
            let context = handle.context.takeUnretainedValue()
            guard let request = context.request, !request.headersSeen else { return false }
            return portico_mhd_head_received(handle.connection) != 0 && portico_mhd_has_response(handle.connection) == 0
        }
        guard refusing.count == 1, let handle = refusing.first, handle.socket >= 0 else {
            log("libmicrohttpd refused a request (\(refusal)) and its connection could not be told apart")
            return
        }
        // Seen: a later refusal on this thread must not find this connection again.
        handle.context.takeUnretainedValue().request?.headersSeen = true
        if configuration.tls == nil {
            let answer = configuration.refusalResponse(refusal.refusal(maxBodyBytes: configuration.maxBodyBytes), nil, nil)
            let bytes = answer.serialized(date: imfFixdateNow())
            // One small write to a socket whose previous response is long sent: it fits in the
            // send buffer. A short write still ends in the shutdown below, so the client sees a
            // response shorter than its Content-Length, never a complete-looking wrong one.
            _ = bytes.withUnsafeBytes { Glibc.send(handle.socket, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            _ = Glibc.shutdown(handle.socket, Int32(SHUT_WR))
        } else {
            // Under TLS the bytes would have to be encrypted by GnuTLS: the connection is closed unanswered.
            _ = Glibc.shutdown(handle.socket, Int32(SHUT_RDWR))
        }
    }

    static let clientDepartures = [
        "Socket has been disconnected when reading request",
        "Connection was closed by remote side with incomplete request",
        "Failed to send ",
    ]
}
