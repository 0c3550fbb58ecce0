import CMicroHTTPD
import LockAudit
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One libmicrohttpd daemon thread's share of the server, and the executor it is paired with
/// (issue #33): its connections, its requests in flight, its response streams, its hang-up
/// watches and its watchdog. Nothing here is shared with another daemon thread, so no lock that
/// a request takes is taken by another core:
/// - `requests` is taken per request only on the paired executor: a request registers itself
///   when its task starts, and completes there (the handler's answer, or the watchdog's, which
///   runs on the same executor). `stop`, and a client leaving mid-upload, take it rarely.
/// - `streams`, `connections` and the admission count are the daemon thread's own (per streamed
///   response, per connection); the watchdog reads `connections` twice a second.
/// Without executors (`ServerConfiguration.taskExecutors` empty) tasks run on the global
/// executor: correct, but not confined.
final class DaemonShard: Sendable {
    let index: Int
    let configuration: ServerConfiguration
    let answering: HTTPServer.Answering
    /// The server's lifecycle (shared by every shard, written only by lifecycle moves).
    let lifecycle: LifecycleState
    /// Open connections over every thread: `connectionLimit` is one cap for the listener.
    let connectionCount: SharedCap
    /// Told whenever this shard empties a little, for a `stop` waiting on it.
    let quiescence: Quiescence
    /// Where this thread's requests' tasks run.
    let executor: (any TaskExecutor)?

    private struct Requests {
        var inFlight: [ObjectIdentifier: PendingResponse] = [:]
        /// Pending requests not yet in the hang-up watch, by the watchdog tick they arrived in:
        /// a request still waiting after a whole tick is watched; most are answered before and
        /// never cost the two `epoll_ctl` calls of a watch.
        var unwatchedNew: [ObjectIdentifier: (PendingResponse, ConnectionTimer)] = [:]
        var unwatchedOld: [ObjectIdentifier: (PendingResponse, ConnectionTimer)] = [:]
    }

    private let requests = Mutex(Requests())
    /// How many are in `requests.inFlight` (written under its lock, by the executor): an idle
    /// shard's watchdog tick reads this instead of taking the lock.
    private let registered = Atomic<Int>(0)
    /// Response streams being sent: `stop` ends them before stopping the daemons.
    private let streams = Mutex<[ObjectIdentifier: StreamingResponse]>([:])
    /// Every open connection of this thread, by its timer: the timer for the watchdog, the handle
    /// for `answerRefusal`.
    private let connections = Mutex<[ObjectIdentifier: (timer: ConnectionTimer, handle: ConnectionHandle?)]>([:])
    /// Upgraded connections (`UpgradedConnection`), added by the daemon thread when the 101 head
    /// is sent and removed by it when libmicrohttpd closes the connection: `stop` ends them.
    private let upgrades = Mutex<[ObjectIdentifier: UpgradedConnection]>([:])
    /// Suspended requests' connections, watched for their clients leaving (the executor's).
    let requestHangUps = HangUpWatch()
    /// Streaming responses' connections (added and removed by the daemon thread).
    private let streamHangUps = HangUpWatch()
    /// Upgraded connections on a TLS listener, whose clients leaving libmicrohttpd's relay does
    /// not pass on (`UpgradedConnection.clientLeft`); added and removed by the daemon thread.
    private let upgradeHangUps = HangUpWatch()
    /// Connections suspended or resumed but not yet answered (see `ServerCore.admit`).
    private let admissions = Atomic<Int>(0)
    /// Handler tasks started and not yet ended (a task answered for by the server may run on,
    /// cancelled, until it notices): `stop` waits for none before the executors may go away.
    private let runningTasks = Atomic<Int>(0)
    /// Handlers' answers queued on this thread's connections and not yet sent (written by
    /// this shard's daemon thread only; `stop` reads it).
    private let unsentAnswers = Atomic<Int>(0)
    private let hangUpCount = Atomic<Int>(0)
    /// Connections refused past `connectionLimit`, and libmicrohttpd's messages about clients
    /// that left mid-exchange, since the watchdog last logged them.
    private let refusedSinceLog = Atomic<Int>(0)
    private let departuresSinceLog = Atomic<Int>(0)

    init(index: Int, configuration: ServerConfiguration, answering: @escaping HTTPServer.Answering,
         lifecycle: LifecycleState, connectionCount: SharedCap, quiescence: Quiescence, executor: (any TaskExecutor)?) {
        self.quiescence = quiescence
        self.index = index
        self.configuration = configuration
        self.answering = answering
        self.lifecycle = lifecycle
        self.connectionCount = connectionCount
        self.executor = executor
    }

    func log(_ message: String) {
        configuration.errorLog?(message)
    }
    var inFlightCount: Int { registered.load(ordering: .sequentiallyConsistent) }
    var streamCount: Int { streams.withLock { $0.count } }
    var admitted: Int { admissions.load(ordering: .sequentiallyConsistent) }
    var tasksRunning: Int { runningTasks.load(ordering: .sequentiallyConsistent) }
    var answersUnsent: Int { unsentAnswers.load(ordering: .sequentiallyConsistent) }

    /// A handler's answer was queued on `context`'s connection (the daemon thread).
    func answerQueued(_ context: ConnectionContext) {
        guard !context.answerUnsent else { return }
        context.answerUnsent = true
        unsentAnswers.wrappingAdd(1, ordering: .sequentiallyConsistent)
    }

    /// `context`'s request completed: its answer, if one was queued, is sent (or its connection failed).
    func answerSent(_ context: ConnectionContext) {
        guard context.answerUnsent else { return }
        context.answerUnsent = false
        unsentAnswers.wrappingSubtract(1, ordering: .sequentiallyConsistent)
        quiescence.poke()
    }
    var hangUps: Int { hangUpCount.load(ordering: .relaxed) }

    // MARK: - The daemon thread

    /// Admits a new connection unless `connectionLimit` connections are open already (over
    /// every thread: one shared count, taken per connection).
    func opened(_ timer: ConnectionTimer, handle: ConnectionHandle?) -> Bool {
        guard connectionCount.tryAcquire(limit: max(1, configuration.connectionLimit)) else {
            refusedSinceLog.wrappingAdd(1, ordering: .relaxed)
            return false
        }
        connections.withLock { $0[ObjectIdentifier(timer)] = (timer, handle) }
        return true
    }

    func closed(_ timer: ConnectionTimer) {
        if connections.withLock({ $0.removeValue(forKey: ObjectIdentifier(timer)) }) != nil {
            connectionCount.release()
        }
    }

    /// Reserves a suspension for a complete request; false once the server is closing.
    /// Counts first and checks the lifecycle second, while `stop` moves the lifecycle first and
    /// reads the counts second (both sequentially consistent): a request either sees `closing`
    /// and backs out, or is in the count `stop` reads.
    func admit() -> Bool {
        admissions.wrappingAdd(1, ordering: .sequentiallyConsistent)
        guard lifecycle.current < .closing else {
            withdraw()
            return false
        }
        return true
    }

    /// Gives back an admission the request did not need (it was answered at once), or no longer
    /// needs (its answer was queued).
    func withdraw() {
        admissions.wrappingSubtract(1, ordering: .sequentiallyConsistent)
        quiescence.poke()
    }

    /// The connection no longer waits on its pending request: its response was queued or the request ended.
    func released(_ context: ConnectionContext) {
        guard context.pending != nil else { return }
        context.pending = nil
        withdraw()
    }

    /// A response stream starts: watched for its client leaving and for `stop`.
    func streaming(_ stream: StreamingResponse) {
        streams.withLock { $0[ObjectIdentifier(stream)] = stream }
        streamHangUps.watch(stream, on: stream.timer)
    }

    /// An upgraded connection starts (the daemon thread, in libmicrohttpd's upgrade callback).
    func upgradeStarted(_ connection: UpgradedConnection) {
        upgrades.withLock { $0[ObjectIdentifier(connection)] = connection }
        if let timer = connection.hangUpTimer { upgradeHangUps.watch(connection, on: timer) }
    }

    /// libmicrohttpd closed an upgraded connection (the daemon thread, its close notification).
    func upgradeEnded(_ connection: UpgradedConnection) {
        _ = upgrades.withLock { $0.removeValue(forKey: ObjectIdentifier(connection)) }
        if let timer = connection.hangUpTimer { upgradeHangUps.unwatch(connection, on: timer) }
        connection.releaseRelayEnd()
        quiescence.poke()
    }

    /// Upgraded connections still open.
    var upgradeCount: Int { upgrades.withLock { $0.count } }
    var upgradedConnections: [UpgradedConnection] { upgrades.withLock { Array($0.values) } }

    /// A response stream's request completed (or its connection closed).
    func streamEnded(_ stream: StreamingResponse) {
        _ = streams.withLock { $0.removeValue(forKey: ObjectIdentifier(stream)) }
        streamHangUps.unwatch(stream, on: stream.timer)
        quiescence.poke()
    }

    /// Runs `work` in a task on this thread's executor for a request whose connection is
    /// suspended (or still reading a streamed body); the answer resumes the connection.
    func handOver(_ work: @escaping HTTPServer.Work, requestID: String?, deadline: ContinuousClock.Instant,
                  isHead: Bool, suspension: Suspension, context: ConnectionContext) {
        let timer = context.timer
        let pending = PendingResponse(suspension: suspension, deadline: deadline, isHead: isHead,
                                      requestID: requestID) { [self] pending in
            completed(pending, timer: timer)
        }
        context.pending = pending
        runningTasks.wrappingAdd(1, ordering: .relaxed)
        pending.attach(Task(executorPreference: executor) { [self] in
            // Registered on the executor, where it also completes: the registry is the executor's.
            register(pending, timer: timer)
            let response = await work()
            pending.complete(response, byWork: true)
            runningTasks.wrappingSubtract(1, ordering: .sequentiallyConsistent)
            quiescence.poke()
        })
    }

    // MARK: - The paired executor

    /// A suspended request whose handler is about to run: watched for its deadline and, from the
    /// next tick on, for its client leaving.
    private func register(_ pending: PendingResponse, timer: ConnectionTimer) {
        let id = ObjectIdentifier(pending)
        requests.withLock { requests in
            // Answered before its task started (its client left mid-upload, or `stop`): `completed` came first.
            guard !pending.isOver else { return }
            requests.inFlight[id] = pending
            requests.unwatchedNew[id] = (pending, timer)
            registered.wrappingAdd(1, ordering: .relaxed)
        }
        // A `stop` past its grace answers what is registered: this one is, now.
        quiescence.poke()
    }

    private func completed(_ pending: PendingResponse, timer: ConnectionTimer) {
        let id = ObjectIdentifier(pending)
        let watched = requests.withLock { requests in
            if requests.inFlight.removeValue(forKey: id) != nil { registered.wrappingSubtract(1, ordering: .relaxed) }
            return requests.unwatchedNew.removeValue(forKey: id) == nil && requests.unwatchedOld.removeValue(forKey: id) == nil
        }
        if watched { requestHangUps.unwatch(pending, on: timer) }
        quiescence.poke()
    }

    /// The watchdog, on the paired executor: answers requests whose handlers overrun their
    /// deadline (a little grace lets a handler's own, more specific timeout answer win), notices
    /// clients that left, and every half second disconnects clients too slow to deliver a head or body.
    func watch() async {
        let interval = Duration.milliseconds(50)
        let grace = Duration.milliseconds(250)
        var tick = 0
        while !Task.isCancelled {
            do { try await Task.sleep(for: interval) } catch { return }
            tick += 1
            cancelDeparted()
            if tick % 10 == 0 { expireSlowConnections() }
            // Nothing in flight: nothing to watch, no lock to take.
            guard registered.load(ordering: .relaxed) > 0 else { continue }
            watchLingering()
            let now = ContinuousClock.now
            let overdue = requests.withLock { requests in
                requests.inFlight.values.filter { now > $0.deadline.advanced(by: grace) }
            }
            for pending in overdue {
                pending.complete(configuration.refusalResponse(.deadlineExceeded, nil, pending.requestID))
            }
        }
    }

    /// Puts the requests that have waited a whole tick into the hang-up watch. A client that
    /// leaves is then noticed within two ticks (100 ms) instead of one.
    private func watchLingering() {
        let lingering = requests.withLock { requests in
            defer {
                requests.unwatchedOld = requests.unwatchedNew
                requests.unwatchedNew = [:]
            }
            return requests.unwatchedOld.values
        }
        for (pending, timer) in lingering { requestHangUps.watch(pending, on: timer) }
    }

    /// Ends the work of exchanges whose clients have left while libmicrohttpd was not looking
    /// (`HangUpWatch`): a request's task is cancelled, a response stream's source told.
    private func cancelDeparted() {
        var cancelled = 0
        for (listener, timer) in requestHangUps.departed() + streamHangUps.departed() + upgradeHangUps.departed() where listener.clientLeft(timer: timer) {
            cancelled += 1
        }
        guard cancelled > 0 else { return }
        hangUpCount.wrappingAdd(cancelled, ordering: .relaxed)
        departuresSinceLog.wrappingAdd(cancelled, ordering: .relaxed)
    }

    private func expireSlowConnections() {
        let now = ContinuousClock.now
        let timers = connections.withLock { $0.values.map(\.timer) }
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
        let refused = refusedSinceLog.exchange(0, ordering: .relaxed)
        let departures = departuresSinceLog.exchange(0, ordering: .relaxed)
        if refused > 0 {
            log("closed \(refused) new connection(s) at once: \(configuration.connectionLimit) connections open (the connection limit)")
        }
        if departures > 0 {
            log("\(departures) connection error(s): clients closed or reset connections mid-request or mid-response")
        }
    }

    // MARK: - Stopping (any thread)

    /// Requests in flight, and streams being sent.
    func inFlight() -> (requests: [PendingResponse], streams: [StreamingResponse]) {
        (requests.withLock { Array($0.inFlight.values) }, streams.withLock { Array($0.values) })
    }

    /// After the daemon stopped: connections it closed without a close notification keep no descriptor of ours.
    func forgetConnections() {
        let timers = connections.withLock { connections in
            defer { connections.removeAll() }
            return connections.values.map(\.timer)
        }
        for timer in timers {
            timer.markClosed()
            connectionCount.release()
        }
    }

    // MARK: - libmicrohttpd's messages (the daemon thread)

    /// libmicrohttpd's messages about a client that went away come one (or two) per connection,
    /// and some quote the request target: a flood of dropped connections would be a flood of log
    /// lines. They are counted and summarized every half second instead.
    func libraryLog(_ message: String) {
        if ServerCore.clientDepartures.contains(where: { message.hasPrefix($0) }) {
            departuresSinceLog.wrappingAdd(1, ordering: .relaxed)
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
        let handles = connections.withLock { $0.values.compactMap(\.handle) }
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
}
