import Foundation
import NIOSSL
import Portico
import Synchronization

/// Throwaway certificates made with `openssl` at test time, in a temporary directory.
///
/// - `ca`: a root that signs `server` (SAN `localhost` and `127.0.0.1`), `expired` (same
///   names, validity in 2020), `otherHost` (SAN `upstream.internal` only), `wildcard` (SAN
///   `*.example.test` and `127.0.0.1`) and `client` (clientAuth).
/// - `otherCA`: an unrelated root that signs `wrongCA` (same names as `server`).
///
/// Keys are P-256 and unencrypted. Made once per test process (`shared`), which tests running
/// in parallel share; the directory is removed when the process exits.
public struct TestCertificates: Sendable {
    /// A certificate and its key, as files and as PEM bytes.
    public struct Pair: Sendable {
        public var certificateFile: String
        public var keyFile: String
        public var certificatePEM: [UInt8] { Array(FileManager.default.contents(atPath: certificateFile) ?? Data()) }
        public var keyPEM: [UInt8] { Array(FileManager.default.contents(atPath: keyFile) ?? Data()) }
    }

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public let directory: String
    public let ca: Pair
    public let otherCA: Pair
    public let server: Pair
    public let expired: Pair
    public let otherHost: Pair
    public let wildcard: Pair
    public let wrongCA: Pair
    public let client: Pair
    /// `server`'s key in a new certificate (another serial and subject), as a renewal makes:
    /// the same SubjectPublicKeyInfo, so the same `pin_sha256`.
    public let renewedServer: Pair
    /// Self-signed, with keys in the older PEM forms config loading must also read: PKCS#1
    /// (`RSA PRIVATE KEY`), and SEC1 after an `EC PARAMETERS` block (`openssl ecparam -genkey`).
    public let rsaPKCS1: Pair
    public let ecWithParameters: Pair

    /// Generated once per process, on first use; a failure (no `openssl`?) is reported by
    /// every test that asks. Generation runs on its own thread: it waits for `openssl`
    /// processes, and blocking Swift concurrency's few threads would stall unrelated tests.
    public static func shared() async throws -> TestCertificates {
        let task = generation.withLock { task in
            if let task { return task }
            let started = Task { try await generateOnThread() }
            task = started
            return started
        }
        return try await task.value
    }

    private static let generation = Mutex<Task<TestCertificates, any Error>?>(nil)

    private static func generateOnThread() async throws -> TestCertificates {
        try await withCheckedThrowingContinuation { continuation in
            let thread = Thread {
                continuation.resume(with: Result { () throws(Failure) in try TestCertificates() })
            }
            thread.name = "portico-test-certificates"
            thread.start()
        }
    }

    /// Makes a fresh set in a new temporary directory (a `ScratchDirectory`: removed when the
    /// process exits).
    public init() throws(Failure) {
        let directory: String
        do {
            directory = try ScratchDirectory.make("portico-tls").path
        } catch {
            throw Failure(description: "cannot create a temporary directory: \(error)")
        }
        let maker = Maker(directory: directory)
        self.directory = directory
        ca = try maker.root("ca", subject: "Portico Test CA")
        otherCA = try maker.root("other-ca", subject: "Portico Other CA")
        let serverNames = "DNS:localhost,IP:127.0.0.1"
        server = try maker.leaf("server", signer: ca, names: serverNames, usage: "serverAuth")
        expired = try maker.leaf("expired", signer: ca, names: serverNames, usage: "serverAuth",
                                 validity: ("20200101000000Z", "20200201000000Z"))
        otherHost = try maker.leaf("other-host", signer: ca, names: "DNS:upstream.internal", usage: "serverAuth")
        wildcard = try maker.leaf("wildcard", signer: ca, names: "DNS:*.example.test,IP:127.0.0.1", usage: "serverAuth")
        wrongCA = try maker.leaf("wrong-ca", signer: otherCA, names: serverNames, usage: "serverAuth")
        client = try maker.leaf("client", signer: ca, names: "DNS:portico-client", usage: "clientAuth")
        renewedServer = try maker.leaf("renewed-server", signer: ca, names: serverNames, usage: "serverAuth", key: server)
        rsaPKCS1 = try maker.selfSigned("rsa-pkcs1") { ["genrsa", "-traditional", "-out", $0, "2048"] }
        ecWithParameters = try maker.selfSigned("ec-parameters") { ["ecparam", "-name", "prime256v1", "-genkey", "-out", $0] }
    }

    private struct Maker {
        let directory: String

        func path(_ name: String) -> String { "\(directory)/\(name)" }

        func root(_ name: String, subject: String) throws(Failure) -> Pair {
            let pair = Pair(certificateFile: path("\(name).pem"), keyFile: path("\(name).key"))
            try run(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                     "-keyout", pair.keyFile, "-out", pair.certificateFile, "-days", "30", "-subj", "/CN=\(subject)",
                     "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
            return pair
        }

        /// A leaf signed by `signer`; `validity` (UTC, `YYYYMMDDHHMMSSZ`) goes through `openssl ca`,
        /// the only 3.0 command that takes explicit dates.
        /// With `key`, the certificate is for that pair's key rather than a new one.
        func leaf(_ name: String, signer: Pair, names: String, usage: String,
                  validity: (start: String, end: String)? = nil, key: Pair? = nil) throws(Failure) -> Pair {
            let pair = Pair(certificateFile: path("\(name).pem"), keyFile: key?.keyFile ?? path("\(name).key"))
            let request = path("\(name).csr"), extensions = path("\(name).ext")
            let extensionText = "subjectAltName=\(names)\nextendedKeyUsage=\(usage)\nbasicConstraints=CA:FALSE\n"
            guard FileManager.default.createFile(atPath: extensions, contents: Data(extensionText.utf8)) else {
                throw Failure(description: "cannot write \(extensions)")
            }
            if let key {
                try run(["req", "-new", "-key", key.keyFile, "-out", request, "-subj", "/CN=\(name)"])
            } else {
                try run(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                         "-keyout", pair.keyFile, "-out", request, "-subj", "/CN=\(name)"])
            }
            if let validity {
                let database = path("\(name)-db")
                let config = "[ca]\ndefault_ca = test\n[test]\ndatabase = \(database)/index.txt\nserial = \(database)/serial\n"
                    + "new_certs_dir = \(database)\ndefault_md = sha256\npolicy = any\nunique_subject = no\n"
                    + "[any]\ncommonName = supplied\n"
                do {
                    try FileManager.default.createDirectory(atPath: database, withIntermediateDirectories: true)
                } catch {
                    throw Failure(description: "cannot create \(database): \(error)")
                }
                let files = [("index.txt", ""), ("serial", "1000\n"), ("ca.cnf", config)]
                for (file, contents) in files {
                    guard FileManager.default.createFile(atPath: "\(database)/\(file)", contents: Data(contents.utf8)) else {
                        throw Failure(description: "cannot write \(database)/\(file)")
                    }
                }
                try run(["ca", "-batch", "-config", "\(database)/ca.cnf", "-cert", signer.certificateFile,
                         "-keyfile", signer.keyFile, "-in", request, "-out", pair.certificateFile,
                         "-startdate", validity.start, "-enddate", validity.end, "-extfile", extensions, "-notext"])
            } else {
                try run(["x509", "-req", "-in", request, "-CA", signer.certificateFile, "-CAkey", signer.keyFile,
                         "-set_serial", String(UInt32.random(in: 1...UInt32.max)), "-days", "30",
                         "-out", pair.certificateFile, "-extfile", extensions])
            }
            return pair
        }

        /// A self-signed certificate for a key made by `keyCommand` (given the key file's path).
        func selfSigned(_ name: String, keyCommand: (String) -> [String]) throws(Failure) -> Pair {
            let pair = Pair(certificateFile: path("\(name).pem"), keyFile: path("\(name).key"))
            try run(keyCommand(pair.keyFile))
            try run(["req", "-x509", "-key", pair.keyFile, "-out", pair.certificateFile, "-days", "30", "-subj", "/CN=\(name)"])
            return pair
        }

        /// Runs `openssl` (this runs on its own thread, so waiting for it blocks nothing else).
        func run(_ arguments: [String]) throws(Failure) {
            guard let executable = ChildProcess.locate("openssl") else {
                throw Failure(description: "openssl is not installed (scripts/test installs it)")
            }
            let errors = path("openssl-\(UUID().uuidString).err")
            defer { unlink(errors) }
            let process: ChildProcess
            do {
                process = try ChildProcess(executable: executable, arguments: arguments, standardError: .file(errors))
            } catch {
                throw Failure(description: "cannot run openssl: \(error)")
            }
            guard let status = process.waitForExitOnThisThread(timeout: .seconds(60)) else {
                process.signal(SIGKILL)
                _ = process.waitForExitOnThisThread(timeout: .seconds(10))
                throw Failure(description: "openssl \(arguments.first ?? "") did not finish within 60 s")
            }
            guard status == 0 else {
                let output = (try? String(contentsOfFile: errors, encoding: .utf8)) ?? ""
                throw Failure(description: "openssl \(arguments.joined(separator: " ")) exited \(status): \(output)")
            }
        }
    }
}

extension TestCertificates {
    /// A server configuration presenting `pair`; with `requireClientCertificate`, clients must
    /// present a certificate signed by `ca`.
    public func serverTLS(_ pair: Pair, requireClientCertificate: Bool = false) throws -> TLSConfiguration {
        var configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: try NIOSSLCertificate.fromPEMFile(pair.certificateFile).map { .certificate($0) },
            privateKey: .privateKey(try NIOSSLPrivateKey(file: pair.keyFile, format: .pem)))
        if requireClientCertificate {
            configuration.certificateVerification = .noHostnameVerification
            configuration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(ca.certificateFile))
        }
        return configuration
    }

    /// The `tls:` settings trusting `ca` (as `ca_file: ca.pem` would give).
    public func trustingCA() throws -> TLSClientConfig {
        var tls = TLSClientConfig()
        tls.trustRoots = try NIOSSLCertificate.fromPEMFile(ca.certificateFile)
        return tls
    }

    /// `client` as a client identity.
    public func clientIdentity() throws -> TLSClientConfig.ClientIdentity {
        TLSClientConfig.ClientIdentity(certificateChain: try NIOSSLCertificate.fromPEMFile(client.certificateFile),
                                       privateKey: try NIOSSLPrivateKey(file: client.keyFile, format: .pem))
    }
}
