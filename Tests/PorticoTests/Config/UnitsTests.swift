import Portico
import Testing

@Suite("Units")
struct UnitsTests {
    @Test("valid durations", arguments: [
        ("0", Duration.zero),
        ("0s", .zero),
        ("250ms", .milliseconds(250)),
        ("10s", .seconds(10)),
        ("5m", .seconds(300)),
        ("1h", .seconds(3600)),
        ("1.5s", .milliseconds(1500)),
        ("0.1s", .milliseconds(100)),
        ("2.25m", .seconds(135)),
    ])
    func validDuration(text: String, expected: Duration) throws {
        #expect(try ConfigUnits.duration(text) == expected)
    }

    @Test("invalid durations", arguments: [
        ("10x", "invalid duration \"10x\" (expected e.g. 250ms, 10s, 5m)"),
        ("10", "invalid duration \"10\" (expected e.g. 250ms, 10s, 5m)"),
        ("", "invalid duration \"\" (expected e.g. 250ms, 10s, 5m)"),
        ("s", "invalid duration \"s\" (expected e.g. 250ms, 10s, 5m)"),
        ("1.s", "invalid duration \"1.s\" (expected e.g. 250ms, 10s, 5m)"),
        ("1 s", "invalid duration \"1 s\" (expected e.g. 250ms, 10s, 5m)"),
        ("+5s", "invalid duration \"+5s\" (expected e.g. 250ms, 10s, 5m)"),
        ("1e3s", "invalid duration \"1e3s\" (expected e.g. 250ms, 10s, 5m)"),
        ("-5s", "invalid duration \"-5s\" (must not be negative)"),
        ("9999999999h", "invalid duration \"9999999999h\" (too large)"),
        ("99999999999999999999999999999999999999999s", "invalid duration \"99999999999999999999999999999999999999999s\" (too large)"),
    ])
    func invalidDuration(text: String, message: String) {
        #expect(throws: UnitError.self) { try ConfigUnits.duration(text) }
        do throws(UnitError) {
            _ = try ConfigUnits.duration(text)
        } catch {
            #expect(error.description == message)
        }
    }

    @Test("valid sizes", arguments: [
        ("0", 0), ("512", 512), ("512B", 512), ("64KiB", 65_536), ("10MiB", 10_485_760),
        ("1GiB", 1_073_741_824), ("1TiB", 1_099_511_627_776), ("10KB", 10_000), ("10MB", 10_000_000),
        ("1GB", 1_000_000_000), ("1.5KiB", 1536), ("0.5MB", 500_000),
    ])
    func validSize(text: String, expected: Int) throws {
        #expect(try ConfigUnits.byteSize(text) == expected)
    }

    @Test("invalid sizes", arguments: [
        ("10x", "invalid size \"10x\" (expected e.g. 512B, 64KiB, 10MiB, 1GB)"),
        ("KiB", "invalid size \"KiB\" (expected e.g. 512B, 64KiB, 10MiB, 1GB)"),
        ("10kib", "invalid size \"10kib\" (expected e.g. 512B, 64KiB, 10MiB, 1GB)"),
        ("1.5", "invalid size \"1.5\" (expected e.g. 512B, 64KiB, 10MiB, 1GB)"),
        ("-1KiB", "invalid size \"-1KiB\" (must not be negative)"),
        ("9999999999GiB", "invalid size \"9999999999GiB\" (too large)"),
        ("99999999999999999999", "invalid size \"99999999999999999999\" (too large)"),
    ])
    func invalidSize(text: String, message: String) {
        do throws(UnitError) {
            let value = try ConfigUnits.byteSize(text)
            Issue.record("expected an error, got \(value)")
        } catch {
            #expect(error.description == message)
        }
    }

    @Test("valid rates", arguments: [
        ("100/s", 100.0, Duration.seconds(1), 100.0),
        ("6000/m", 6000, .seconds(60), 100),
        ("10/h", 10, .seconds(3600), 10.0 / 3600),
        ("5/10s", 5, .seconds(10), 0.5),
        ("0.5/s", 0.5, .seconds(1), 0.5),
        ("1/250ms", 1, .milliseconds(250), 4),
    ])
    func validRate(text: String, count: Double, per: Duration, perSecond: Double) throws {
        let rate = try ConfigUnits.rate(text)
        #expect(rate == Rate(count: count, per: per))
        #expect(abs(rate.perSecond - perSecond) < 1e-9)
    }

    @Test("invalid rates", arguments: [
        ("100", "invalid rate \"100\" (expected e.g. 100/s, 6000/m, 10/h)"),
        ("100/x", "invalid rate \"100/x\" (expected e.g. 100/s, 6000/m, 10/h)"),
        ("abc/s", "invalid rate \"abc/s\" (expected e.g. 100/s, 6000/m, 10/h)"),
        ("/s", "invalid rate \"/s\" (expected e.g. 100/s, 6000/m, 10/h)"),
        ("-1/s", "invalid rate \"-1/s\" (must not be negative)"),
        ("0/s", "invalid rate \"0/s\" (must be greater than zero)"),
        ("5/0s", "invalid rate \"5/0s\" (period must be greater than zero)"),
        ("1/s/s", "invalid rate \"1/s/s\" (expected e.g. 100/s, 6000/m, 10/h)"),
        // Found by ParserFuzzTests: this used to overflow when the default burst was computed.
        ("99999999999999999999999/s", "invalid rate \"99999999999999999999999/s\" (must be at most 1000000000 per second)"),
        ("2000000/1ms", "invalid rate \"2000000/1ms\" (must be at most 1000000000 per second)"),
    ])
    func invalidRate(text: String, message: String) {
        do throws(UnitError) {
            let value = try ConfigUnits.rate(text)
            Issue.record("expected an error, got \(value)")
        } catch {
            #expect(error.description == message)
        }
    }
}
