import HTTPTypes

/// A header value as a `headers` rule writes it: literal text and per-request values, parsed
/// once when the configuration loads. A request's value is the parts joined in order; nothing
/// is searched or replaced at run time.
///
/// Syntax: `${request_id}`, `${client_ip}`, `${route}`, `${upstream}` are filled per request;
/// `${env:NAME}` is read from the environment at load (a missing one is an error naming it,
/// never showing a value); `$${` is a literal `${`. Anything else in `${…}` is an error.
///
/// The config loader's own `${VAR}` interpolation does not run on these values (the parser reads
/// them as written), so `${request_id}` never reaches the environment and an environment
/// variable is always spelled `${env:NAME}` here.
public struct HeaderTemplate: Sendable, Equatable, CustomStringConvertible {
    public enum Part: Sendable, Equatable {
        case literal(String)
        case requestID
        case clientIP
        case route
        case upstream
    }

    /// Why a template does not parse. Messages name the reference as written, never a value.
    public enum ParseError: Error, Sendable, Equatable, CustomStringConvertible {
        case unknownReference(String)
        case unterminated
        case invalidEnvironmentName(String)
        case environmentNotSet(String)
        /// A literal part holds CR, LF or NUL, which cannot be in a header value.
        case invalidCharacter
        /// The variable's value holds CR, LF or NUL.
        case invalidEnvironmentValue(String)

        public var description: String {
            switch self {
            case .unknownReference(let reference):
                let hint = HeaderTemplate.isEnvironmentLike(reference)
                    ? " (for an environment variable write ${env:\(reference.dropFirst(2).dropLast())})" : ""
                return "unknown reference \(reference.quotedForMessage) in a header value\(hint); expected "
                    + "${request_id}, ${client_ip}, ${route}, ${upstream} or ${env:NAME} ($${ for a literal ${)"
            case .unterminated:
                return "unterminated \"${\" in a header value (write \"$${\" for a literal \"${\")"
            case .invalidEnvironmentName(let name):
                return "invalid environment variable name \(name.quotedForMessage) in ${env:…}"
            case .environmentNotSet(let name):
                return "environment variable \(name.quotedForMessage) is not set"
            case .invalidCharacter:
                return "a header value cannot contain CR, LF or NUL"
            case .invalidEnvironmentValue(let name):
                return "the value of environment variable \(name.quotedForMessage) cannot be a header value (it contains CR, LF or NUL)"
            }
        }
    }

    /// Adjacent literals merged; never empty parts.
    public let parts: [Part]
    /// The template as written (`${env:NAME}` stays a reference): what `describe` shows.
    public let source: String

    public var description: String { source }

    /// Whether any part is filled per request.
    public var isConstant: Bool { parts.allSatisfy { if case .literal = $0 { true } else { false } } }

    public init(parsing text: String, environment: [String: String]) throws(ParseError) {
        source = text
        guard !Self.hasForbiddenCharacter(text) else { throw .invalidCharacter }
        var parts: [Part] = []
        var literal = ""
        func flush() {
            if !literal.isEmpty { parts.append(.literal(literal)) }
            literal = ""
        }
        var rest = Substring(text)
        while let dollar = rest.firstIndex(of: "$") {
            literal += rest[..<dollar]
            let afterDollar = rest[rest.index(after: dollar)...]
            if afterDollar.hasPrefix("${") {
                literal += "${"
                rest = afterDollar.dropFirst(2)
                continue
            }
            guard afterDollar.hasPrefix("{") else {
                literal += "$"
                rest = afterDollar
                continue
            }
            guard let close = afterDollar.firstIndex(of: "}") else { throw .unterminated }
            let body = afterDollar[afterDollar.index(after: afterDollar.startIndex)..<close]
            switch body {
            case "request_id": flush(); parts.append(.requestID)
            case "client_ip": flush(); parts.append(.clientIP)
            case "route": flush(); parts.append(.route)
            case "upstream": flush(); parts.append(.upstream)
            default:
                guard body.hasPrefix("env:") else { throw .unknownReference("${\(body)}") }
                let name = body.dropFirst("env:".count)
                guard Interpolator.isVariableName(name) else { throw .invalidEnvironmentName(String(name)) }
                guard let value = environment[String(name)] else { throw .environmentNotSet(String(name)) }
                guard !Self.hasForbiddenCharacter(value) else { throw .invalidEnvironmentValue(String(name)) }
                literal += value
            }
            rest = afterDollar[afterDollar.index(after: close)...]
        }
        literal += rest
        flush()
        self.parts = parts
    }

    /// The value for one request: the parts joined. A constant template costs no allocation.
    @inline(__always)
    func render(requestID: String, clientIP: String, route: String?, upstream: String?) -> String {
        if parts.count == 1, case .literal(let text) = parts[0] { return text }
        var value = ""
        for part in parts {
            switch part {
            case .literal(let text): value += text
            case .requestID: value += requestID
            case .clientIP: value += clientIP
            case .route: value += route ?? ""
            case .upstream: value += upstream ?? ""
            }
        }
        return value
    }

    private static func hasForbiddenCharacter(_ text: String) -> Bool {
        text.utf8.contains { $0 == 0x0D || $0 == 0x0A || $0 == 0x00 }
    }

    /// `${NAME}` in the loader's style (an environment variable's usual spelling).
    fileprivate static func isEnvironmentLike(_ reference: String) -> Bool {
        Interpolator.isVariableName(reference.dropFirst(2).dropLast())
    }
}
