// swift-tools-version:6.1
import PackageDescription

let strict: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
]

/// How the release `portico` is linked on Linux (measured in bench/RESULTS.md, session 12; 33
/// MB of text, of which a running gateway executes ≈ 1.5 MB):
/// - lld, the linker Swift toolchains ship, for the two options below (gold has neither);
/// - the functions a running gateway executes first, in scripts/link-order.txt's order
///   (scripts/link-order writes it): the kernel maps code 64 KiB around each page faulted in,
///   so scattered hot code kept 15 MiB of text resident; names no longer in the binary are
///   skipped;
/// - no dynamic symbol table of Portico's own symbols (the toolchain's static-stdlib flags
///   export them all): nothing looks them up (only libdispatch's `dispatch_async_swift_job`
///   is, and it is not Portico's), and the loader's lookups touched 2 MB of them at start.
/// Packed relative relocations (`-z pack-relative-relocs`) save 3.5 MiB more but need glibc 2.36
/// where the binary runs: scripts/build-release and deploy/Dockerfile add them.
let releaseLinking: [LinkerSetting] = [
    .unsafeFlags([
        "-use-ld=lld",
        "-Xlinker", "--symbol-ordering-file=\(Context.packageDirectory)/scripts/link-order.txt",
        "-Xlinker", "--no-warn-symbol-ordering",
        "-Xlinker", "--no-export-dynamic",
    ], .when(platforms: [.linux], configuration: .release)),
]
/// The floor is linked by the same linker, so scripts/build-release's flags suit both.
let floorLinking: [LinkerSetting] = [
    .unsafeFlags(["-use-ld=lld"], .when(platforms: [.linux], configuration: .release)),
]

let package = Package(
    name: "Portico",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "portico", targets: ["PorticoCommand"]),
        // libFuzzer targets for Portico's parsers (scripts/libfuzz); a plain build replays inputs.
        .executable(name: "portico-fuzz", targets: ["PorticoFuzz"]),
        // bench/cpu --floors: libmicrohttpd and SwiftNIO with no gateway between them.
        .executable(name: "portico-proxy-floor", targets: ["PorticoProxyFloor"]),
        .library(name: "Portico", targets: ["Portico"]),
        .library(name: "MicroHTTPD", targets: ["MicroHTTPD"]),
        .library(name: "RedisClient", targets: ["RedisClient"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.0"),
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        // HTTP/2 to upstreams (issue #45), on the nio transport.
        .package(url: "https://github.com/apple/swift-nio-http2", from: "1.46.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.0"),
        .package(url: "https://github.com/apple/swift-http-structured-headers", from: "1.7.0"),
        .package(url: "https://github.com/apple/swift-certificates", from: "1.21.1"),
        // SHA-256 for `tls.pin_sha256` (already built for swift-certificates).
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        // Tracing (issue #23): OTLP/HTTP only, so the gRPC stack is not built (needs tools 6.1 for traits).
        .package(url: "https://github.com/swift-otel/swift-otel", from: "1.6.0", traits: ["OTLPHTTP"]),
        .package(url: "https://github.com/swift-otel/swift-otel-semantic-conventions", from: "1.44.0"),
        .package(url: "https://github.com/swift-otel/swift-w3c-trace-context", from: "1.0.0"),
        .package(url: "https://github.com/apple/swift-distributed-tracing", from: "1.7.3"),
    ],
    targets: [
        .systemLibrary(
            name: "CMicroHTTPD",
            pkgConfig: "libmicrohttpd",
            providers: [.apt(["libmicrohttpd-dev"])]
        ),
        .systemLibrary(
            name: "CZlib",
            pkgConfig: "zlib",
            providers: [.apt(["zlib1g-dev"])]
        ),
        // Which threads take each lock on the request path (the confinement test of issue #33).
        .target(name: "LockAudit", swiftSettings: strict),
        // One write for the flushes of an event loop's turn (HTTP/2 connections, Redis connections).
        .target(
            name: "FlushCoalescing",
            dependencies: [.product(name: "NIOCore", package: "swift-nio")],
            swiftSettings: strict
        ),
        .target(
            name: "MicroHTTPD",
            dependencies: ["CMicroHTTPD", "LockAudit"],
            swiftSettings: strict
        ),
        // A small Redis client on SwiftNIO (RESP3/RESP2, pool, TLS): what shared rate limits need.
        .target(
            name: "RedisClient",
            dependencies: [
                "FlushCoalescing",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                // SHA-1 names a script for EVALSHA.
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strict
        ),
        .target(
            name: "Portico",
            dependencies: [
                "FlushCoalescing",
                "MicroHTTPD",
                "LockAudit",
                "CZlib",
                "RedisClient",
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "Yams", package: "Yams"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOHPACK", package: "swift-nio-http2"),
                .product(name: "RawStructuredFieldValues", package: "swift-http-structured-headers"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "OTel", package: "swift-otel"),
                .product(name: "OTelSemanticConventions", package: "swift-otel-semantic-conventions"),
                .product(name: "W3CTraceContext", package: "swift-w3c-trace-context"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            // The admin dashboard, compiled in as `PackageResources.dashboard_html` (no Bundle at run time).
            resources: [.embedInCode("Admin/dashboard.html")],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "PorticoCommand",
            dependencies: [
                "Portico",
                "LockAudit",
                "PorticoDemo",
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict,
            linkerSettings: releaseLinking
        ),
        .executableTarget(
            name: "PorticoProxyFloor",
            dependencies: [
                "MicroHTTPD",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            path: "bench/floor/swift-proxy",
            swiftSettings: strict,
            linkerSettings: floorLinking
        ),
        .executableTarget(
            name: "PorticoFuzz",
            dependencies: ["Portico", "RedisClient", .product(name: "HTTPTypes", package: "swift-http-types")],
            swiftSettings: strict
        ),
        // `portico demo`'s upstream and IdP: shipped in the binary, so kept apart from the test fixtures.
        .target(
            name: "PorticoDemo",
            dependencies: ["Portico", "MicroHTTPD",
                           // The demo's WebSocket echo (issue #35): NIO's frame codecs on the upgraded socket.
                           .product(name: "NIOCore", package: "swift-nio"),
                           .product(name: "NIOPosix", package: "swift-nio"),
                           .product(name: "NIOWebSocket", package: "swift-nio"),
                           // SHA-1 of the handshake's Sec-WebSocket-Accept.
                           .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strict
        ),
        .target(
            name: "PorticoTesting",
            dependencies: [
                "Portico",
                "RedisClient",
                "PorticoDemo",
                "MicroHTTPD",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                // TestUpstream's HTTP/2 mode (issue #45).
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "RedisClientTests",
            dependencies: [
                "RedisClient",
                "PorticoTesting",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            swiftSettings: strict
        ),
        .testTarget(name: "MicroHTTPDTests", dependencies: ["MicroHTTPD", "PorticoTesting"], swiftSettings: strict),
        .testTarget(
            name: "PorticoTests",
            dependencies: [
                "FlushCoalescing",
                "Portico",
                "LockAudit",
                "PorticoTesting",
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "Metrics", package: "swift-metrics"),
                // Tests/PorticoTests/Metrics compare the sharded histograms' text with swift-prometheus's own.
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                // The handlers' tests drive a pipeline without sockets (`EmbeddedChannel`).
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                // The HTTP/2 connection handler's tests name its multiplexer's type.
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "IntegrationTests",
            dependencies: [
                "Portico",
                "LockAudit",
                "PorticoTesting",
                "RedisClient",
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
    ],
    swiftLanguageModes: [.v6]
)
