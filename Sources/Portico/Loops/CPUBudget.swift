import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// How many cores this process may use: what `listen.threads: auto` follows. The smallest of
/// - the affinity mask (`taskset`, `sched_setaffinity`; Kubernetes' static CPU manager),
/// - the cgroup's cpuset (`cpuset.cpus.effective` in cgroup v2, `cpuset.effective_cpus` or
///   `cpuset.cpus` in v1), and
/// - the cgroup's CPU quota, rounded up (`cpu.max` in v2, `cpu.cfs_quota_us` / `cpu.cfs_period_us`
///   in v1; a container limited to 2.5 CPUs gets 3), over the process's cgroup and its ancestors.
/// More threads than that only add wake-ups and lock hand-offs (bench/RESULTS.md).
public struct CPUBudget: Sendable, Equatable, CustomStringConvertible {
    public var cores: Int
    /// What set it: `affinity`, `cpuset`, `quota`, or `online` (nothing narrower).
    public var limitedBy: String

    public var description: String { "\(cores) (\(limitedBy))" }

    /// The budget of this process, read from `/proc` and `/sys/fs/cgroup`.
    public static func current() -> CPUBudget {
        let files = FileReader(root: "")
        return resolve(online: onlineCores(), affinity: affinityCount(), cgroup: cgroupLimits(files))
    }

    /// The smallest limit that applies, and which one it is.
    static func resolve(online: Int, affinity: Int?, cgroup: (cpuset: Int?, quota: Int?)) -> CPUBudget {
        var budget = CPUBudget(cores: max(1, online), limitedBy: "online")
        for (count, name) in [(affinity, "affinity"), (cgroup.cpuset, "cpuset"), (cgroup.quota, "quota")] {
            if let count, count >= 1, count < budget.cores { budget = CPUBudget(cores: count, limitedBy: name) }
        }
        return budget
    }

    // MARK: - Parsing (pure, tested with fixtures)

    /// A Linux CPU list (`0-3,8,10-11`) → how many CPUs it names; `nil` when malformed or empty.
    static func count(cpuList: String) -> Int? {
        let text = cpuList.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !text.isEmpty else { return nil }
        var total = 0
        for part in text.split(separator: ",") {
            let bounds = part.split(separator: "-", omittingEmptySubsequences: false)
            switch bounds.count {
            case 1:
                guard Int(bounds[0]) != nil else { return nil }
                total += 1
            case 2:
                guard let low = Int(bounds[0]), let high = Int(bounds[1]), low <= high else { return nil }
                total += high - low + 1
            default:
                return nil
            }
        }
        return total
    }

    /// cgroup v2 `cpu.max` (`"max 100000"`, `"250000 100000"`) → cores, rounded up; `nil` for no limit.
    static func cores(cpuMax: String) -> Int? {
        let fields = cpuMax.split(whereSeparator: \.isWhitespace)
        guard fields.count >= 1, fields[0] != "max", let quota = Int(fields[0]), quota > 0 else { return nil }
        let period = fields.count > 1 ? Int(fields[1]) ?? 100_000 : 100_000
        return cores(quota: quota, period: period)
    }

    /// A quota over a period (both in µs) → cores, rounded up; `nil` for no limit (quota ≤ 0).
    static func cores(quota: Int, period: Int) -> Int? {
        guard quota > 0, period > 0 else { return nil }
        return max(1, (quota + period - 1) / period)
    }

    /// `/proc/self/cgroup` → the v2 path (`0::/path`) and the v1 paths by controller.
    static func cgroupPaths(_ text: String) -> (unified: String?, v1: [String: String]) {
        var unified: String?
        var v1: [String: String] = [:]
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            guard fields.count == 3 else { continue }
            if fields[0] == "0" && fields[1].isEmpty {
                unified = String(fields[2])
            } else {
                for controller in fields[1].split(separator: ",") { v1[String(controller)] = String(fields[2]) }
            }
        }
        return (unified, v1)
    }

    /// Reads files under `root` (tests point it at a fixture tree).
    struct FileReader {
        var root: String
        func read(_ path: String) -> String? {
            try? String(contentsOfFile: root + path, encoding: .utf8)
        }
    }

    /// The cgroup's cpuset size and quota in cores, each `nil` when none applies.
    static func cgroupLimits(_ files: FileReader) -> (cpuset: Int?, quota: Int?) {
        guard let text = files.read("/proc/self/cgroup") else { return (nil, nil) }
        let paths = cgroupPaths(text)
        var cpuset: Int?
        var quota: Int?
        func tighten(_ value: Int?, _ current: inout Int?) {
            if let value { current = min(current ?? value, value) }
        }
        // cgroup v2: mounted at /sys/fs/cgroup (or /sys/fs/cgroup/unified on hybrid systems).
        if let path = paths.unified {
            for mount in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
                for directory in ancestry(path) {
                    tighten(files.read(mount + directory + "/cpu.max").flatMap(cores(cpuMax:)), &quota)
                }
                tighten(files.read(mount + path + "/cpuset.cpus.effective").flatMap(count(cpuList:)), &cpuset)
            }
        }
        // cgroup v1.
        if let path = paths.v1["cpu"] {
            for directory in ancestry(path) {
                for mount in ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"] {
                    guard let quotaText = files.read(mount + directory + "/cpu.cfs_quota_us"),
                          let periodText = files.read(mount + directory + "/cpu.cfs_period_us"),
                          let q = Int(quotaText.trimmingCharacters(in: .whitespacesAndNewlines)),
                          let p = Int(periodText.trimmingCharacters(in: .whitespacesAndNewlines)) else { continue }
                    tighten(cores(quota: q, period: p), &quota)
                }
            }
        }
        if let path = paths.v1["cpuset"] {
            let directory = "/sys/fs/cgroup/cpuset" + (path == "/" ? "" : path)
            tighten((files.read(directory + "/cpuset.effective_cpus") ?? files.read(directory + "/cpuset.cpus"))
                .flatMap(count(cpuList:)), &cpuset)
        }
        return (cpuset, quota)
    }

    /// `/a/b` → `["/a/b", "/a", ""]`: a quota anywhere above the process's cgroup applies too.
    static func ancestry(_ path: String) -> [String] {
        var result: [String] = []
        var current = path == "/" ? "" : path
        while true {
            result.append(current)
            guard let slash = current.lastIndex(of: "/") else { return result }
            current = String(current[..<slash])
        }
    }

    // MARK: - The process

    static func onlineCores() -> Int {
        max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
    }

    /// CPUs in the process's affinity mask (`Cpus_allowed_list` in `/proc/self/status`, which
    /// `taskset` and `sched_setaffinity` set), `nil` if it cannot be read.
    static func affinityCount(_ files: FileReader = FileReader(root: "")) -> Int? {
        guard let status = files.read("/proc/self/status") else { return nil }
        for line in status.split(separator: "\n") where line.hasPrefix("Cpus_allowed_list:") {
            return count(cpuList: String(line.dropFirst("Cpus_allowed_list:".count)))
        }
        return nil
    }
}
