import Foundation
import Portico
import Testing

/// The reference file and the examples are documentation: they must keep loading.
@Suite("Shipped configuration files")
struct ShippedConfigTests {
    /// The package root, found from this file: Tests/PorticoTests/Config/ShippedConfigTests.swift.
    static let root = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    static let examples: [String] = {
        let directory = root.appendingPathComponent("config/examples")
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
        return names.filter { $0.hasSuffix(".yaml") }.sorted().map { "config/examples/\($0)" }
    }()

    @Test("there are examples to check")
    func examplesExist() {
        #expect(Self.examples.count >= 3)
    }

    @Test("loads with an empty environment", arguments: ["config/portico.yaml"] + examples)
    func loads(relativePath: String) throws {
        let path = Self.root.appendingPathComponent(relativePath).path
        do {
            let config = try ConfigLoader.load(file: path, environment: [:])
            #expect(!config.routes.isEmpty)
            #expect(config.source == path)
        } catch {
            Issue.record("\(relativePath) failed:\n\(error)")
        }
    }

    @Test("the reference file sets every section and every credential and middleware type")
    func referenceIsComplete() throws {
        let path = Self.root.appendingPathComponent("config/portico.yaml").path
        let config = try ConfigLoader.load(file: path, environment: [:])
        let credentialTypes = Set(config.credentials.values.map(\.typeName))
        #expect(credentialTypes == ["static", "basic", "oauth2_client_credentials", "oauth2_refresh_token"])
        #expect(Set(config.middleware.values.map(\.typeName)) == ["access_log", "auth", "cache", "compress", "headers", "rate_limit", "retry"])
        #expect(!config.upstreams.isEmpty && !config.defaults.middleware.isEmpty)
        #expect(config.routes.contains { $0.direct != nil } && config.routes.contains { $0.upstream != nil })
    }

    @Test("the reference file takes values from the environment")
    func referenceUsesEnvironment() throws {
        let path = Self.root.appendingPathComponent("config/portico.yaml").path
        let config = try ConfigLoader.load(file: path, environment: ["PORTICO_PORT": "9090", "ORDERS_CLIENT_SECRET": "x"])
        #expect(config.listen.port == 9090)
    }
}
