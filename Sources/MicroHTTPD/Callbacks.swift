import CMicroHTTPD

#if canImport(Glibc)
import Glibc
#endif

// The C callbacks. Each finds its Swift objects through `Unmanaged` context pointers: the
// daemon thread's `DaemonShard` (unretained; the server owns it and outlives the daemon) and the `ConnectionContext` (retained from
// the connection's start notification until its close notification).

private func shard(_ cls: UnsafeMutableRawPointer?) -> DaemonShard {
    Unmanaged<DaemonShard>.fromOpaque(cls!).takeUnretainedValue()
}

private func connectionContext(_ connection: OpaquePointer?) -> ConnectionContext? {
    guard let connection, let raw = portico_mhd_socket_context(connection) else { return nil }
    return Unmanaged<ConnectionContext>.fromOpaque(raw).takeUnretainedValue()
}

/// MHD_OPTION_NOTIFY_CONNECTION: one `ConnectionContext` per connection.
let mhdConnectionNotify: MHD_NotifyConnectionCallback = { cls, connection, socketContext, code in
    guard let socketContext else { return }
    switch code {
    case portico_notify_started:
        var address = [CChar](repeating: 0, count: 64)
        let client = connection.flatMap { connection in
            address.withUnsafeMutableBufferPointer { buffer in
                portico_mhd_client_address(connection, buffer.baseAddress, buffer.count) == 0
                    ? String(cString: buffer.baseAddress!) : nil
            }
        } ?? ""
        let core = shard(cls)
        let socket = connection.map { portico_mhd_connection_fd($0) } ?? -1
        let timer = ConnectionTimer(deadline: .now + core.configuration.headerTimeout)
        let context = ConnectionContext(clientAddress: client, timer: timer, suspension: connection.map { Suspension(connection: $0) },
                                        shard: core)
        let handle = connection.map {
            ConnectionHandle(connection: $0, context: Unmanaged.passUnretained(context), socket: socket, thread: pthread_self())
        }
        guard core.opened(timer, handle: handle) else {
            // Past connection_limit. Without a context every callback turns the connection
            // away; shutting the socket down (ours to touch: we are on its thread, before
            // libmicrohttpd's first read) makes libmicrohttpd close it on that read.
            if socket >= 0 { _ = Glibc.shutdown(socket, Int32(SHUT_RDWR)) }
            return
        }
        timer.watch(socket)
        socketContext.pointee = Unmanaged.passRetained(context).toOpaque()
    case portico_notify_closed:
        guard let raw = socketContext.pointee else { return }
        let context = Unmanaged<ConnectionContext>.fromOpaque(raw).takeRetainedValue()
        if let handoff = context.upgradeHandoff, !handoff.delivered { handoff.handler.abandoned() }
        context.upgradeHandoff = nil
        if let upgraded = context.upgraded {
            context.upgraded = nil
            shard(cls).upgradeEnded(upgraded)
        }
        free(context.relayBuffer)
        context.relayBuffer = nil
        context.suspension?.close()
        context.timer.markClosed()
        let core = shard(cls)
        core.closed(context.timer)
        core.released(context)
        socketContext.pointee = nil
    default:
        break
    }
}

/// MHD_OPTION_URI_LOG_CALLBACK: the raw request target, before libmicrohttpd decodes it.
let mhdURILog: portico_uri_log_callback = { cls, uri, connection in
    guard let context = connectionContext(connection) else { return nil }
    let target = uri.map { String(cString: $0) } ?? "/"
    let now = ContinuousClock.now
    context.request = RequestInProgress(target: target, startedAt: now)
    context.suspension?.reset()
    context.timer.tighten(to: now + shard(cls).configuration.headerTimeout)
    return Unmanaged.passUnretained(context).toOpaque()
}

/// MHD_OPTION_NOTIFY_COMPLETED: the request is over (answered, or the connection failed).
let mhdRequestCompleted: MHD_RequestCompletedCallback = { cls, connection, _, termination in
    guard let context = connectionContext(connection) else { return }
    context.request = nil
    let core = shard(cls)
    core.answerSent(context)
    if let handoff = context.upgradeHandoff, !handoff.delivered {
        // A 101 queued but never sent (the client left first): the handler lets its session go.
        context.upgradeHandoff = nil
        handoff.handler.abandoned()
    }
    if let upload = context.upload {
        // The connection failed mid-body (the client left, or was too slow).
        context.upload = nil
        upload.sink?.fail(.clientGone)
    }
    if let pending = context.pending, !pending.isOver {
        // Its connection is gone while the handler works (a streamed upload cut short): the
        // work is cancelled; there is nothing to resume.
        pending.complete(PendingResponse.abandoned)
    }
    if let streaming = context.streaming {
        context.streaming = nil
        core.streamEnded(streaming)
        streaming.finished(ok: termination == portico_completed_ok)
    }
    // Until the next request line: libmicrohttpd's idle timeout, then the head's own.
    context.timer.arm(.head, until: .now + core.configuration.idleTimeout + core.configuration.headerTimeout)
    core.released(context)
}

/// libmicrohttpd's own error messages.
let mhdLogSink: portico_log_sink = { cls, message in
    guard let message else { return }
    var text = String(cString: message)
    while text.last == "\n" { text.removeLast() }
    shard(cls).libraryLog(text)
}

/// MHD's access handler, called for each step of a request: the head is in, a body chunk, the
/// request is complete, and after a resume, the answer is ready. Each step is one method of
/// `AccessCall`.
let mhdAccessHandler: MHD_AccessHandlerCallback = { cls, connection, url, method, version, uploadData, uploadDataSize, _ in
    guard let connection, let uploadDataSize else { return portico_no }
    let core = shard(cls)
    guard let context = connectionContext(connection) else { return portico_no }

    let request: RequestInProgress
    if let current = context.request {
        request = current
    } else {
        // No URI callback for this request (should not happen): fall back to the decoded url.
        request = RequestInProgress(target: url.map { String(cString: $0) } ?? "/", startedAt: .now)
        context.request = request
    }
    let call = AccessCall(core: core, context: context, connection: connection, request: request,
                          method: method.map { String(cString: $0) } ?? "GET", versionText: version)
    if let pending = context.pending { return call.handedOver(pending, upload: uploadData, size: uploadDataSize) }
    if !request.headersSeen { return call.headReceived() }
    if uploadDataSize.pointee > 0 { return call.bodyChunk(uploadData, size: uploadDataSize) }
    return call.requestComplete()
}

/// One call of the access handler for a request being read, on the connection's own thread.
private struct AccessCall {
    let core: DaemonShard
    let context: ConnectionContext
    let connection: OpaquePointer
    let request: RequestInProgress
    let method: String
    let versionText: UnsafePointer<CChar>?

    var limits: ServerConfiguration { core.configuration }
    var version: String { versionText.map { String(cString: $0) } ?? "HTTP/1.1" }
    var deadline: ContinuousClock.Instant { request.startedAt.advanced(by: limits.requestTimeout) }

    /// First call: the head is complete. Checks it before any body byte is read; a refusal
    /// closes the connection.
    func headReceived() -> MHD_Result {
        request.headersSeen = true
        context.timer.arm(.body, until: deadline)
        let collector = HeaderCollector()
        MHD_get_connection_values_n(connection, portico_header_kind, collectHeader, Unmanaged.passUnretained(collector).toOpaque())
        request.headers = collector.headers
        request.headBytes = method.utf8.count + request.target.utf8.count + 12 + collector.bytes
        if request.headBytes > limits.maxHeaderBytes {
            return refuse(.headTooLarge(limit: limits.maxHeaderBytes))
        }
        if let refusal = RequestHeadRules.problem(version: version, target: request.target, headers: request.headers) {
            return refuse(refusal)
        }
        let declared = request.headers.first(where: { $0.name.isFieldName("content-length") })
            .flatMap { Int($0.value.filter { $0 != " " && $0 != "\t" }) }
        if let declared, declared > limits.maxBodyBytes {
            // Answered before the body is read; libmicrohttpd closes the connection afterwards.
            return refuse(.bodyTooLarge(limit: limits.maxBodyBytes))
        }
        // A large or chunked body streams: the handler is asked now and takes it as it comes.
        let chunked = request.headers.contains { $0.name.isFieldName("transfer-encoding") }
        if chunked || (declared ?? 0) > limits.bufferedBodyBytes {
            return handOverStreamed(length: chunked ? nil : declared)
        }
        return portico_yes
    }

    /// Hands a request whose body streams to the handler as soon as its head is in. The body
    /// then goes to the sink the handler returns, chunk by chunk as libmicrohttpd reads it;
    /// the connection is parked while the sink is full.
    private func handOverStreamed(length: Int?) -> MHD_Result {
        let isHead = method == "HEAD"
        guard let suspension = context.suspension, core.admit() else {
            return queue(limits.refusalResponse(.shuttingDown, nil, nil), on: connection, isHead: isHead, draining: true,
                         context: context, core: core)
        }
        let serverRequest = ServerRequest(method: method, target: request.target, version: version, headers: request.headers,
                                          clientAddress: context.clientAddress, streamedBody: .init(length: length),
                                          deadline: deadline, thread: core.index)
        let timer = context.timer
        let silence = limits.requestTimeout
        switch core.answering(serverRequest) {
        case .now(let response) where response.closeConnection:
            // Refused with the connection closed (a declared body too large for its route): queued
            // now, before a byte of the body is read; libmicrohttpd closes the connection after it.
            core.withdraw()
            return queue(response, on: connection, isHead: isHead, draining: true, context: context, core: core)
        case .now(let response):
            // Answered at once (no route, a refusal, a direct answer): the body is still read,
            // and dropped, before the answer is queued, as a client that is still sending would
            // otherwise see its connection reset before it reads the answer (and keep-alive is kept).
            let answered = PendingResponse(suspension: suspension, deadline: .now + silence, isHead: isHead,
                                           requestID: nil) { _ in }
            answered.complete(response)
            context.pending = answered
            context.upload = Upload(sink: nil) {}
            timer.arm(.body, until: .now + silence)
            return portico_yes
        case .later(let work, let requestID, let sink):
            // The handler's deadline counts from the body's end (`handedOver`); until then the
            // body must keep up `Upload.minimumRate` after a first `requestTimeout`.
            context.upload = Upload(sink: sink) {
                timer.arm(.body, until: .now + silence)
                suspension.resume()
            }
            timer.arm(.body, until: .now + silence)
            handOver(work, requestID: requestID, deadline: .now + .seconds(365 * 86_400), isHead: isHead, suspension: suspension)
            return portico_yes
        }
    }

    /// A call for a request already handed to its handler: the next piece of a streamed body,
    /// the body's end, or (after a wake) the handler's answer.
    func handedOver(_ pending: PendingResponse, upload data: UnsafePointer<CChar>?,
                    size: UnsafeMutablePointer<Int>) -> MHD_Result {
        if let upload = context.upload {
            if size.pointee > 0 { return uploadChunk(upload, pending: pending, data: data, size: size) }
            // The body is complete.
            context.upload = nil
            upload.sink?.finish()
            context.timer.arm(.body, until: nil)
            pending.deadline = .now + limits.requestTimeout
        }
        if let response = pending.response {
            // Counted unsent before it stops counting as admitted: `stop` reads them in that order.
            core.answerQueued(context)
            core.released(context)
            let queued = queue(fitted(response, after: context.request, core: core), on: connection, isHead: pending.isHead,
                               draining: core.lifecycle.isDraining, context: context, core: core)
            if queued != portico_yes { core.answerSent(context) }
            return queued
        }
        // Waiting for the answer; a wake that came first makes libmicrohttpd call again at once.
        context.suspension?.suspend()
        return portico_yes
    }

    /// A piece of a streamed body: counted against `maxBodyBytes` and passed to the sink;
    /// the connection is parked while the sink is full.
    private func uploadChunk(_ upload: Upload, pending: PendingResponse, data: UnsafePointer<CChar>?,
                             size: UnsafeMutablePointer<Int>) -> MHD_Result {
        let count = size.pointee
        upload.received += count
        if upload.received > limits.maxBodyBytes {
            // Cut as it flows: the connection is closed, and the handler's stream fails.
            upload.sink?.fail(.tooLarge(limit: limits.maxBodyBytes))
            upload.sink = nil
            core.log("request body over \(limits.maxBodyBytes) bytes: closing the connection")
            return portico_no
        }
        size.pointee = 0
        // Once the handler has answered (or stopped reading), the rest is read and dropped:
        // libmicrohttpd queues an answer only after the whole request.
        guard let sink = upload.sink, pending.response == nil, let data else {
            upload.sink = nil
            context.timer.arm(.body, until: upload.deadline(requestTimeout: limits.requestTimeout))
            return portico_yes
        }
        switch sink.write(UnsafeRawBufferPointer(start: data, count: count), resume: upload.resume) {
        case .accepted:
            context.timer.arm(.body, until: upload.deadline(requestTimeout: limits.requestTimeout))
        case .full:
            // Not the client's slowness: no body deadline while parked (`resume` re-arms one).
            upload.park()
            context.timer.arm(.body, until: nil)
            context.suspension?.suspend()
        case .closed:
            upload.sink = nil
        }
        return portico_yes
    }

    /// A chunk of the body: buffered up to `maxBodyBytes`.
    func bodyChunk(_ data: UnsafePointer<CChar>?, size: UnsafeMutablePointer<Int>) -> MHD_Result {
        let count = size.pointee
        if request.body.count + count > limits.maxBodyBytes {
            // A chunked body over the limit: stop reading and close; nothing more is buffered.
            request.body = []
            core.log("request body over \(limits.maxBodyBytes) bytes: closing the connection")
            return portico_no
        }
        if let data {
            data.withMemoryRebound(to: UInt8.self, capacity: count) { bytes in
                request.body.append(contentsOf: UnsafeBufferPointer(start: bytes, count: count))
            }
        }
        size.pointee = 0
        return portico_yes
    }

    /// The request is complete: answered at once, or the connection is suspended while a task
    /// runs the handler's work.
    func requestComplete() -> MHD_Result {
        let isHead = method == "HEAD"
        let serverRequest = ServerRequest(method: method, target: request.target, version: version, headers: request.headers,
                                          clientAddress: context.clientAddress, body: request.body, deadline: deadline,
                                          thread: core.index)
        request.body = []
        // Counted as suspended before it is: `stop` must never find none while one is being
        // suspended. Admitted before the handler runs, so work it returns is always run.
        guard let suspension = context.suspension, core.admit() else {
            // `stop` is past its grace: MHD_stop_daemon aborts on a suspended connection, so answer now.
            return queue(limits.refusalResponse(.shuttingDown, nil, nil), on: connection, isHead: isHead, draining: true,
                         context: context, core: core)
        }
        let work: HTTPServer.Work
        let requestID: String?
        switch core.answering(serverRequest) {
        case .now(let response):
            core.withdraw()
            return queue(fitted(response, after: request, core: core), on: connection, isHead: isHead,
                         draining: core.lifecycle.isDraining, context: context, core: core)
        case .later(let later, let id, _):
            work = later
            requestID = id
        }
        context.timer.arm(.body, until: nil)  // the handler's deadline is watched as an in-flight request
        suspension.suspend()
        handOver(work, requestID: requestID, deadline: serverRequest.deadline, isHead: isHead, suspension: suspension)
        return portico_yes
    }

    /// Runs `work` in a task for this request, answered by the server instead past `deadline`
    /// (the watchdog) or when the client leaves (libmicrohttpd does not poll a suspended
    /// connection: it is watched for here).
    private func handOver(_ work: @escaping HTTPServer.Work, requestID: String?,
                          deadline: ContinuousClock.Instant, isHead: Bool, suspension: Suspension) {
        core.handOver(work, requestID: requestID, deadline: deadline, isHead: isHead, suspension: suspension,
                      context: context)
    }

    /// Answers a request refused once its head is read, giving the renderer the head as received.
    private func refuse(_ refusal: ServerRefusal) -> MHD_Result {
        let received = ServerRequest(method: method, target: request.target, version: version, headers: request.headers,
                                     clientAddress: context.clientAddress, deadline: deadline, thread: core.index)
        return queue(limits.refusalResponse(refusal, received, nil), on: connection, isHead: false, draining: true,
                     context: context, core: core)
    }
}

/// Collects request headers in order, duplicates kept.
private final class HeaderCollector {
    var headers: [(name: String, value: String)] = []
    var bytes = 0
}

private let collectHeader: MHD_KeyValueIteratorN = { cls, _, key, keySize, value, valueSize in
    let collector = Unmanaged<HeaderCollector>.fromOpaque(cls!).takeUnretainedValue()
    let name = key.map { String(decoding: UnsafeRawBufferPointer(start: $0, count: keySize), as: UTF8.self) } ?? ""
    let text = value.map { String(decoding: UnsafeRawBufferPointer(start: $0, count: valueSize), as: UTF8.self) } ?? ""
    collector.headers.append((name, text))
    collector.bytes += keySize + valueSize + 4
    return portico_yes
}
