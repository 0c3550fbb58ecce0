/// `type: compress` — gzip responses for clients that accept it.
public struct CompressConfig: Sendable, Equatable {
    /// JSON, text, JavaScript, XML and SVG, and any `+json`/`+xml` type (`application/problem+json`,
    /// `application/atom+xml`). `text/event-stream` is never compressed whatever the list says.
    public static let defaultTypes: [MediaTypePattern] = [
        "text/*", "application/json", "application/javascript", "application/xml", "image/svg+xml",
        "*/*+json", "*/*+xml",
    ].map { MediaTypePattern($0)! }

    /// zlib level, 1 (fastest) to 9 (smallest).
    public var level: Int = 6
    /// Bodies shorter than this are sent as they are: gzip's ~20-byte frame and the CPU are not
    /// worth it for them.
    public var minBytes: Int = 1024
    /// Content types that are compressed; a list in the config replaces this one.
    public var types: [MediaTypePattern] = defaultTypes
    /// zlib's window, 2^windowBits bytes (9...15): with `memLevel`, the memory one response
    /// needs while it is compressed.
    public var windowBits: Int = 15
    /// zlib's hash memory, 1...9.
    public var memLevel: Int = 8

    public init() {}

    var zlibSettings: Zlib.Settings {
        Zlib.Settings(level: Int32(clamping: level), windowBits: Int32(clamping: windowBits), memLevel: Int32(clamping: memLevel))
    }

    /// Whether a `Content-Type` is on the list.
    public func compresses(contentType: String) -> Bool {
        // Server-sent events must reach the client as they are written; a gzip stream holds
        // them back until its buffers fill.
        if let essence = MediaTypePattern.essence(of: contentType), essence.type == "text", essence.subtype == "event-stream" {
            return false
        }
        return types.contains { $0.matches(contentType: contentType) }
    }
}
