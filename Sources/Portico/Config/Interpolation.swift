import Foundation

/// Expands `${VAR}`, `${VAR:-default}` and `${file:/path}` in one scalar; `$${` is a literal
/// `${`. Runs on composed scalars, not on the raw text, so a secret containing `:` or `#`
/// cannot change the YAML structure and line numbers stay those of the file.
struct Interpolator {
    struct Result {
        var value: String
        /// The references as written (`${ORDERS_SECRET}`), for messages that must not show
        /// the value itself.
        var references: [String]
        /// Problems, each naming a variable or file but never a value.
        var errors: [String]
    }

    var environment: [String: String]
    /// Where relative `${file:…}` paths start: the config file's directory.
    var baseDirectory: String?

    func interpolate(_ raw: String) -> Result {
        var result = Result(value: "", references: [], errors: [])
        guard raw.contains("${") else {
            result.value = raw
            return result
        }
        var rest = Substring(raw)
        while let dollar = rest.firstIndex(of: "$") {
            result.value += rest[..<dollar]
            let afterDollar = rest[dollar...].dropFirst()
            if afterDollar.hasPrefix("${") {
                result.value += "${"
                rest = afterDollar.dropFirst(2)
                continue
            }
            guard afterDollar.hasPrefix("{") else {
                result.value += "$"
                rest = afterDollar
                continue
            }
            guard let close = afterDollar.firstIndex(of: "}") else {
                result.errors.append("unterminated \"${\" (write \"$${\" for a literal \"${\")")
                return result
            }
            let body = afterDollar[afterDollar.index(after: afterDollar.startIndex)..<close]
            let reference = "${\(body)}"
            result.references.append(reference)
            switch resolve(body, reference: reference) {
            case .success(let value): result.value += value
            case .failure(let error): result.errors.append(error.message)
            }
            rest = afterDollar[afterDollar.index(after: close)...]
        }
        result.value += rest
        return result
    }

    struct Failure: Error { var message: String }

    private func resolve(_ body: Substring, reference: String) -> Swift.Result<String, Failure> {
        if body.hasPrefix("file:") {
            return readFile(String(body.dropFirst("file:".count)), reference: reference)
        }
        let name: Substring, fallback: Substring?
        if let separator = body.range(of: ":-") {
            name = body[..<separator.lowerBound]
            fallback = body[separator.upperBound...]
        } else {
            name = body
            fallback = nil
        }
        guard Self.isVariableName(name) else {
            return .failure(Failure(message:
                "invalid reference \(reference.quotedForMessage) (expected ${NAME}, ${NAME:-default} or ${file:/path})"))
        }
        // Shell semantics: `:-` also replaces a variable that is set but empty.
        if let value = environment[String(name)], !(value.isEmpty && fallback != nil) {
            return .success(value)
        }
        if let fallback { return .success(String(fallback)) }
        return .failure(Failure(message: "environment variable \(name.quotedForMessage) is not set"))
    }

    private func readFile(_ path: String, reference: String) -> Swift.Result<String, Failure> {
        guard !path.isEmpty else {
            return .failure(Failure(message: "empty file path in \(reference.quotedForMessage)"))
        }
        let contents: Data
        switch readData(path) {
        case .success(let data): contents = data
        case .failure(let failure): return .failure(failure)
        }
        guard var text = String(data: contents, encoding: .utf8) else {
            return .failure(Failure(message: "file \(path.quotedForMessage) is not valid UTF-8 text"))
        }
        // Secret files usually end with one newline that is not part of the secret.
        if text.hasSuffix("\r\n") {
            text.removeLast(1)  // "\r\n" is one Character
        } else if text.hasSuffix("\n") {
            text.removeLast()
        }
        return .success(text)
    }

    /// The bytes of `path` (relative paths start at `baseDirectory`); the failure names the
    /// path as written and what went wrong, never the contents.
    func readData(_ path: String) -> Swift.Result<Data, Failure> {
        let fullPath = path.hasPrefix("/") || baseDirectory == nil
            ? path : NSString(string: baseDirectory!).appendingPathComponent(path)
        let files = FileManager.default
        var isDirectory: ObjCBool = false
        let problem: String
        if !files.fileExists(atPath: fullPath, isDirectory: &isDirectory) {
            problem = "no such file"
        } else if isDirectory.boolValue {
            problem = "is a directory"
        } else if let data = files.contents(atPath: fullPath) {
            return .success(data)
        } else {
            problem = files.isReadableFile(atPath: fullPath) ? "read failed" : "permission denied"
        }
        return .failure(Failure(message: "cannot read file \(path.quotedForMessage) (\(problem))"))
    }

    /// `[A-Za-z_][A-Za-z0-9_]*`, as in POSIX shells.
    static func isVariableName(_ name: Substring) -> Bool {
        guard let first = name.unicodeScalars.first, first == "_" || (first.isASCII && first.properties.isAlphabetic)
        else { return false }
        return name.unicodeScalars.allSatisfy { $0 == "_" || ($0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0))) }
    }
}
