import HTTPTypes

/// `RateLimit-Policy` and `RateLimit` as defined by draft-ietf-httpapi-ratelimit-headers-10
/// (September 2025; -08 introduced this syntax): Structured Field lists whose items are a
/// quoted policy name with parameters.
///
///     RateLimit-Policy: "limit";q=200;w=2      quota q per window w seconds
///     RateLimit: "limit";r=57;t=1              r units remaining, t seconds until reset
///
/// A token bucket is advertised as its capacity (`q` = burst) over the time an empty bucket
/// takes to fill (`w` = ⌈burst / rate⌉ seconds); `t` is the time until the bucket is full
/// again. Both are honest bounds for a client pacing itself.
public enum RateLimitHeaders {
    public static let policyName = HTTPField.Name("RateLimit-Policy")!
    public static let stateName = HTTPField.Name("RateLimit")!

    /// `"name";q=Q;w=W`
    public static func policy(name: String, policy: TokenBucketPolicy) -> String {
        let window = max(1, wholeSecondsRoundedUp(policy.refillTime))
        return "\(sfString(name));q=\(policy.burst);w=\(window)"
    }

    /// `"name";r=R;t=T`
    public static func state(name: String, decision: RateLimitDecision) -> String {
        "\(sfString(name));r=\(max(0, decision.remaining));t=\(wholeSecondsRoundedUp(decision.resetAfter))"
    }

    /// Both headers are Structured Field lists: a limit further in (a `rate_limit`, a quota)
    /// keeps its item and this one is added beside it.
    static func append(_ item: String, to name: HTTPField.Name, in fields: inout HTTPFields) {
        if let existing = fields[name], !existing.isEmpty {
            fields[name] = existing + ", " + item
        } else {
            fields[name] = item
        }
    }

    /// An RFC 8941 sf-string: printable ASCII only, `"` and `\` escaped. Other characters
    /// (a policy name is a config key and may be anything) become `?`.
    public static func sfString(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case " "..."~": out.unicodeScalars.append(scalar)
            default: out += "?"
            }
        }
        return out + "\""
    }
}
