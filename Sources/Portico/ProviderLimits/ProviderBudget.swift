import Foundation
import HTTPTypes

/// One scope's learned budget: what the provider said remains, until when, the windows'
/// reservations and what is in flight. Changed only under its shard's lock (`ProviderLimiter.update`).
extension ProviderLimiter {
    struct Budget {
        var remaining: Int?
        var reset: ContinuousClock.Instant?
        var limit: Int?
        /// The provider's window: what it said (`RateLimit-Policy`'s `w`), else the longest
        /// reset it has announced (a window's first answer announces about all of it).
        var window: Duration?
        var windowSaid = false
        /// `limit` is this gateway's guess, the provider never having said one (it sends only
        /// `Retry-After`): what it served in the last window it refused in — the successes of the
        /// requests that went in that window, whenever their answers come (a 429 may be the first),
        /// so never more than went — raised by one (a probe) after `probeAfter` windows in a row
        /// filled without a refusal, so a guess too low grows and one too high meets a 429.
        var limitGuessed = false
        /// Successful answers by the window their request went in (this one and the last; before
        /// a first guess all went in window 0, since the start), for that guess.
        var served: [Int: Int] = [:]
        /// The last window a request went in that a provider silent about its budget refused.
        var refusedWindow: Int?
        /// Requests that went in this window. A guess can fall below what was booked under it:
        /// a window then sends the guess, and its reservations beyond move to the next window.
        var sent = 0
        /// When this window's first and last went: how long its burst took to leave.
        var firstSent: ContinuousClock.Instant?
        var lastSent: ContinuousClock.Instant?
        /// What the last window that sent the whole guess without a refusal sent, and the guess
        /// to return to after a refusal lowered it below that (once, after one full window).
        var clean: Int?
        var ceiling: Int?
        /// After a probe's refusal, when the window after the hold's begins: one window after
        /// the refused one's end, the provider's schedule. The hold runs from the refused
        /// request, the last of its burst; following it would move our windows later by a
        /// burst's length each probe, until a burst began just before the provider's window.
        var anchor: ContinuousClock.Instant?
        var filledWindows = 0
        /// Full windows before the next probe: four, doubled by each probe refused (up to
        /// `maxProbeAfter`), four again after one held. A guess a probe has confirmed is
        /// probed ever less often: each probe past the real budget costs a refusal and a hold.
        var probeAfter = Budget.firstProbeAfter
        /// The guess now is a probe's, not yet filled or refused.
        var probing = false
        static let firstProbeAfter = 4
        static let maxProbeAfter = 32
        var hold: ContinuousClock.Instant?
        var inFlight = 0
        var waiting = 0
        /// The provider's windows are numbered as they pass: a reservation names the window
        /// it holds a slot in, not an instant, so a reset estimate that moves (every answer
        /// refines it) moves the reservations with it instead of sending them early.
        var windowNumber = 0
        /// Reservations by the window they hold a slot in (windows still to come), at most
        /// `limit` in each; a slot given up is free for the next arrival. Bounded: a reservation
        /// further than `max_wait` ahead is given up at once.
        var booked: [Int: Int] = [:]
        /// Reservations in the current window not yet claimed: this window's budget is theirs
        /// first, so neither a new arrival nor a provider's count taken before they went
        /// spends it.
        var due = 0
        var lastUsed: ContinuousClock.Instant

        /// The provider's window ended: its quota (when known) is the budget again, first for
        /// the requests that reserved a slot in it.
        mutating func roll(at now: ContinuousClock.Instant) {
            if let hold, now >= hold { self.hold = nil }
            while let reset, now >= reset {
                guard limit != nil else {
                    remaining = nil
                    booked = [:]
                    due = 0
                    self.reset = nil
                    return
                }
                nextWindow()
                if let anchor, anchor > reset {
                    self.reset = anchor
                } else if let window, window > .zero {
                    self.reset = reset.advanced(by: window)
                } else {
                    self.reset = nil
                }
                anchor = nil
            }
        }

        /// A new window of the provider's: its reservations become due (any of the last window's
        /// still unclaimed are late, and no longer hold its budget).
        mutating func nextWindow() {
            guard var limit else { return }
            let refused = refusedWindow == windowNumber
            if limitGuessed, refused {
                // A count served whole before and refused now: the provider may have lowered its
                // budget, or (it says nothing of when its window begins) its window began during
                // our last burst, whose tail it counted with this window's. Try that count again
                // once, after a full window at the lowered guess.
                ceiling = clean.flatMap { $0 > limit ? $0 : nil }
                if probing {
                    probeAfter = min(probeAfter * 2, Budget.maxProbeAfter)
                    probing = false
                }
            }
            if limitGuessed, sent >= limit, !refused {
                if probing {
                    probeAfter = Budget.firstProbeAfter
                    probing = false
                }
                clean = sent
                filledWindows += 1
                if let ceiling, ceiling > limit {
                    limit = ceiling
                    self.limit = limit
                    self.ceiling = nil
                    filledWindows = 0
                } else if filledWindows >= probeAfter {
                    // One more, not a share more: a probe past the provider's real budget then
                    // costs one refusal, the request that starts the hold; two or more would
                    // send the rest of the probe into a pause the provider has announced.
                    limit += 1
                    self.limit = limit
                    filledWindows = 0
                    probing = true
                }
            } else if refused {
                filledWindows = 0
            }
            sent = 0
            firstSent = nil
            lastSent = nil
            windowNumber += 1
            served = served.filter { $0.key >= windowNumber - 1 }
            due = booked.removeValue(forKey: windowNumber) ?? 0
            remaining = max(0, limit - due)
        }

        /// A slot in the first window to come that has one.
        mutating func book(limit: Int) -> Int {
            var number = windowNumber + 1
            while booked[number, default: 0] >= limit { number += 1 }
            booked[number, default: 0] += 1
            return number
        }

        /// When reserved window `number` is expected to begin.
        func start(ofWindow number: Int) -> ContinuousClock.Instant? {
            guard let reset else { return nil }
            guard number > windowNumber + 1, let window else { return reset }
            if let anchor, anchor > reset { return anchor.advanced(by: window * (number - windowNumber - 2)) }
            return reset.advanced(by: window * (number - windowNumber - 1))
        }

        /// An attempt goes in this window.
        mutating func went(at now: ContinuousClock.Instant) {
            inFlight += 1
            sent += 1
            if firstSent == nil { firstSent = now }
            lastSent = now
        }

        var idle: Bool { inFlight == 0 && waiting == 0 && booked.isEmpty && due == 0 }
    }
}
