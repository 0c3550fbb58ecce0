import Foundation
import HTTPTypes
import NIOCore
import Portico
import RedisClient

/// One libFuzzer target per parser Portico owns. Each checks the promises its parser makes
/// (no crash, no negative duration, q-values in range, tokens usable as header values) and
/// traps when one is broken, which libFuzzer records as a crash with its input.
enum FuzzTarget: String, CaseIterable, Sendable {
    case units
    case cacheControl = "cache-control"
    case acceptEncoding = "accept-encoding"
    case retryAfter = "retry-after"
    case vary
    case httpList = "http-list"
    case tokenResponse = "token-response"
    case config
    case resp

    func run(_ bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self)
        switch self {
        case .units:
            if let duration = try? ConfigUnits.duration(text) { check(duration >= .zero, "negative duration", text) }
            if let size = try? ConfigUnits.byteSize(text) { check(size >= 0, "negative size", text) }
            if let rate = try? ConfigUnits.rate(text) { check(rate.count >= 0 && rate.per > .zero, "bad rate", text) }
        case .cacheControl:
            _ = CacheControl(parsing: text)
            var fields = HTTPFields()
            if HTTPField.isValidValue(text) {
                fields[.cacheControl] = text
                fields[HTTPField.Name("Pragma")!] = text
                fields[HTTPField.Name("Age")!] = text
                fields[HTTPField.Name("Expires")!] = text
                fields[HTTPField.Name("CDN-Cache-Control")!] = text
            }
            _ = RequestDirectives(fields)
            _ = ResponseFreshness(status: 200, headerFields: fields, requestTime: Date(timeIntervalSince1970: 1_000_000),
                                  responseTime: Date(timeIntervalSince1970: 1_000_001),
                                  targets: [HTTPField.Name("CDN-Cache-Control")!])
        case .acceptEncoding:
            _ = AcceptEncoding(fieldValues: [text, text])
            if let q = AcceptEncoding.qvalue(text) { check((0...1000).contains(q), "q-value out of range", text) }
        case .retryAfter:
            if let delay = RetryAfter.delay(text, now: Date(timeIntervalSince1970: 1_800_000_000)) {
                check(delay >= .zero, "negative Retry-After", text)
            }
            _ = HTTPDate.parse(text)
        case .vary:
            guard HTTPField.isValidValue(text) else { return }
            var response = HTTPFields()
            response[HTTPField.Name("Vary")!] = text
            var request = HTTPFields()
            request[.acceptEncoding] = text
            request[.acceptLanguage] = text
            _ = VaryKey(response: response, request: request)
        case .httpList:
            checkList(text)
        case .tokenResponse:
            if let token = try? TokenEndpointClient.parse(Data(bytes)) {
                check(!token.accessToken.isEmpty, "empty access token accepted", text)
                check(HTTPField.isValidValue("\(token.tokenType) \(token.accessToken)"), "token not usable in a header", text)
            }
        case .config:
            _ = try? ConfigLoader.load(yaml: text, source: "fuzz.yaml", environment: ["X": "v"])
        case .resp:
            checkRESP(bytes, text)
        }
    }

    /// The list parser's promises: elements are non-empty, in order, without surrounding OWS,
    /// their values and parameters are slices of them; without quotes the elements are exactly
    /// the trimmed, non-empty comma-separated pieces. `If-None-Match` evaluation never crashes.
    private func checkList(_ text: String) {
        for quoting in [HTTPList.Quoting.quotedString, .entityTag] {
            var previousEnd = text.startIndex
            for element in HTTPList(text, quoting: quoting) {
                let bytes = element.text.utf8
                check(!bytes.isEmpty, "empty element", text)
                check(element.text.startIndex >= previousEnd, "elements out of order", text)
                check(!isOWS(bytes.first!) && !isOWS(bytes.last!), "element keeps OWS", text)
                check(element.value.startIndex == element.text.startIndex && element.value.endIndex <= element.text.endIndex,
                      "value not a prefix of its element", text)
                for parameter in element.parameters {
                    check(parameter.name.utf8.first.map(isOWS) != true && parameter.name.utf8.last.map(isOWS) != true,
                          "parameter name keeps OWS", text)
                    if let value = parameter.value { _ = HTTPList.unquoted(value) }
                }
                _ = HTTPList.unquoted(element.text)
                previousEnd = element.text.endIndex
            }
        }
        if !text.contains("\"") {
            let parsed = HTTPList(text).map { Array($0.text.utf8) }
            let reference = Array(text.utf8).split(separator: UInt8(ascii: ","), omittingEmptySubsequences: false)
                .map { Array($0.drop(while: isOWS).reversed().drop(while: isOWS).reversed()) }
                .filter { !$0.isEmpty }
            check(parsed == reference, "unquoted list split differently from its commas", text)
        }
        if HTTPField.isValidValue(text) {
            var request = HTTPFields()
            request[.ifNoneMatch] = text
            var response = HTTPFields()
            response[.eTag] = text
            _ = ConditionalRequest.isNotModified(request: request, response: response)
        }
    }

    /// The RESP parser's promises: a value read whole is read the same when its bytes arrive in
    /// two pieces, and writing what was read and reading it again gives the same bytes.
    private func checkRESP(_ bytes: [UInt8], _ text: String) {
        let parser = RESPParser(maxBulkBytes: 1 << 16, maxElements: 1 << 12)
        guard let (values, _) = try? parser.parseAll(bytes) else { return }
        let encoded = values.flatMap(RESPEncoder.bytes)
        let again = try? parser.parseAll(encoded)
        check(again?.incomplete == false && again.map { $0.values.flatMap(RESPEncoder.bytes) } == encoded,
              "re-encoded values read back differently", text)
        guard bytes.count > 1 else { return }
        var buffer = ByteBuffer(bytes: bytes[..<(bytes.count / 2)])
        var split: [RESPValue] = []
        do {
            while buffer.readableBytes > 0, let value = try parser.parse(&buffer) { split.append(value) }
            buffer.writeBytes(bytes[(bytes.count / 2)...])
            while buffer.readableBytes > 0, let value = try parser.parse(&buffer) { split.append(value) }
        } catch {
            check(false, "a split input failed where the whole one parsed", text)
        }
        check(split.flatMap(RESPEncoder.bytes) == encoded, "a split input parsed differently", text)
    }

    private func isOWS(_ byte: UInt8) -> Bool { byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") }

    private func check(_ condition: Bool, _ promise: String, _ input: String) {
        if !condition { fatalError("\(rawValue): \(promise) for input \(input.debugDescription)") }
    }
}

/// The targets to run, from `PORTICO_FUZZ_TARGET` (all of them when unset).
let selectedTargets: [FuzzTarget] = {
    guard let name = ProcessInfo.processInfo.environment["PORTICO_FUZZ_TARGET"] else { return FuzzTarget.allCases }
    guard let target = FuzzTarget(rawValue: name) else {
        fatalError("unknown PORTICO_FUZZ_TARGET \(name); one of \(FuzzTarget.allCases.map(\.rawValue))")
    }
    return [target]
}()

/// libFuzzer's entry point.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    for target in selectedTargets { target.run(bytes) }
    return 0
}

#if PORTICO_LIBFUZZER
/// SwiftPM links an executable through its module's own entry point, so libFuzzer's `main` is not
/// used: this one hands control to libFuzzer's driver (looked up by name, as Swift cannot import
/// the declaration from libFuzzer's header).
@main
struct LibFuzzer {
    typealias Driver = @convention(c) (UnsafeMutablePointer<CInt>,
                                       UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
                                       @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt) -> CInt

    static func main() {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "LLVMFuzzerRunDriver") else {
            fatalError("not linked with libFuzzer: build with -sanitize=fuzzer (scripts/libfuzz does)")
        }
        var argc = CommandLine.argc
        var argv = CommandLine.unsafeArgv
        exit(unsafeBitCast(symbol, to: Driver.self)(&argc, &argv, fuzzOneInput))
    }
}
#else
/// Without libFuzzer (a normal build), replays inputs: `portico-fuzz FILE...` runs every
/// selected target over each file, e.g. a crash libFuzzer saved, to reproduce it in a debugger.
@main
struct Replay {
    static func main() {
        let files = CommandLine.arguments.dropFirst()
        guard !files.isEmpty else {
            print("usage: [PORTICO_FUZZ_TARGET=name] portico-fuzz FILE...  (targets: \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")))")
            print("scripts/libfuzz builds this target with libFuzzer and runs it.")
            exit(2)
        }
        for file in files {
            guard let data = FileManager.default.contents(atPath: file) else {
                print("cannot read \(file)")
                exit(1)
            }
            _ = Array(data).withUnsafeBufferPointer { fuzzOneInput($0.baseAddress, $0.count) }
            print("\(file): no crash, every promise kept")
        }
    }
}
#endif
