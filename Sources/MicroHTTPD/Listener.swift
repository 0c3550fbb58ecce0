import CMicroHTTPD
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The listening socket, and one thread that accepts on it and deals the connections to
/// libmicrohttpd daemons in turn with `MHD_add_connection`.
///
/// Why not let libmicrohttpd accept: every thread of its pool polls the one listening socket,
/// and whichever wakes first takes the whole burst, so a client opening 32 connections at once
/// often had all of them served by one thread while the other idled (measured: 299 CPU ticks
/// against 0). Dealt in turn, each daemon's thread gets its share. With no listening socket
/// inside libmicrohttpd, stopping needs no `MHD_quiesce_daemon` either, and new connections are
/// refused the moment the socket closes.
final class Listener: Sendable {
    /// The listening socket (non-blocking), open until `stop`.
    let socket: Int32
    /// The address it is bound to, as configured, and the port (the kernel's pick for port 0).
    let address: String
    let port: UInt16
    /// A pipe `stop` writes to, to wake the accepting thread.
    private let wake: (read: Int32, write: Int32)
    private let state = Mutex<(thread: pthread_t?, closed: Bool)>((nil, false))

    /// Binds and listens on `address:port` (port 0: the kernel picks one).
    init(address: String, port: UInt16, backlog: Int) throws(MicroHTTPDError) {
        var storage = sockaddr_storage()
        let length = withUnsafeMutableBytes(of: &storage) { raw in
            Self.fillSocketAddress(address, port: port, into: raw)
        }
        guard let length else { throw .invalidAddress(address) }
        func failure(_ step: String) -> MicroHTTPDError {
            .startFailed(address: address, port: port, detail: "\(step): \(String(cString: strerror(errno)))")
        }
        let fd = Glibc.socket(Int32(storage.ss_family), Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue)
                              | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw failure("socket") }
        // SO_REUSEADDR: a restart binds at once despite connections in TIME_WAIT. Not
        // SO_REUSEPORT: a second gateway on the same port must fail, not silently share it.
        // An IPv6 address serves IPv6 only, as libmicrohttpd's own listener did.
        var on: Int32 = 1
        let optionSize = socklen_t(MemoryLayout<Int32>.size)
        let isIPv6 = storage.ss_family == sa_family_t(AF_INET6)
        let bound = withUnsafePointer(to: &storage) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, optionSize) == 0
                    && (!isIPv6 || setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &on, optionSize) == 0)
                    && bind(fd, address, length) == 0
            }
        }
        guard bound else {
            let error = failure("bind")
            close(fd)
            throw error
        }
        guard listen(fd, Int32(clamping: max(1, backlog))) == 0 else {
            let error = failure("listen")
            close(fd)
            throw error
        }
        var actual = sockaddr_storage()
        var actualLength = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &actual) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &actualLength) }
        }
        var pipeFDs: [Int32] = [-1, -1]
        guard pipe(&pipeFDs) == 0 else {
            let error = failure("pipe")
            close(fd)
            throw error
        }
        for descriptor in pipeFDs { _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC) }
        self.socket = fd
        self.address = address
        self.wake = (pipeFDs[0], pipeFDs[1])
        self.port = Self.port(of: actual)
    }

    /// Starts the thread that accepts and deals connections to `daemons` in turn; `log` gets
    /// the failures worth an operator's attention (out of descriptors).
    func start(handingTo daemons: [OpaquePointer], log: @escaping @Sendable (String) -> Void) throws(MicroHTTPDError) {
        let work = AcceptLoop(listener: self, daemons: daemons, log: log)
        var thread = pthread_t()
        let context = Unmanaged.passRetained(work).toOpaque()
        let started = pthread_create(&thread, nil, { context in
            let work = Unmanaged<AcceptLoop>.fromOpaque(context!).takeRetainedValue()
            work.run()
            return nil
        }, context)
        guard started == 0 else {
            Unmanaged<AcceptLoop>.fromOpaque(context).release()
            throw .startFailed(address: address, port: port,
                               detail: "unable to start the accepting thread: \(String(cString: strerror(started)))")
        }
        state.withLock { $0.thread = thread }
    }

    /// Stops accepting: wakes the thread and waits for it, hands what the kernel already queued
    /// to `daemons` (those clients connected before the stop), then closes the socket, so new
    /// connections are refused from here on. Without daemons (they failed to start) the socket
    /// is just closed. Idempotent.
    func stop(handingTo daemons: [OpaquePointer]) {
        let (thread, wasClosed) = state.withLock { state in
            defer { state = (nil, true) }
            return state
        }
        guard !wasClosed else { return }
        if let thread {
            var byte: UInt8 = 1
            _ = write(wake.write, &byte, 1)
            pthread_join(thread, nil)
        }
        if !daemons.isEmpty { AcceptLoop(listener: self, daemons: daemons, log: { _ in }).acceptQueued() }
        close(socket)
        close(wake.read)
        close(wake.write)
    }

    /// Polls the socket and the wake-up descriptor; accepts until the queue is empty.
    private final class AcceptLoop: Sendable {
        let listener: Listener
        let daemons: Daemons
        let log: @Sendable (String) -> Void
        /// The daemon the next connection goes to.
        private let next = Atomic<Int>(0)
        /// Out of descriptors since the last accept: said once, and again when it is over.
        private let paused = Atomic<Bool>(false)

        /// libmicrohttpd's daemons. Sendable because the one call made on them here,
        /// `MHD_add_connection`, may come from any thread: each daemon runs its own thread and
        /// is woken through its inter-thread channel (MHD_USE_ITC), and `stop` joins this
        /// thread before the daemons are stopped.
        struct Daemons: @unchecked Sendable {
            let pointers: [OpaquePointer]
        }

        init(listener: Listener, daemons: [OpaquePointer], log: @escaping @Sendable (String) -> Void) {
            self.listener = listener
            self.daemons = Daemons(pointers: daemons)
            self.log = log
        }

        func run() {
            var fds = [pollfd(fd: listener.socket, events: Int16(POLLIN), revents: 0),
                       pollfd(fd: listener.wake.read, events: Int16(POLLIN), revents: 0)]
            while true {
                if poll(&fds, 2, -1) < 0 {
                    if errno == EINTR { continue }
                    log("accepting stopped: poll failed: \(String(cString: strerror(errno)))")
                    return
                }
                if fds[1].revents != 0 { return }
                if fds[0].revents != 0, !acceptQueued() {
                    // Out of descriptors: the connection stays queued; try again shortly
                    // rather than spin on a socket that stays readable.
                    var wakeOnly = fds[1]
                    _ = poll(&wakeOnly, 1, 50)
                    if wakeOnly.revents != 0 { return }
                }
            }
        }

        /// Accepts every queued connection; false when the process is out of descriptors (or
        /// buffers), which the caller waits out.
        @discardableResult
        func acceptQueued() -> Bool {
            while true {
                var address = sockaddr_storage()
                var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
                let client = withUnsafeMutablePointer(to: &address) { pointer in
                    pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        accept(listener.socket, $0, &length)
                    }
                }
                if client < 0 {
                    let code = errno
                    switch code {
                    case EINTR, ECONNABORTED, EPROTO: continue
                    case EAGAIN, EWOULDBLOCK: return true  // the queue is empty
                    default:
                        // Out of descriptors or memory (or anything unexpected): the connection
                        // stays queued, and the caller waits before trying again.
                        if !paused.exchange(true, ordering: .relaxed) {
                            var advice = ""
                            if code == EMFILE || code == ENFILE { advice = " (raise the descriptor limit or lower listen.connection_limit)" }
                            log("accepting paused: \(String(cString: strerror(code))); new connections wait in the backlog\(advice)")
                        }
                        return false
                    }
                }
                if paused.exchange(false, ordering: .relaxed) { log("accepting resumed") }
                _ = fcntl(client, F_SETFD, FD_CLOEXEC)
                // libmicrohttpd makes it non-blocking, and closes it itself when it cannot take it.
                let turn = next.wrappingAdd(1, ordering: .relaxed).oldValue
                let daemon = daemons.pointers[(turn & Int.max) % daemons.pointers.count]
                _ = withUnsafePointer(to: &address) { pointer in
                    pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        MHD_add_connection(daemon, client, $0, length)
                    }
                }
            }
        }
    }

    /// Parses an IPv4 or IPv6 literal into a socket address; returns its length, or nil.
    private static func fillSocketAddress(_ address: String, port: UInt16, into raw: UnsafeMutableRawBufferPointer) -> socklen_t? {
        let host = address.hasPrefix("[") && address.hasSuffix("]") ? String(address.dropFirst().dropLast()) : address
        if host.contains(":") {
            var sin6 = sockaddr_in6()
            sin6.sin6_family = sa_family_t(AF_INET6)
            sin6.sin6_port = port.bigEndian
            guard inet_pton(AF_INET6, host, &sin6.sin6_addr) == 1 else { return nil }
            withUnsafeBytes(of: &sin6) { raw.copyMemory(from: $0) }
            return socklen_t(MemoryLayout<sockaddr_in6>.size)
        }
        var sin = sockaddr_in()
        sin.sin_family = sa_family_t(AF_INET)
        sin.sin_port = port.bigEndian
        guard inet_pton(AF_INET, host, &sin.sin_addr) == 1 else { return nil }
        withUnsafeBytes(of: &sin) { raw.copyMemory(from: $0) }
        return socklen_t(MemoryLayout<sockaddr_in>.size)
    }

    private static func port(of storage: sockaddr_storage) -> UInt16 {
        let family = storage.ss_family
        return withUnsafeBytes(of: storage) { raw in
            if family == sa_family_t(AF_INET6) {
                return UInt16(bigEndian: raw.load(as: sockaddr_in6.self).sin6_port)
            }
            return UInt16(bigEndian: raw.load(as: sockaddr_in.self).sin_port)
        }
    }
}
