import Foundation

/// A peak-sensitive moving average of one endpoint's latency (Finagle's and linkerd2-proxy's
/// "peak EWMA"), as pure functions of two words: the estimate (nanoseconds, 0 = no sample yet)
/// and the instant of its last sample (nanoseconds on the upstream's clock). `EWMAPolicy` keeps
/// the two words per endpoint in each loop's row; nothing here touches memory.
///
/// - A sample above the estimate replaces it: one slow answer is seen at once.
/// - A sample below pulls it down with weight `1 - 2^(-elapsed / halfLife)`: a fast endpoint that
///   had one slow answer is trusted again within a few half-lives, not after one fast answer.
/// - Read, the estimate decays towards 0 with the same half-life since its last sample, so an
///   endpoint that lost every comparison (and so gets no samples) is eventually tried again
///   and measured anew, instead of being judged on an old peak for ever.
enum PeakEWMA {
    /// One second: long enough that one fast answer does not clear a slow peak (ten answers 10 ms
    /// apart take off 7 % of it), short enough that a passing stall (a GC pause, a busy core)
    /// stops steering traffic within two or three seconds, and that an endpoint that lost every
    /// comparison is measured again within a few. (linkerd2-proxy and Finagle decay over 10 s, for
    /// fleets where one stall is rare; a sidecar on a busy node sees them often.)
    static let halfLife: Int64 = 1_000_000_000

    /// The estimate after a sample of `sample` ns taken at `now`.
    static func update(estimate: Int64, lastSample: Int64, sample: Int64, now: Int64, halfLife: Int64 = halfLife) -> Int64 {
        let sample = max(1, sample)
        guard estimate > 0, sample < estimate else { return sample }
        let keep = weight(elapsed: now - lastSample, halfLife: halfLife)
        return max(1, Int64((Double(estimate) * keep + Double(sample) * (1 - keep)).rounded()))
    }

    /// The estimate as read at `now` (decayed since its last sample); 0 without a sample.
    static func current(estimate: Int64, lastSample: Int64, now: Int64, halfLife: Int64 = halfLife) -> Double {
        guard estimate > 0 else { return 0 }
        return Double(estimate) * weight(elapsed: now - lastSample, halfLife: halfLife)
    }

    /// What picking this endpoint costs: the estimate × (requests in flight + 1). An endpoint
    /// without a sample costs nothing while none of its requests is in flight (it is tried), and
    /// the most while one is (it is tried once, not flooded until its first answer).
    static func cost(estimate: Double, sampled: Bool, inFlight: Int) -> Double {
        guard sampled else { return inFlight <= 0 ? 0 : .infinity }
        return estimate * Double(max(0, inFlight) + 1)
    }

    /// `2^(-elapsed / halfLife)`: 1 for no time (or time running backwards), towards 0 after.
    @inline(__always)
    static func weight(elapsed: Int64, halfLife: Int64) -> Double {
        guard elapsed > 0 else { return 1 }
        return exp2(-Double(elapsed) / Double(halfLife))
    }
}
