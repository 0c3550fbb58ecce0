/// The decisions of one hedged race, as a value (the middleware only performs them): which
/// outcome wins, which responses are discarded, how many attempts are cancelled.
///
/// The first *final* outcome wins — a response the retry would not retry. An outcome the retry
/// would retry (a listed status, a connect error, a timeout) never wins while another attempt
/// still runs; it is held, a response in preference to an error, the later of two alike. When
/// the last running attempt ends without a final outcome, the held or last one is the race's,
/// and the retry loop decides on it as on a single attempt.
struct HedgeRace {
    typealias Outcome = Result<GatewayResponse, any Error>

    enum Step {
        /// The race goes on; a held response replaced by a better outcome is discarded.
        case waiting(discard: GatewayResponse?)
        /// Attempt `number` (0: the first) won with `outcome`; `cancelling` attempts still run
        /// and are to be cancelled; a held response that lost is discarded.
        case won(number: Int, outcome: Outcome, cancelling: Int, discard: GatewayResponse?)
        /// An attempt ended after the race was over: its response, if any, is never read.
        case late(discard: GatewayResponse?)
    }

    private(set) var running = 1
    private(set) var launched = 1
    private(set) var over = false
    private var held: (number: Int, outcome: Outcome)?

    /// A hedge may go out: the race is on and an attempt still has no answer.
    var wantsHedge: Bool { !over && running > 0 }

    /// Attempt number `launched` goes out.
    mutating func hedgeSent() {
        precondition(wantsHedge, "a hedge after the race ended")
        launched += 1
        running += 1
    }

    /// Attempt `number` ended with `outcome`; `final`: the retry would not retry it.
    mutating func ended(_ number: Int, _ outcome: Outcome, final: Bool) -> Step {
        precondition(running > 0, "more attempts ended than were sent")
        running -= 1
        if over { return .late(discard: outcome.response) }
        if final || running == 0 {
            over = true
            var chosen = (number: number, outcome: outcome)
            var discard: GatewayResponse?
            if let held {
                if !final, held.outcome.response != nil, outcome.response == nil {
                    chosen = held
                } else {
                    discard = held.outcome.response
                }
            }
            self.held = nil
            return .won(number: chosen.number, outcome: chosen.outcome, cancelling: running, discard: discard)
        }
        if let held, held.outcome.response != nil, outcome.response == nil { return .waiting(discard: nil) }
        let replaced = held?.outcome.response
        held = (number, outcome)
        return .waiting(discard: replaced)
    }
}

extension Result where Success == GatewayResponse {
    var response: GatewayResponse? {
        if case .success(let response) = self { response } else { nil }
    }

    var failure: (any Error)? {
        if case .failure(let error) = self { error } else { nil }
    }
}
