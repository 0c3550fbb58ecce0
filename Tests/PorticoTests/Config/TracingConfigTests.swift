import Foundation
import Portico
import Testing

@Suite("Config: tracing")
struct TracingConfigTests {
    @Test("absent: tracing is off")
    func offByDefault() throws {
        let config = try load(minimalRoute)
        #expect(config.tracing == nil)
    }

    @Test("every key, with interpolated export headers")
    func everyKey() throws {
        let config = try load("""
            tracing:
              endpoint: http://collector.local:4318
              protocol: http/json
              sample_ratio: 0.25
              service_name: edge
              headers: { x-api-key: "${KEY}" }
              timeout: 2s
              max_queue_size: 64
              schedule_delay: 250ms
            """ + "\n" + minimalRoute, environment: ["KEY": "k-123"])
        let tracing = try #require(config.tracing)
        #expect(tracing.tracesURL == "http://collector.local:4318/v1/traces")
        #expect(tracing.wireProtocol == .httpJSON)
        #expect(tracing.sampleRatio == 0.25)
        #expect(tracing.serviceName == "edge")
        #expect(tracing.headers.map(\.0) == ["x-api-key"] && tracing.headers.map(\.1) == ["k-123"])
        #expect(tracing.timeout == .seconds(2))
        #expect(tracing.maxQueueSize == 64)
        #expect(tracing.scheduleDelay == .milliseconds(250))
    }

    @Test("defaults; a URL with a path is used as it is")
    func defaults() throws {
        let tracing = try #require(try load("tracing: { endpoint: \"http://c:4318/custom/traces\" }\n" + minimalRoute).tracing)
        #expect(tracing.tracesURL == "http://c:4318/custom/traces")
        #expect(tracing.wireProtocol == .httpProtobuf)
        #expect(tracing.sampleRatio == 1 && tracing.serviceName == "portico" && tracing.headers.isEmpty)
        #expect(tracing.timeout == .seconds(10) && tracing.maxQueueSize == 2048 && tracing.scheduleDelay == .seconds(5))
        #expect(try load("tracing: { endpoint: \"http://c:4318/\", sample_ratio: 10% }\n" + minimalRoute).tracing?.sampleRatio == 0.1)
    }

    @Test("problems name the file, line and key", arguments: [
        ("tracing: { protocol: http/json }", #"portico.yaml:1 tracing: missing required key "endpoint""#),
        ("tracing: { endpoint: http://c:4318, protocol: grpc }",
         "portico.yaml:1 tracing.protocol: OTLP/gRPC is not built into Portico: use http/protobuf (the collector's port 4318)"),
        ("tracing: { endpoint: http://c:4318, protocol: http }",
         #"portico.yaml:1 tracing.protocol: expected one of http/protobuf, http/json, got "http""#),
        ("tracing: { endpoint: http://c:4318, sample_ratio: 1.5 }",
         #"portico.yaml:1 tracing.sample_ratio: expected a number from 0 to 1 (or a percentage), got "1.5""#),
        ("tracing: { endpoint: http://c:4318, timeout: 0 }", "portico.yaml:1 tracing.timeout: must be greater than 0"),
        ("tracing: { endpoint: http://c:4318, max_queue_size: 0 }",
         "portico.yaml:1 tracing.max_queue_size: must be between 1 and 1000000, got 0"),
        ("tracing: { endpoint: http://c:4318, sevice_name: x }",
         #"portico.yaml:1 tracing.sevice_name: unknown key "sevice_name" (did you mean "service_name"?)"#),
        ("tracing: { endpoint: http://c:4318, headers: { content-length: 1 } }",
         #"portico.yaml:1 tracing.headers.content-length: header "content-length" is set by the exporter and cannot be configured"#),
    ])
    func problems(yaml: String, expected: String) {
        #expect(diagnostics(yaml + "\n" + minimalRoute) == [expected])
    }

    @Test("an export header's value never appears in a message")
    func secretHeader() {
        let secret = "hunter2-OTLP-KEY"
        let found = diagnostics("""
            tracing: { endpoint: "${S}", headers: { x-api-key: "${BAD}" } }
            """ + "\n" + minimalRoute, environment: ["S": secret, "BAD": "a\r\n\(secret)"])
        #expect(found.count == 2)
        for message in found {
            #expect(!message.contains(secret), "leaked: \(message)")
        }
    }
}
