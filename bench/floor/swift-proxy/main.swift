// The floor under Portico's `nio` transport in Swift: Portico's own libmicrohttpd server
// (`MicroHTTPD`, as the gateway runs it: one daemon per core, each request's task on an event
// loop) and a keep-alive HTTP/1.1 client on SwiftNIO's codecs on that same loop, with none of the
// gateway between them: no routing, no header rewriting or validation, no middleware, metrics,
// logs or request ids. It forwards a fixed GET and answers with the upstream's status and body.
// bench/cpu --floors runs it beside bench/floor's C programs and Portico.
//
//   portico-proxy-floor PORT UPSTREAM_PORT
import MicroHTTPD
import NIOCore
import NIOHTTP1
import NIOPosix

let arguments = CommandLine.arguments
guard arguments.count == 3, let port = UInt16(arguments[1]), let upstreamPort = Int(arguments[2]) else {
    print("usage: portico-proxy-floor PORT UPSTREAM_PORT")
    exit(2)
}

/// Runs a task's jobs on one event loop (as Portico's `EventLoopTaskExecutor`).
final class LoopExecutor: TaskExecutor {
    let eventLoop: any EventLoop
    init(_ eventLoop: any EventLoop) { self.eventLoop = eventLoop }
    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        eventLoop.execute { [self] in job.runSynchronously(on: asUnownedTaskExecutor()) }
    }
}

/// The last handler of an upstream connection: completes the waiting promise with each response.
final class ResponseHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPClientResponsePart
    var waiting: EventLoopPromise<(Int, ByteBuffer)>?
    var status = 0
    var body = ByteBuffer()

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            status = Int(head.status.code)
            body.clear()
        case .body(var part):
            body.writeBuffer(&part)
        case .end:
            let promise = waiting
            waiting = nil
            promise?.succeed((status, body))
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        waiting?.fail(ChannelError.ioOnClosedChannel)
        waiting = nil
    }
}

/// Idle upstream connections of one event loop.
final class LoopPool: @unchecked Sendable {  // `idle` is only touched on `eventLoop` (asserted in `exchange`).
    let eventLoop: any EventLoop
    let upstreamPort: Int
    var idle: [any Channel] = []
    init(_ eventLoop: any EventLoop, upstreamPort: Int) {
        self.eventLoop = eventLoop
        self.upstreamPort = upstreamPort
    }

    /// One GET on an idle connection of this loop (or a new one); on this loop.
    func exchange() -> EventLoopFuture<(Int, ByteBuffer)> {
        eventLoop.preconditionInEventLoop()
        let promise = eventLoop.makePromise(of: (Int, ByteBuffer).self)
        let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: "/",
                                   headers: ["Host": "127.0.0.1:\(upstreamPort)", "User-Agent": "portico-proxy-floor"])
        let connection: EventLoopFuture<any Channel>
        if let channel = idle.popLast() {
            connection = eventLoop.makeSucceededFuture(channel)
        } else {
            connection = ClientBootstrap(group: eventLoop)
                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHTTPClientHandlers()
                        try channel.pipeline.syncOperations.addHandler(ResponseHandler())
                    }
                }
                .connect(host: "127.0.0.1", port: upstreamPort)
        }
        connection.assumeIsolated().whenComplete { result in
            switch result {
            case .success(let channel):
                do {
                    try channel.pipeline.syncOperations.handler(type: ResponseHandler.self).waiting = promise
                } catch {
                    promise.fail(error)
                    return
                }
                channel.write(HTTPClientRequestPart.head(head), promise: nil)
                channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
                promise.futureResult.assumeIsolated().whenSuccess { _ in self.idle.append(channel) }
            case .failure(let error):
                promise.fail(error)
            }
        }
        return promise.futureResult
    }
}

let loops = Array(MultiThreadedEventLoopGroup.singleton.makeIterator())
let executors = loops.map(LoopExecutor.init)
let pools = loops.map { LoopPool($0, upstreamPort: upstreamPort) }

var configuration = ServerConfiguration()
configuration.address = "127.0.0.1"
configuration.port = port
configuration.threads = loops.count
configuration.taskExecutors = executors
let server = HTTPServer(configuration: configuration) { (_: ServerRequest) -> HTTPServer.Answer in
    .later {
        guard let loop = MultiThreadedEventLoopGroup.currentEventLoop,
              let pool = pools.first(where: { $0.eventLoop === loop }),
              let (status, body) = try? await pool.exchange().get() else {
            return ServerResponse(status: 502)
        }
        return ServerResponse(status: status, headers: [("Content-Type", "application/json")], body: Array(body.readableBytesView))
    }
}
_ = try server.start()
while true { try await Task.sleep(for: .seconds(3600)) }
