import NIOCore
import NIOPosix
import NIOSSL
import PorticoTesting
@testable import RedisClient
import Testing

/// Against a real `redis-server` of the test's own on a free loopback port.
@Suite("Redis client against redis-server", .enabled(if: RedisServer.available, "redis-server is not installed"))
struct RedisConnectionPoolTests {
    @Test("commands, RESP3 replies and pipelining in order")
    func commands() async throws {
        let server = try await RedisServer.start()
        defer { server.stop() }
        let pool = try RedisConnectionPool(configuration: try server.configuration())
        #expect(try await pool.send(["PING"]) == .simpleString("PONG"))
        #expect(try await pool.send(["SET", "k", .bytes([0, 1, 2])]) == .simpleString("OK"))
        #expect(try await pool.send(["GET", "k"]) == .bulkString([0, 1, 2]))
        #expect(try await pool.send(["GET", "missing"]) == .null)
        _ = try await pool.send(["HSET", "h", "f", "v"])
        // HELLO 3 took: hashes come back as RESP3 maps.
        #expect(try await pool.send(["HGETALL", "h"]) == .map([RESPPair(.bulkString(Array("f".utf8)), .bulkString(Array("v".utf8)))]))
        let replies = try await pool.pipeline((0..<100).map { _ in ["INCR", "n"] })
        #expect(replies == (1...100).map { .integer(Int64($0)) })
        await #expect(throws: RedisError.self) { try await pool.send(["NOSUCHCOMMAND"]) }
        do {
            _ = try await pool.send(["NOSUCHCOMMAND"])
        } catch {
            #expect(error.code == .server)
        }
        await pool.shutdown()
        let after = await Result { () async throws(RedisError) in try await pool.send(["PING"]) }
        #expect(after.failure?.code == .shutdown)
    }

    @Test("a command past its timeout fails alone; the late reply does not shift the next ones")
    func timeout() async throws {
        let server = try await RedisServer.start()
        defer { server.stop() }
        // One loop, so one lane: every command below goes to its one open connection.
        let pool = try RedisConnectionPool(configuration: try server.configuration(), eventLoopGroup: Self.oneLoop)
        _ = try await pool.send(["PING"])
        // The server holds this BLPOP until something is pushed to `empty`, which only happens
        // below, after the call returned: the 50 ms timeout ended it, not the server (no clock
        // to compare with, so no bound a loaded machine could overrun).
        let blocked = await Result { () async throws(RedisError) in try await pool.send(["BLPOP", "empty", "0"], timeout: .milliseconds(50)) }
        #expect(blocked.failure?.code == .timeout)
        // Pipelined behind the blocked command on the one connection (every command goes to the
        // one connection open), answered once the block ends: after the late BLPOP reply.
        let after = Task { try await pool.send(["ECHO", "after"], timeout: .seconds(60)) }
        let other = try RedisConnectionPool(configuration: try server.configuration())
        #expect(try await other.send(["LPUSH", "empty", "late"]) == .integer(1))
        #expect(try await after.value == .bulkString(Array("after".utf8)))
        // The late reply was the BLPOP's (it took the element), read and dropped.
        #expect(try await other.send(["LLEN", "empty"]) == .integer(0))
        await other.shutdown()
        await pool.shutdown()
    }

    static let oneLoop = MultiThreadedEventLoopGroup(numberOfThreads: 1)

    /// The commands waiting on a connection that closes learn it from the close, not from their
    /// deadline: a caller on the connection's loop (a request's task) and one off it alike.
    @Test("a connection closed under a waiting command fails it with a connection error, not a timeout; the next command reconnects")
    func closedUnderWaiter() async throws {
        let server = try await RedisServer.start()
        defer { server.stop() }
        // One lane on one of the test servers' loops, so a task can run on it.
        let loop = TestExecutors.group.next()
        let pool = try RedisConnectionPool(configuration: try server.configuration(), eventLoopGroup: loop)
        let other = try RedisConnectionPool(configuration: try server.configuration())
        for onLoop in [true, false] {
            guard case .integer(let id) = try await pool.send(["CLIENT", "ID"]) else {
                Issue.record("CLIENT ID is not an integer")
                return
            }
            // Blocks its connection until the connection closes. Were the close not to reach it,
            // its deadline would end it, as `.timeout`: two minutes, which no loaded run needs.
            let block = { () async -> Result<RESPValue, RedisError> in
                await Result { () async throws(RedisError) in try await pool.send(["BLPOP", "never", "0"], timeout: .seconds(120)) }
            }
            let waiting = onLoop ? Task(executorPreference: TestExecutors.executor(for: loop), operation: block) : Task(operation: block)
            // Killed once the server holds it (CLIENT LIST names the last command a client ran).
            var blocked = false
            for _ in 0..<3000 where !blocked {
                // A verbatim string over RESP3.
                if try await other.send(["CLIENT", "LIST", "ID", .string(String(id))]).string?.contains("cmd=blpop") == true {
                    blocked = true
                } else {
                    try await Task.sleep(for: .milliseconds(20))
                }
            }
            try #require(blocked, "the BLPOP never reached the server")
            #expect(try await other.send(["CLIENT", "KILL", "ID", .string(String(id))]) == .integer(1))
            let result = await waiting.value
            #expect(result.failure?.code == .connection, "on the loop: \(onLoop): \(result)")
            #expect(try await pool.send(["ECHO", "again"]) == .bulkString(Array("again".utf8)))
        }
        await other.shutdown()
        await pool.shutdown()
    }

    /// What keeps a request's Redis command on its own core: sent from a task on one of the
    /// pool's loops, it goes out on that loop's connection (the server names the connection:
    /// `CLIENT ID`), and other loops' commands on theirs.
    @Test("a command sent from one of the pool's loops goes out on that loop's own connection")
    func perLoop() async throws {
        let server = try await RedisServer.start()
        defer { server.stop() }
        // The test servers' loops (two), which nothing else here sends Redis commands from.
        let loops = TestExecutors.servers
        var configuration = try server.configuration()
        configuration.connections = loops.count
        let pool = try RedisConnectionPool(configuration: configuration, eventLoopGroup: loops.group)
        #expect(pool.connectionsPerLoop == 1)
        var seen: [Int: [RESPValue]] = [:]
        for round in 0..<4 {
            for (index, executor) in loops.executors.enumerated() {
                let id = try await withTaskExecutorPreference(executor) {
                    #expect(loops.currentIndex == index, "round \(round): the task runs on loop \(index)")
                    return try await pool.send(["CLIENT", "ID"])
                }
                seen[index, default: []].append(id)
            }
        }
        let ids = loops.executors.indices.map { seen[$0] ?? [] }
        #expect(ids.allSatisfy { Set($0.compactMap(\.int)).count == 1 }, "each loop kept to one connection: \(ids)")
        #expect(Set(ids.flatMap { $0.compactMap(\.int) }).count == loops.count, "one connection per loop: \(ids)")
        #expect(pool.openConnections == loops.count)
        // Spread, at least one per loop.
        #expect(RedisConnectionPool.connectionsPerLoop(8, loops: 3) == 3)
        #expect(RedisConnectionPool.connectionsPerLoop(2, loops: 8) == 1)
        await pool.shutdown()
    }

    @Test("password, ACL user and database are used; a wrong password is an authentication error without the password")
    func authentication() async throws {
        let server = try await RedisServer.start(password: "s3cret-pw")
        defer { server.stop() }
        var configuration = try server.configuration()
        configuration.database = 2
        let pool = try RedisConnectionPool(configuration: configuration)
        _ = try await pool.send(["SET", "in-two", "1"])
        _ = try await pool.send(["ACL", "SETUSER", "limiter", "on", ">user-pw", "~*", "+@all"])
        var user = try server.configuration()
        user.username = "limiter"
        user.password = "user-pw"
        let userPool = try RedisConnectionPool(configuration: user)
        #expect(try await userPool.send(["ACL", "WHOAMI"]) == .bulkString(Array("limiter".utf8)))
        #expect(try await userPool.send(["EXISTS", "in-two"]) == .integer(0), "database 0 is another one")
        await userPool.shutdown()

        var wrong = try server.configuration()
        wrong.password = "not-the-password"
        let wrongPool = try RedisConnectionPool(configuration: wrong)
        let failure = await Result { () async throws(RedisError) in try await wrongPool.warmUp() }.failure
        #expect(failure?.code == .authentication)
        #expect(failure?.message.contains("WRONGPASS") == true)
        #expect(failure?.message.contains("not-the-password") == false)
        await wrongPool.shutdown()
        await pool.shutdown()
    }

    @Test("an absent server fails fast, is retried after a backoff, and is used again when it returns")
    func reconnect() async throws {
        let server = try await RedisServer.start()
        defer { server.stop() }
        var configuration = try server.configuration()
        configuration.commandTimeout = .seconds(60)
        // Long enough that the loop below sees the wait even on a loaded machine.
        configuration.backoffBase = .seconds(2)
        configuration.backoffCap = .seconds(4)
        let pool = try RedisConnectionPool(configuration: configuration)
        _ = try await pool.send(["SET", "a", "1"])
        await server.kill()
        var kinds: Set<RedisError.Code> = []
        var slowest = Duration.zero
        for _ in 0..<20 {
            let start = ContinuousClock.now
            if let failure = await Result(catching: { () async throws(RedisError) in try await pool.send(["PING"]) }).failure {
                kinds.insert(failure.code)
            }
            slowest = max(slowest, start.duration(to: .now))
        }
        // Far below the 60 s timeout, whatever a loaded machine adds.
        #expect(slowest < .seconds(30), "none waited for the timeout: slowest \(slowest)")
        #expect(kinds.isSubset(of: [.connection, .unavailable]))
        #expect(kinds.contains(.unavailable), "between attempts, commands fail without I/O")
        try await server.launch()
        try await Eventually.wait(timeout: .seconds(20), "the pool to reconnect") {
            (try? await pool.send(["PING"])) == .simpleString("PONG")
        }
        await pool.shutdown()
    }

    /// The refusal must win the race with the command's timeout on any machine, however loaded:
    /// the timeout is far longer than a loopback refusal can take (a 100 ms one lost that race on
    /// a loaded CI machine and failed as `.timeout`).
    @Test("an unreachable server fails a command with a connection error naming it, not after its timeout")
    func unreachable() async throws {
        let refusing = try RefusingPort()
        var configuration = RedisConfiguration(host: "127.0.0.1", port: refusing.port)
        configuration.commandTimeout = .seconds(60)
        let pool = try RedisConnectionPool(configuration: configuration)
        let failure = await Result { () async throws(RedisError) in try await pool.send(["PING"]) }.failure
        #expect(failure?.code == .connection)
        #expect(failure?.message.contains("127.0.0.1:\(refusing.port)") == true)
        await pool.shutdown()
    }

    @Test("EVALSHA falls back to EVAL after the server lost its scripts")
    func scripts() async throws {
        let server = try await RedisServer.start()
        defer { server.stop() }
        let pool = try RedisConnectionPool(configuration: try server.configuration())
        let script = RedisScript("return {KEYS[1], tonumber(ARGV[1]) + 1}")
        let expected = RESPValue.array([.bulkString(Array("k".utf8)), .integer(42)])
        #expect(try await pool.evaluate(script, keys: ["k"], arguments: ["41"]) == expected)
        #expect(try await pool.send(["SCRIPT", "LOAD", .string(script.source)]) == .bulkString(Array(script.sha1.utf8)))
        _ = try await pool.send(["SCRIPT", "FLUSH"])
        #expect(try await pool.evaluate(script, keys: ["k"], arguments: ["41"]) == expected)
        await pool.shutdown()
    }

    @Test("TLS: rediss:// with the server's CA works; without it the handshake fails clearly")
    func tls() async throws {
        let certificates = try await TestCertificates.shared()
        let files = RedisServer.TLSFiles(certificateFile: certificates.server.certificateFile, keyFile: certificates.server.keyFile,
                                         caFile: certificates.ca.certificateFile)
        let server = try await RedisServer.start(tls: files)
        defer { server.stop() }
        let pool = try RedisConnectionPool(configuration: try server.configuration())
        #expect(try await pool.send(["PING"]) == .simpleString("PONG"))
        await pool.shutdown()

        var untrusted = try server.configuration()
        untrusted.tls = TLSConfiguration.makeClientConfiguration()
        let untrustedPool = try RedisConnectionPool(configuration: untrusted)
        let failure = await Result { () async throws(RedisError) in try await untrustedPool.warmUp() }.failure
        #expect(failure?.code == .tls, "\(failure.map { "\($0.code): \($0.message)" } ?? "no failure")")
        await untrustedPool.shutdown()
    }
}

/// A server that speaks only RESP2 (refuses `HELLO`), as Redis 5 does.
@Suite("Redis client with a RESP2 server")
struct RESP2FallbackTests {
    final class FakeRESP2: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        var buffer = ByteBuffer()

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var bytes = unwrapInboundIn(data)
            buffer.writeBuffer(&bytes)
            while let command = try? RESPParser().parse(&buffer), let words = command.array?.compactMap(\.string) {
                let reply: RESPValue = switch words.first?.uppercased() ?? "" {
                case "HELLO": .error("ERR unknown command 'HELLO'")
                case "AUTH": words.last == "old-pw" ? .simpleString("OK") : .error("ERR invalid password")
                case "PING": .simpleString("PONG")
                default: .error("ERR unknown command")
                }
                context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: RESPEncoder.bytes(reply))), promise: nil)
            }
        }
    }

    @Test("HELLO refused: AUTH the RESP2 way, then commands work")
    func fallback() async throws {
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(FakeRESP2()) }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let port = channel.localAddress!.port!
        var configuration = RedisConfiguration(host: "127.0.0.1", port: port)
        configuration.password = "old-pw"
        let pool = try RedisConnectionPool(configuration: configuration)
        #expect(try await pool.send(["PING"]) == .simpleString("PONG"))
        await pool.shutdown()

        configuration.password = "wrong"
        let wrong = try RedisConnectionPool(configuration: configuration)
        let failure = await Result { () async throws(RedisError) in try await wrong.warmUp() }.failure
        #expect(failure?.code == .authentication)
        await wrong.shutdown()
        try await channel.close()
    }
}

extension Result {
    init(catching body: () async throws(Failure) -> Success) async {
        do throws(Failure) {
            self = .success(try await body())
        } catch {
            self = .failure(error)
        }
    }

    var failure: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}
