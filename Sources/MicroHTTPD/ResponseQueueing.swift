import CMicroHTTPD

#if canImport(Glibc)
import Glibc
#endif

// Turning a `ServerResponse` into libmicrohttpd's response and queueing it on its connection
// (fitted to the connection's memory; buffered, streamed or an upgrade), for the callbacks in
// `Callbacks.swift`. Called on the connection's daemon thread only.

/// `response`, or a 502 when its head would not fit in the connection memory its request's head
/// left: libmicrohttpd would close the connection without a word.
func fitted(_ response: ServerResponse, after request: RequestInProgress?, core: DaemonShard) -> ServerResponse {
    let limits = core.configuration
    // libmicrohttpd keeps a record of about 56 bytes per request field; 4 KiB for the rest.
    let used = (request?.headBytes ?? 0) + (request?.headers.count ?? 0) * 64 + 4096
    var head = 64  // status line and Content-Length
    for (name, value) in response.headers { head += name.utf8.count + value.utf8.count + 4 }
    guard head > limits.connectionMemoryBytes - used else { return response }
    if case .upgrade(let handler) = response.payload { handler.abandoned() }
    core.log("a response head of \(head) bytes does not fit in the \(limits.connectionMemoryBytes - used) bytes of connection "
             + "memory its request left (listen.max_header_bytes sets it): answered 502")
    return limits.refusalResponse(.responseHeadTooLarge, nil, nil)
}

/// Builds the libmicrohttpd response and queues it. Every C call's result is checked.
func queue(_ response: ServerResponse, on connection: OpaquePointer, isHead: Bool, draining: Bool,
                   context: ConnectionContext, core: DaemonShard) -> MHD_Result {
    var status = response.status
    var payload = response.payload
    if !(100...599).contains(status) {
        status = 502
        payload = .bytes(Array("invalid response status\n".utf8))
    }
    if case .stream(let source, _) = response.payload, isHead || !(100...599).contains(response.status) {
        // Never read: a HEAD answer carries only the length.
        source.close(delivered: true)
    }
    if case .upgrade(let handler) = payload {
        return queueUpgrade(status: status, headers: response.headers, handler: handler, on: connection,
                            context: context, core: core)
    }
    let mhdResponse: OpaquePointer?
    var streaming: StreamingResponse?
    if isHead, let length = response.headContentLength {
        mhdResponse = portico_mhd_create_head_response(length)
    } else if case .stream(let source, let length) = payload, let suspension = context.suspension {
        let stream = StreamingResponse(source: source, length: length, suspension: suspension, timer: context.timer)
        let retained = Unmanaged.passRetained(stream)
        // A known length is sent from a 64 KiB buffer of the response's own; a chunked body from
        // the connection's write buffer (what its memory pool has left).
        mhdResponse = portico_mhd_create_stream_response(length == nil ? 0 : 1, length ?? 0, 64 * 1024,
                                                         streamingReader, retained.toOpaque(), streamingRelease)
        if mhdResponse == nil {
            retained.release()
            source.close(delivered: false)
        }
        streaming = stream
    } else {
        mhdResponse = makeResponse(payload)
    }
    guard let mhdResponse else { return portico_no }
    defer { MHD_destroy_response(mhdResponse) }
    for (name, value) in response.headers {
        // libmicrohttpd frames the body itself.
        if ServerResponse.isFramingField(name) { continue }
        // Explicit C strings: passing a String directly copies a short one to the heap first.
        let added = name.withCString { name in
            value.withCString { value in MHD_add_response_header(mhdResponse, name, value) }
        }
        if added == portico_no {
            // libmicrohttpd refuses names or values with CR/LF and the like: never send them.
            continue
        }
    }
    if response.closeConnection || draining {
        _ = MHD_add_response_header(mhdResponse, "Connection", "close")
    }
    let queued = MHD_queue_response(connection, UInt32(status), mhdResponse)
    if let streaming, queued == portico_yes {
        context.streaming = streaming
        core.streaming(streaming)
    }
    return queued
}

/// A libmicrohttpd response holding the body: copied, or for shared bytes, read in place with
/// the owner retained until libmicrohttpd destroys the response.
func makeResponse(_ payload: ServerResponse.Payload) -> OpaquePointer? {
    switch payload {
    case .bytes(let bytes):
        // Copied by libmicrohttpd (MUST_COPY), which never writes to the buffer it is given.
        return bytes.withUnsafeBytes { bytes in
            MHD_create_response_from_buffer(bytes.count, UnsafeMutableRawPointer(mutating: bytes.baseAddress),
                                            portico_respmem_must_copy)
        }
    case .shared(let owner):
        return owner.withUnsafeBytes { bytes -> OpaquePointer? in
            guard let base = bytes.baseAddress, !bytes.isEmpty else {
                return MHD_create_response_from_buffer(0, nil, portico_respmem_must_copy)
            }
            let retained = Unmanaged<AnyObject>.passRetained(owner)
            // libmicrohttpd only reads the buffer; its parameter is not const-qualified.
            let response = MHD_create_response_from_buffer_with_free_callback_cls(
                bytes.count, UnsafeMutableRawPointer(mutating: base), releaseSharedBytes, retained.toOpaque())
            if response == nil { retained.release() }
            return response
        }
    case .upgrade(let handler):
        // Handled by `queueUpgrade`; never reached.
        handler.abandoned()
        return MHD_create_response_from_buffer(0, nil, portico_respmem_must_copy)
    case .stream(let source, _):
        // Only without a connection to suspend (cannot happen): nothing to send.
        source.close(delivered: false)
        return MHD_create_response_from_buffer(0, nil, portico_respmem_must_copy)
    }
}

/// libmicrohttpd's free callback for a shared body: drops the response's hold on the owner.
private let releaseSharedBytes: MHD_ContentReaderFreeCallback = { context in
    guard let context else { return }
    Unmanaged<AnyObject>.fromOpaque(context).release()
}

/// Queues a `101 Switching Protocols` whose connection `handler` takes over once the head is sent
/// (`mhdUpgradeHandler`). libmicrohttpd wants `Connection` (with the `upgrade` token) as the
/// response's first header and an `Upgrade` header; it refuses anything else, and the handler
/// then hears `abandoned` and the client a 502.
func queueUpgrade(status: Int, headers: [(name: String, value: String)], handler: any ConnectionUpgradeHandler,
                          on connection: OpaquePointer, context: ConnectionContext, core: DaemonShard) -> MHD_Result {
    let handoff = UpgradeHandoff(handler: handler, shard: core, context: context)
    let hasUpgrade = headers.contains { $0.name.isFieldName("upgrade") }
    guard status == 101, hasUpgrade, let mhdResponse = MHD_create_response_for_upgrade(
        mhdUpgradeHandler, Unmanaged.passUnretained(handoff).toOpaque()) else {
        handler.abandoned()
        core.log("an upgrade response without status 101 or an Upgrade header: answered 500")
        return queue(core.configuration.refusalResponse(.upgradeFailed, nil, nil), on: connection, isHead: false,
                     draining: true, context: context, core: core)
    }
    defer { MHD_destroy_response(mhdResponse) }
    let connectionValue = headers.first { $0.name.isFieldName("connection") }?.value ?? "Upgrade"
    _ = connectionValue.withCString { MHD_add_response_header(mhdResponse, "Connection", $0) }
    for (name, value) in headers where !name.isFieldName("connection") && !ServerResponse.isFramingField(name) {
        _ = name.withCString { name in value.withCString { value in MHD_add_response_header(mhdResponse, name, value) } }
    }
    // Held by the context until the callback runs or the connection ends (libmicrohttpd's
    // response has no free callback to release it with).
    context.upgradeHandoff = handoff
    let queued = MHD_queue_response(connection, UInt32(status), mhdResponse)
    if queued != portico_yes {
        context.upgradeHandoff = nil
        handler.abandoned()
        core.log("libmicrohttpd refused an upgrade response (an HTTP/1.0 client, or no upgrade token): closing the connection")
    }
    return queued
}
