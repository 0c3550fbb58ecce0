import HTTPTypes

extension HeadersConfig {
    /// `type: headers`: `request:` and/or `response:`, each with `set:`, `add:` (mappings of
    /// field name to value template) and `remove:` (a list of names). Values are read as written,
    /// without the loader's `${VAR}` interpolation: `HeaderTemplate` has its own references.
    static func parse(_ m: ConfigMapping) -> HeadersConfig? {
        var c = HeadersConfig()
        var failed = false
        for (key, direction) in [("request", \HeadersConfig.request), ("response", \HeadersConfig.response)] {
            guard let node = m.value(key) else { continue }
            guard let rules = node.mapping().flatMap(HeaderRules.parse) else {
                failed = true
                continue
            }
            c[keyPath: direction] = rules
        }
        m.finish()
        if failed { return nil }
        if c.request.isEmpty && c.response.isEmpty {
            m.error("sets, adds or removes nothing: give request: or response: rules (set:, add:, remove:)")
            return nil
        }
        return c
    }
}

extension HeaderRules {
    static func parse(_ m: ConfigMapping) -> HeaderRules? {
        var rules = HeaderRules()
        var failed = false
        if let node = m.value("remove") {
            if let items = node.list() {
                for item in items {
                    guard let name = item.headerRuleName(rawKey: nil) else {
                        failed = true
                        continue
                    }
                    if rules.remove.contains(name) {
                        item.error("\(name.rawName.quotedForMessage) is listed twice")
                    } else {
                        rules.remove.append(name)
                    }
                }
            } else {
                failed = true
            }
        }
        for key in ["set", "add"] {
            guard let node = m.value(key) else { continue }
            guard let section = node.mapping() else {
                failed = true
                continue
            }
            var assignments: [Assignment] = []
            for entry in section.entries {
                guard let name = entry.keyNode.headerRuleName(rawKey: entry.key) else {
                    failed = true
                    continue
                }
                if key == "set", assignments.contains(where: { $0.name == name }) {
                    entry.keyNode.error("\(entry.key.quotedForMessage) is set twice (names are case-insensitive)")
                    failed = true
                    continue
                }
                if rules.remove.contains(name) {
                    entry.keyNode.error("\(entry.key.quotedForMessage) is both removed and \(key == "set" ? "set" : "added"): "
                        + (key == "set" ? "set already replaces it" : "use set: to replace it"))
                    failed = true
                    continue
                }
                if key == "add", rules.set.contains(where: { $0.name == name }) {
                    entry.keyNode.error("\(entry.key.quotedForMessage) is both set and added: list every value under add:, or one under set:")
                    failed = true
                    continue
                }
                guard let template = entry.value.headerTemplate() else {
                    failed = true
                    continue
                }
                assignments.append(Assignment(name: name, value: template))
            }
            if key == "set" { rules.set = assignments } else { rules.add = assignments }
        }
        m.finish()
        return failed ? nil : rules
    }
}

extension ConfigNode {
    /// A field name a rule may touch: a valid token, and not one Portico frames itself.
    /// `rawKey` is the mapping key when the name is one (the node is then the key's).
    fileprivate func headerRuleName(rawKey: String?) -> HTTPField.Name? {
        let text: String
        if let rawKey {
            text = rawKey
        } else {
            guard let value = scalar(expected: "a header field name") else { return nil }
            text = value.text
        }
        guard let name = HTTPField.Name(text) else {
            error("\(text.quotedForMessage) is not a valid header field name")
            return nil
        }
        guard !HeadersConfig.framedFields.contains(name.canonicalName) else {
            let advice = name.canonicalName == "host"
                ? "to send another Host to the upstream, set host_header: on the upstream"
                : "Portico frames messages itself (Host, Content-Length, Transfer-Encoding, Connection and the hop-by-hop fields); for Host, use the upstream's host_header:"
            error("\(text.quotedForMessage) cannot be changed by a header rule: \(advice)")
            return nil
        }
        return name
    }

    /// The value as written (no `${VAR}` interpolation) parsed as a `HeaderTemplate`; `${env:…}`
    /// reads the same environment the loader does.
    fileprivate func headerTemplate() -> HeaderTemplate? {
        guard case .scalar(let scalar) = node, !isNull else {
            typeMismatch("a header value")
            return nil
        }
        do throws(HeaderTemplate.ParseError) {
            return try HeaderTemplate(parsing: scalar.string, environment: context.interpolator.environment)
        } catch {
            self.error(error.description)
            return nil
        }
    }
}
