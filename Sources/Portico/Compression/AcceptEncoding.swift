/// A request's `Accept-Encoding` (RFC 9110 §12.5.3), parsed without judgement: the valid
/// elements in order. `negotiate` makes the one decision Portico needs: gzip or identity.
public struct AcceptEncoding: Sendable, Equatable {
    public struct Element: Sendable, Equatable {
        /// Lower-cased content coding, or `*`.
        public var coding: String
        /// The weight in thousandths: `q=0.5` is 500, no `q` is 1000.
        public var quality: Int

        public init(coding: String, quality: Int = 1000) {
            self.coding = coding
            self.quality = quality
        }
    }

    /// What to send.
    public enum Choice: Sendable, Equatable {
        case gzip
        case identity
    }

    /// `nil`: the header is absent. `[]`: present but empty, or nothing in it was valid.
    public var elements: [Element]?

    /// Parses every `Accept-Encoding` field line of a request (none: absent). Malformed
    /// elements (a coding that is not a token, a `q` outside RFC 9110's qvalue grammar, any
    /// other parameter) are dropped on their own; the rest of the header still counts.
    public init(fieldValues: [String]) {
        guard !fieldValues.isEmpty else {
            elements = nil
            return
        }
        elements = fieldValues.flatMap { HTTPList($0).compactMap(Self.element) }
    }

    private static func element(_ element: HTTPList.Element) -> Element? {
        let coding = element.value.lowercased()
        guard !coding.isEmpty else { return nil }  // `;q=1`: parameters without a coding
        guard coding == "*" || HTTPSyntax.isToken(coding) else { return nil }
        var quality: Int?
        for parameter in element.parameters {
            // Only `q`, once; an empty parameter (`gzip;`) is not in this grammar either.
            guard HTTPSyntax.equalsIgnoringCase(parameter.name, "q"), quality == nil,
                  let value = parameter.value, let parsed = qvalue(value) else { return nil }
            quality = parsed
        }
        return Element(coding: coding, quality: quality ?? 1000)
    }

    /// RFC 9110 §12.4.2: `0[.ddd]` or `1[.000]`, at most three decimals, in thousandths.
    public static func qvalue(_ text: some StringProtocol) -> Int? {
        let bytes = Array(text.utf8)
        guard let first = bytes.first, first == UInt8(ascii: "0") || first == UInt8(ascii: "1") else { return nil }
        var thousandths = first == UInt8(ascii: "1") ? 1000 : 0
        guard bytes.count > 1 else { return thousandths }
        guard bytes[1] == UInt8(ascii: "."), bytes.count <= 5 else { return nil }
        var scale = 100
        for byte in bytes.dropFirst(2) {
            guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) else { return nil }
            thousandths += Int(byte - UInt8(ascii: "0")) * scale
            scale /= 10
        }
        return thousandths <= 1000 ? thousandths : nil
    }

    /// The weight the client gives `coding`: its own element, else `*`, else `fallback`.
    /// When a coding is listed twice the first element counts. `x-gzip` is gzip (RFC 9110 §8.4.1.3).
    public func quality(of coding: String, fallback: Int) -> Int {
        guard let elements else { return fallback }
        let names = coding == "gzip" ? ["gzip", "x-gzip"] : [coding]
        if let own = elements.first(where: { names.contains($0.coding) }) { return own.quality }
        if let star = elements.first(where: { $0.coding == "*" }) { return star.quality }
        return fallback
    }

    /// gzip when the client accepts it (q > 0) at least as much as identity; identity otherwise.
    ///
    /// - No header: identity. RFC 9110 allows any coding then, but clients that omit the header
    ///   are often ones that cannot decode (scripts, health checks), so nginx does the same.
    /// - An empty header: identity only (RFC 9110 §12.5.3).
    /// - A coding that is not listed (and no `*`) is not acceptable; identity is acceptable unless
    ///   `identity;q=0` or `*;q=0` excludes it, but when it is not listed it ranks below every
    ///   coding the client did list (`gzip;q=0.5` alone still means "gzip, please").
    /// - When nothing is acceptable (`identity;q=0` without gzip) the answer is still identity:
    ///   RFC 9110 lets a server send an unacceptable coding instead of 406, and a gateway that
    ///   turned working responses into errors would be the less robust choice.
    public var choice: Choice {
        guard elements != nil else { return .identity }
        let gzip = quality(of: "gzip", fallback: 0)
        let identity = quality(of: "identity", fallback: 1)
        return gzip > 0 && gzip >= identity ? .gzip : .identity
    }
}
