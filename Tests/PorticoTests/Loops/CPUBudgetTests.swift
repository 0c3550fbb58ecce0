import Foundation
@testable import Portico
import PorticoTesting
import Testing

/// `listen.threads: auto` follows the cores the process may use (issue #33).
@Suite("CPU budget: affinity, cpuset and quota")
struct CPUBudgetTests {
    @Test("CPU lists count every CPU they name", arguments: [
        ("0", 1), ("0-3", 4), ("0-3,8,10-11", 7), ("5\n", 1), (" 0-1 ", 2),
    ])
    func cpuLists(list: String, count: Int) {
        #expect(CPUBudget.count(cpuList: list) == count)
    }

    @Test("malformed or empty CPU lists count as none", arguments: ["", "a", "3-1", "0-", "1-2-3", "0,,x"])
    func malformedLists(list: String) {
        #expect(CPUBudget.count(cpuList: list) == nil)
    }

    @Test("cpu.max quotas round up to whole cores; max is no limit")
    func quotas() {
        #expect(CPUBudget.cores(cpuMax: "max 100000") == nil)
        #expect(CPUBudget.cores(cpuMax: "200000 100000\n") == 2)
        #expect(CPUBudget.cores(cpuMax: "250000 100000") == 3)
        #expect(CPUBudget.cores(cpuMax: "50000 100000") == 1)
        #expect(CPUBudget.cores(quota: -1, period: 100_000) == nil)
        #expect(CPUBudget.cores(quota: 400_000, period: 100_000) == 4)
    }

    @Test("the smallest limit wins and is named")
    func resolution() {
        #expect(CPUBudget.resolve(online: 16, affinity: 16, cgroup: (nil, nil)) == CPUBudget(cores: 16, limitedBy: "online"))
        #expect(CPUBudget.resolve(online: 16, affinity: 4, cgroup: (8, 6)) == CPUBudget(cores: 4, limitedBy: "affinity"))
        #expect(CPUBudget.resolve(online: 16, affinity: 16, cgroup: (8, 3)) == CPUBudget(cores: 3, limitedBy: "quota"))
        #expect(CPUBudget.resolve(online: 16, affinity: 16, cgroup: (2, 3)) == CPUBudget(cores: 2, limitedBy: "cpuset"))
    }

    /// A fixture tree standing for `/`: cgroup files as a container runtime lays them out (removed
    /// when the test process exits).
    func fixture(_ files: [String: String]) throws -> CPUBudget.FileReader {
        let root = try ScratchDirectory.make("portico-cpu-budget").path
        for (path, text) in files {
            let url = URL(fileURLWithPath: root + path)
            try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
            try text.write(to: url, atomically: true, encoding: .utf8)
        }
        return CPUBudget.FileReader(root: root)
    }

    @Test("cgroup v2: the quota of the process's cgroup or any ancestor, and the effective cpuset")
    func cgroupV2() throws {
        let files = try fixture([
            "/proc/self/cgroup": "0::/kubepods/pod1/container\n",
            "/sys/fs/cgroup/kubepods/cpu.max": "max 100000\n",
            "/sys/fs/cgroup/kubepods/pod1/cpu.max": "150000 100000\n",
            "/sys/fs/cgroup/kubepods/pod1/container/cpu.max": "max 100000\n",
            "/sys/fs/cgroup/kubepods/pod1/container/cpuset.cpus.effective": "0-5\n",
        ])
        let limits = CPUBudget.cgroupLimits(files)
        #expect(limits.quota == 2)
        #expect(limits.cpuset == 6)
    }

    @Test("cgroup v1: cfs quota over period, and the cpuset controller's CPUs")
    func cgroupV1() throws {
        let files = try fixture([
            "/proc/self/cgroup": "4:memory:/docker/abc\n3:cpuset:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/\n",
            "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
            "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            "/sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus": "0-1\n",
        ])
        let limits = CPUBudget.cgroupLimits(files)
        #expect(limits.quota == 3)
        #expect(limits.cpuset == 2)
    }

    @Test("no cgroup files: no limit from them; the affinity mask from /proc/self/status")
    func noCgroup() throws {
        let files = try fixture(["/proc/self/status": "Name:\tportico\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\n"])
        #expect(CPUBudget.cgroupLimits(files).quota == nil)
        #expect(CPUBudget.affinityCount(files) == 2)
    }

    @Test("this process's budget is at least one core and at most the online ones")
    func thisProcess() {
        let budget = CPUBudget.current()
        #expect(budget.cores >= 1 && budget.cores <= CPUBudget.onlineCores())
    }
}
