import HTTPTypes

/// `type: headers` — header rules: request fields set, added or removed before the request goes
/// further in (to the upstream), response fields before the response goes out to the client.
public struct HeadersConfig: Sendable, Equatable {
    public var request = HeaderRules()
    public var response = HeaderRules()

    public init(request: HeaderRules = HeaderRules(), response: HeaderRules = HeaderRules()) {
        self.request = request
        self.response = response
    }

    /// Fields Portico frames or manages per connection itself, by lower-cased name: no rule may
    /// touch them. `Host` has `host_header:` on the upstream instead.
    public static let framedFields: Set<String> = ForwardingHeaders.hopByHop.union(["host", "content-length"])
}

/// One direction's rules, applied in this order: `remove`, then `set` (replacing every field of
/// the name, or adding it), then `add` (appending a field, keeping those already there).
public struct HeaderRules: Sendable, Equatable {
    public struct Assignment: Sendable, Equatable {
        public var name: HTTPField.Name
        public var value: HeaderTemplate

        public init(name: HTTPField.Name, value: HeaderTemplate) {
            self.name = name
            self.value = value
        }
    }

    public var remove: [HTTPField.Name] = []
    public var set: [Assignment] = []
    public var add: [Assignment] = []

    public init(remove: [HTTPField.Name] = [], set: [Assignment] = [], add: [Assignment] = []) {
        self.remove = remove
        self.set = set
        self.add = add
    }

    public var isEmpty: Bool { remove.isEmpty && set.isEmpty && add.isEmpty }

    /// Applies the rules to `fields` for one request.
    func apply(to fields: inout HTTPFields, requestID: String, clientIP: String, route: String?, upstream: String?) {
        for name in remove { fields[fields: name] = [] }
        for rule in set {
            let value = rule.value.render(requestID: requestID, clientIP: clientIP, route: route, upstream: upstream)
            fields[fields: rule.name] = [HTTPField(name: rule.name, value: value)]
        }
        for rule in add {
            fields.append(HTTPField(name: rule.name,
                                    value: rule.value.render(requestID: requestID, clientIP: clientIP, route: route, upstream: upstream)))
        }
    }
}
