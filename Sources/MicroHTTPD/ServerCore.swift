import CMicroHTTPD
import LockAudit
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The server's lifecycle and what its daemon threads share: the configuration, the handler,
/// one connection count (`connectionLimit` is one cap for the listener) and the lifecycle. Each
/// daemon thread's own state lives in its `DaemonShard`, which its C callbacks reach through
/// their context pointer; this type starts the daemons and drains and stops them.
final class ServerCore: Sendable {
    /// The daemons, one per shard, set once by `start` and cleared by `stop`. libmicrohttpd's
    /// daemon functions used here (`MHD_stop_daemon`, `MHD_get_daemon_info`) are called under
    /// `state`'s lock or after it is cleared, never concurrently with each other;
    /// `MHD_add_connection` comes from the listener's thread, which `stop` ends first.
    struct Daemon: @unchecked Sendable {
        let pointers: [OpaquePointer]
        let listener: Listener
        let logTargets: [UnsafeMutablePointer<portico_log_target>]
        let tls: DaemonTLSMemory?
    }

    /// Taken by `start`, `stop` and the admin's reads, never per request.
    struct State {
        var daemon: Daemon?
        var port: UInt16 = 0
        var watchdogs: [Task<Void, Never>] = []
    }

    let configuration: ServerConfiguration
    /// One per daemon thread, paired with `configuration.taskExecutors[i]`.
    let shards: [DaemonShard]
    let lifecycleState = LifecycleState()
    /// What `stop` waits on while the shards empty.
    let quiescence = Quiescence()
    let state = Mutex(State())
    /// Refused connections one libmicrohttpd thread can hold while they close (each for one turn of its event loop).
    static let refusalHeadroom = 1024

    init(configuration: ServerConfiguration, answering: @escaping HTTPServer.Answering) {
        self.configuration = configuration
        let executors = configuration.taskExecutors
        let connectionCount = SharedCap(name: "listen.connection_limit")
        shards = (0..<max(1, configuration.threads)).map { [lifecycleState, quiescence] index in
            DaemonShard(index: index, configuration: configuration, answering: answering, lifecycle: lifecycleState,
                        connectionCount: connectionCount, quiescence: quiescence,
                        executor: executors.isEmpty ? nil : executors[index % executors.count])
        }
    }

    var port: UInt16 { state.withLock { $0.port } }
    var inFlightCount: Int { shards.reduce(0) { $0 + $1.inFlightCount } }
    var streamCount: Int { shards.reduce(0) { $0 + $1.streamCount } }
    var upgradeCount: Int { shards.reduce(0) { $0 + $1.upgradeCount } }
    var lifecycle: ServerLifecycle { lifecycleState.current }

    @discardableResult
    func advance(from expected: ServerLifecycle, to next: ServerLifecycle) -> Bool {
        lifecycleState.advance(from: expected, to: next)
    }

    @discardableResult
    func advance(to next: ServerLifecycle) -> Bool {
        lifecycleState.advance(to: next)
    }

    var openConnectionsPerThread: [Int] {
        state.withLock { state in
            state.daemon.map { $0.pointers.map { Int(portico_mhd_current_connections($0)) } } ?? []
        }
    }

    /// Called by the owner; a server starts once (a failed start may be tried again).
    func start() throws(MicroHTTPDError) -> UInt16 {
        // No listening socket: `Listener` accepts, and deals connections evenly over the threads.
        // poll(), not epoll: libmicrohttpd 0.9.75's edge-triggered epoll misses a client's FIN
        // that arrives together with half a request head, and such connections stayed open
        // until the head timeout (bench/floods b and c failed with it; poll passes, and measured
        // no slower at 32 connections). poll() costs O(connections per thread) per wake-up.
        var flags = MHD_USE_POLL_INTERNAL_THREAD.rawValue | MHD_USE_NO_LISTEN_SOCKET.rawValue | MHD_USE_ITC.rawValue
            | MHD_ALLOW_SUSPEND_RESUME.rawValue | MHD_USE_ERROR_LOG.rawValue

        // Upgrades (WebSocket, issue #35) need libmicrohttpd built with them; without, a 101
        // cannot be handed over and `HTTPServer.upgradeSupported` says so.
        if HTTPServer.upgradeSupported {
            flags |= portico_allow_upgrade
        } else {
            log("this libmicrohttpd has no upgrade support (MHD_FEATURE_UPGRADE): upgrade requests cannot be served")
        }
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
        var logTargets: [UnsafeMutablePointer<portico_log_target>] = []

        // One daemon per thread, each with its own internal thread, and the listener deals
        // connections to them in turn: a thread pool inside one daemon picks the thread by
        // descriptor number, and descriptors come in pairs here (see ConnectionTimer).
        var daemons: [OpaquePointer] = []
        // Each daemon's callbacks get its own shard as their context (unretained: the core owns
        // the shards and outlives the daemons).
        for shard in shards {
            let context = Unmanaged.passUnretained(shard).toOpaque()
            let logTarget = UnsafeMutablePointer<portico_log_target>.allocate(capacity: 1)
            logTarget.initialize(to: portico_log_target(sink: mhdLogSink, context: context))
            logTargets.append(logTarget)
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
            for logTarget in logTargets {
                logTarget.deinitialize(count: 1)
                logTarget.deallocate()
            }
            tls?.release()
        }
        guard daemons.count == shards.count else {
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
        // Each shard's watchdog runs on its paired executor, where its requests complete.
        let watchdogs = shards.map { shard in
            Task(executorPreference: shard.executor) { await shard.watch() }
        }
        state.withLock { state in
            state.daemon = Daemon(pointers: daemons, listener: listener, logTargets: logTargets, tls: tls)
            state.port = port
            state.watchdogs = watchdogs
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
        // flight; then the server starts closing, so a request arriving on an open connection
        // later is answered 503 rather than suspended (MHD_stop_daemon aborts on suspended
        // connections). Connections accepted just now get a moment to deliver theirs (their requests are not in
        // flight yet); then the wait ends when the last request completes and the last stream
        // ends (the shards say so as it happens), or at the grace.
        let clock = ContinuousClock()
        let graceDeadline = clock.now.advanced(by: grace)
        try? await Task.sleep(for: min(grace, .milliseconds(250)))
        _ = await quiescence.wait(timeout: clock.now.duration(to: graceDeadline)) { [self] in
            inFlightCount == 0 && streamCount == 0 && upgradeCount == 0
        }
        // From this instant a request completed now is answered 503 at once instead of being
        // handed to a task. Whatever is still running (or was admitted just before closing) is
        // answered now, streams past the grace are cut (closed short of their framing, never passed
        // off as whole), and resumed connections get a turn of their thread to queue their answer:
        // done when no connection waits on an answer any more.
        advance(to: .closing)
        let answerAll: @Sendable () -> Bool = { [self] in
            let inFlight = shards.map { $0.inFlight() }
            for pending in inFlight.flatMap(\.requests) {
                pending.complete(configuration.refusalResponse(.shuttingDown, nil, pending.requestID))
            }
            let streams = inFlight.flatMap(\.streams)
            for stream in streams { stream.abort() }
            // Upgraded connections past the grace: their handlers end them (a WebSocket's says
            // goodbye with 1001 first) and give them back to libmicrohttpd.
            let upgraded = shards.flatMap(\.upgradedConnections)
            for connection in upgraded { connection.handler.serverStopping() }
            return streams.isEmpty && upgraded.isEmpty && shards.allSatisfy { $0.admitted == 0 }
        }
        _ = await quiescence.wait(timeout: .seconds(5), until: answerAll)
        // Queued is not sent: the answers go out on their threads' next turns, and
        // MHD_stop_daemon would close their connections first (a 503 past the grace, lost under load).
        _ = await quiescence.wait(timeout: .seconds(2)) { [self] in shards.allSatisfy { $0.answersUnsent == 0 } }
        // Tasks answered for by the server (or cancelled) may still be winding down: they end
        // before `stop` returns, so their executors can be shut down after it.
        _ = await quiescence.wait(timeout: .seconds(10)) { [self] in shards.allSatisfy { $0.tasksRunning == 0 } }
        let watchdogs = state.withLock { state -> [Task<Void, Never>] in
            state.daemon = nil
            defer { state.watchdogs = [] }
            return state.watchdogs
        }
        for watchdog in watchdogs { watchdog.cancel() }
        for watchdog in watchdogs { await watchdog.value }
        // Upgraded connections still open are closed by MHD_stop_daemon itself: their handles
        // die with it, so a late `close` must not reach libmicrohttpd.
        for connection in shards.flatMap(\.upgradedConnections) { connection.forgetHandle() }
        for pointer in daemon.pointers { MHD_stop_daemon(pointer) }
        for connection in shards.flatMap(\.upgradedConnections) { connection.handler.serverStopping() }
        advance(to: .stopped)
        // Connections libmicrohttpd closed without a close notification keep no descriptor of ours.
        for shard in shards { shard.forgetConnections() }
        for logTarget in daemon.logTargets {
            logTarget.deinitialize(count: 1)
            logTarget.deallocate()
        }
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

    func log(_ message: String) {
        configuration.errorLog?(message)
    }

    static let clientDepartures = [
        "Socket has been disconnected when reading request",
        "Connection was closed by remote side with incomplete request",
        "Failed to send ",
    ]
}
