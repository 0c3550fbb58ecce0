import Foundation
import HTTPTypes
import NIOCore

/// A stored response as bytes for the fleet tier, and back. Compact and versioned: a replica
/// reads what another wrote, and a record it cannot read (another version, a truncated value)
/// is a miss, never an error for the request.
///
/// Ages cross processes on the wall clock: a record carries when it was written and the
/// response's age then; a reader adds the time since, so a response that spent ten seconds in
/// Redis is ten seconds older wherever it is read (RFC 9111 §4.2.3: time resident in a cache).
enum CacheEntryCodec {
    static let version: UInt8 = 1

    /// `entry` as a record written at `wallNow`, when its age was `age`.
    static func encode(_ entry: CacheEntry, age: Duration, wallNow: Date) -> [UInt8] {
        var out = ByteBuffer()
        out.reserveCapacity(entry.size)
        out.writeInteger(version)
        out.writeInteger(Int64(wallNow.timeIntervalSince1970 * 1000))
        out.writeInteger(age.wholeMilliseconds)
        out.writeInteger(UInt16(entry.status.code))
        writeString(entry.status.reasonPhrase, to: &out)
        out.writeInteger(UInt16(entry.vary.names.count))
        for (name, value) in zip(entry.vary.names, entry.vary.values) {
            writeString(name, to: &out)
            writeOptional(value, to: &out)
        }
        out.writeInteger(UInt16(entry.headerFields.count))
        for field in entry.headerFields {
            writeString(field.name.rawName, to: &out)
            writeString(field.value, to: &out)
        }
        let f = entry.freshness
        out.writeInteger(f.lifetime.wholeMilliseconds)
        let flags: UInt8 = (f.noCache ? 1 : 0) | (f.mustRevalidate ? 2 : 0) | (f.sharedWithAuthorization ? 4 : 0)
            | (f.immutable ? 8 : 0) | (f.heuristic ? 16 : 0) | (entry.storedWithAuthorization ? 32 : 0)
        out.writeInteger(flags)
        out.writeInteger(f.staleWhileRevalidate?.wholeMilliseconds ?? -1)
        out.writeInteger(f.staleIfError?.wholeMilliseconds ?? -1)
        out.writeInteger(UInt16(f.noCacheFields.count))
        for name in f.noCacheFields { writeString(name, to: &out) }
        out.writeInteger(UInt32(entry.body.readableBytes))
        var body = entry.body
        out.writeBuffer(&body)
        return Array(out.readableBytesView)
    }

    /// The entry `record` holds under `key`, as received now: its age is its age when written
    /// plus the time since, and `receivedAt` is `now`. `nil` for a record this build cannot read.
    static func decode(_ record: [UInt8], key: String, now: ContinuousClock.Instant, wallNow: Date) -> CacheEntry? {
        var buffer = ByteBuffer(bytes: record)
        guard buffer.readInteger(as: UInt8.self) == version,
              let writtenAt = buffer.readInteger(as: Int64.self), let ageThen = buffer.readInteger(as: Int64.self),
              let code = buffer.readInteger(as: UInt16.self), let reason = readString(&buffer),
              let varyCount = buffer.readInteger(as: UInt16.self) else { return nil }
        var names: [String] = []
        var values: [String?] = []
        for _ in 0..<varyCount {
            guard let name = readString(&buffer), let value = readOptional(&buffer) else { return nil }
            names.append(name)
            values.append(value)
        }
        guard let fieldCount = buffer.readInteger(as: UInt16.self) else { return nil }
        var fields = HTTPFields()
        fields.reserveCapacity(Int(fieldCount))
        for _ in 0..<fieldCount {
            guard let name = readString(&buffer), let value = readString(&buffer),
                  let fieldName = HTTPField.Name(name) else { return nil }
            fields.append(HTTPField(name: fieldName, value: value))
        }
        guard let lifetime = buffer.readInteger(as: Int64.self),
              let flags = buffer.readInteger(as: UInt8.self), let swr = buffer.readInteger(as: Int64.self),
              let sie = buffer.readInteger(as: Int64.self), let noCacheCount = buffer.readInteger(as: UInt16.self) else { return nil }
        var noCacheFields: [String] = []
        for _ in 0..<noCacheCount {
            guard let name = readString(&buffer) else { return nil }
            noCacheFields.append(name)
        }
        guard let bodyLength = buffer.readInteger(as: UInt32.self), let body = buffer.readSlice(length: Int(bodyLength)),
              buffer.readableBytes == 0, (100...999).contains(code) else { return nil }

        // The age the response has now: its age when written, plus the time it has spent in the
        // store since (never negative, whatever the two clocks say).
        let written = Date(timeIntervalSince1970: Double(writtenAt) / 1000)
        let resident = Duration.milliseconds(max(0, Int64(wallNow.timeIntervalSince(written) * 1000)))
        let ageNow = Duration.milliseconds(max(0, ageThen)) + resident
        var freshness = ResponseFreshness(status: Int(code), headerFields: [:], requestTime: wallNow, responseTime: wallNow)
        freshness.lifetime = .milliseconds(max(0, lifetime))
        freshness.initialAge = ageNow
        freshness.noCache = flags & 1 != 0
        freshness.noCacheFields = noCacheFields
        freshness.mustRevalidate = flags & 2 != 0
        freshness.sharedWithAuthorization = flags & 4 != 0
        freshness.immutable = flags & 8 != 0
        freshness.heuristic = flags & 16 != 0
        freshness.staleWhileRevalidate = swr >= 0 ? .milliseconds(swr) : nil
        freshness.staleIfError = sie >= 0 ? .milliseconds(sie) : nil
        return CacheEntry(key: key, vary: VaryKey(names: names, values: values),
                          status: HTTPResponse.Status(code: Int(code), reasonPhrase: reason), headerFields: fields,
                          body: body, freshness: freshness, receivedAt: now, storedWithAuthorization: flags & 32 != 0)
    }

    private static func writeString(_ text: String, to out: inout ByteBuffer) {
        out.writeInteger(UInt32(text.utf8.count))
        out.writeString(text)
    }

    private static func writeOptional(_ text: String?, to out: inout ByteBuffer) {
        guard let text else {
            out.writeInteger(UInt32.max)
            return
        }
        writeString(text, to: &out)
    }

    private static func readString(_ buffer: inout ByteBuffer) -> String? {
        guard let length = buffer.readInteger(as: UInt32.self), length != .max else { return nil }
        return buffer.readString(length: Int(length))
    }

    /// `.some(nil)` for an absent value, `nil` for a record that ends early.
    private static func readOptional(_ buffer: inout ByteBuffer) -> String?? {
        guard let length = buffer.getInteger(at: buffer.readerIndex, as: UInt32.self) else { return nil }
        if length == .max {
            buffer.moveReaderIndex(forwardBy: 4)
            return .some(nil)
        }
        return readString(&buffer).map { .some($0) }
    }
}
