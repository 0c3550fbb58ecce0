import CoreMetrics
import Metrics

/// Upgraded sessions' metrics: `portico_websocket_sessions` (open, per route),
/// `portico_websocket_bytes_total` (per route and `direction`: `client_to_upstream`,
/// `upstream_to_client`) and `portico_websocket_closes_total` (per route and `reason`, an
/// `UpgradeEndReason`). Recorded once when a session opens and once when it ends, never per
/// message. Labels are bounded: route names from configuration, two directions, four reasons.
final class UpgradeMetrics: Sendable {
    private let factory: any MetricsFactory
    private let bytes: LabelledCounters
    private let closes: LabelledCounters

    init(factory: any MetricsFactory) {
        self.factory = factory
        bytes = LabelledCounters("portico_websocket_bytes_total", factory: factory)
        closes = LabelledCounters("portico_websocket_closes_total", factory: factory)
    }

    private func sessions(route: String) -> Meter {
        Meter(label: "portico_websocket_sessions", dimensions: [("route", route)], factory: factory)
    }

    func opened(route: String) {
        sessions(route: route).increment()
    }

    func closed(route: String, _ summary: UpgradeSummary) {
        sessions(route: route).decrement()
        bytes.increment([("route", route), ("direction", "client_to_upstream")], by: Int64(summary.bytesFromClient))
        bytes.increment([("route", route), ("direction", "upstream_to_client")], by: Int64(summary.bytesFromUpstream))
        closes.increment([("route", route), ("reason", summary.reason.rawValue)])
    }
}
