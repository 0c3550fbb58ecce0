/// One stream's ends and inbound window, as a value: whether both sides have ended, and when
/// to send a WINDOW_UPDATE — once NIOHTTP2 reports the window half used, unless the relay's
/// reader is behind (`pause`): then the window stays shut until `resume`, so a slow client holds
/// at most a window of its stream's bytes while the connection's other streams flow.
struct HTTP2StreamFlow: Equatable {
    let target: Int
    private(set) var sentEnd = false
    private(set) var receivedEnd = false
    var headReceived = false
    private var paused = false
    /// The window as NIOHTTP2 last reported it (`nil`: not yet, it is the initial one).
    private var window: Int?

    init(target: Int) {
        self.target = target
    }

    var isClosed: Bool { sentEnd && receivedEnd }

    mutating func endSent() { sentEnd = true }
    mutating func endReceived() { receivedEnd = true }

    /// DATA arrived (or the window moved): the increment to send now, if any.
    mutating func windowChanged(to size: Int) -> Int? {
        window = size
        return increment()
    }

    mutating func pause() { paused = true }

    mutating func resume() -> Int? {
        paused = false
        return increment()
    }

    private mutating func increment() -> Int? {
        guard !paused, !receivedEnd, let size = window, size <= target / 2 else { return nil }
        window = target
        return target - size
    }
}
