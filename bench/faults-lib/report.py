#!/usr/bin/env python3
"""Judges one bench/faults scenario from loadgen.py's tally and prints a Markdown section.

  report.py SCENARIO TALLY.json [--fact key=value ...]

Exit status 1 when the scenario's requirement is not met; the section says which check failed.
"""
import argparse
import json
import sys

TITLES = {
    "upstream": "upstream killed (SIGKILL) and restarted mid-load",
    "reload": "configuration reloaded ten times (SIGHUP and POST /-/reload, alternating)",
    "idp": "token endpoint down 30 s (killed), then frozen 15 s (SIGSTOP)",
    "drain": "SIGTERM mid-load (graceful drain), five rounds",
    "endpoints": "one of three endpoints killed (SIGKILL) mid-load, restarted after its ejection",
}


def lost(outcomes):
    return {k: v for k, v in outcomes.items() if k.startswith("lost:")}


def not_sent(outcome):
    return outcome == "refused" or outcome.startswith("connect-error")


def answered(outcomes):
    return {k: v for k, v in outcomes.items() if not k.startswith("lost:") and not not_sent(k)}


def fmt(counts):
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "—"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=sorted(TITLES))
    p.add_argument("tally")
    p.add_argument("--fact", action="append", default=[])
    args = p.parse_args()
    facts = dict(f.split("=", 1) for f in args.fact)
    tally = json.load(open(args.tally))
    phases = {entry["phase"]: entry for entry in tally["phases"]}
    failures = []

    def check(condition, message):
        if not condition:
            failures.append(message)

    def statuses(phase):
        return answered(phases.get(phase, {"outcomes": {}})["outcomes"])

    total_lost = sum(sum(lost(e["outcomes"]).values()) for e in tally["phases"])
    max_latency = max((e["latency_max_ms"] for e in tally["phases"]), default=0)
    check(tally.get("unfinished_workers", 0) == 0, "a load worker never finished its last request")
    check(total_lost == 0, f"{total_lost} requests lost")
    bound_ms = float(facts.get("latency_bound_ms", "0"))
    if bound_ms:
        check(max_latency <= bound_ms, f"slowest answer {max_latency:.0f} ms exceeds the {bound_ms:.0f} ms bound")

    if args.scenario == "upstream":
        check(set(statuses("before")) == {"200"}, f"before the kill: {fmt(statuses('before'))}")
        down = set(statuses("down")) | set(statuses("restarting"))
        check(all(s.split()[0] in ("200", "502", "503", "504") for s in down), f"while down: {fmt(statuses('down'))}")
        check(set(statuses("after")) == {"200"}, f"after the upstream is back: {fmt(statuses('after'))}")
    elif args.scenario == "reload":
        everything = {}
        for e in tally["phases"]:
            for k, v in answered(e["outcomes"]).items():
                everything[k] = everything.get(k, 0) + v
        check(set(everything) == {"200"}, f"non-200 answers: {fmt(everything)}")
        versions = tally["bodies"].get("/version", {})
        check(len(versions) == 11, f"{len(versions)} configuration versions answered, expected 11 (v0..v10)")
        check(facts.get("reload_failures", "0") == "0", f"reloads not confirmed: {facts.get('reload_failures')}")
    elif args.scenario == "idp":
        allowed = {"200", "503 credentials_unavailable"}
        for phase in tally["phases"]:
            other = {k: v for k, v in answered(phase["outcomes"]).items() if k not in allowed}
            check(not other, f"{phase['phase']}: unexpected answers {fmt(other)}")
        for phase in ("before", "after-restart", "after-thaw"):
            check(set(statuses(phase)) <= {"200"} and statuses(phase), f"{phase}: {fmt(statuses(phase))}")
        for phase in ("killed", "frozen"):
            check("503 credentials_unavailable" in statuses(phase), f"{phase}: no 503 credentials_unavailable seen")
        for key in ("recovery_after_restart_s", "recovery_after_thaw_s"):
            check(facts.get(key, "never") != "never", f"{key}: no 200 within the wait")
    elif args.scenario == "drain":
        check(set(facts.get("exit_codes", "?").split()) == {"0"}, f"exit codes {facts.get('exit_codes')}")
        check(facts.get("probe_accepted", "1") == "0",
              f"{facts.get('probe_accepted')} new connections accepted after SIGTERM")
        slow = phases.get("draining", {"paths": {}})["paths"]
        slow_ok = sum(v.get("200", 0) for path, v in slow.items() if path.startswith("/nio/slow"))
        check(slow_ok > 0, "no slow request in flight at SIGTERM completed")
        # Once nothing is in flight the server closes: a request arriving on a still-open
        # connection in that instant is answered 503 shutting_down.
        for phase in tally["phases"]:
            other = {k: v for k, v in answered(phase["outcomes"]).items() if k not in ("200", "503 shutting_down")}
            check(not other, f"{phase['phase']}: unexpected answers {fmt(other)}")
        stopped = phases.get("stopped", {"outcomes": {}})["outcomes"]
        check(stopped.get("refused", 0) > 0 and not answered(stopped), f"after exit: {fmt(stopped)}")

    elif args.scenario == "endpoints":
        # With retry (/r/ on nio, /us/ on urlsession): no client sees an error, in any phase.
        # Without (/n/): at most consecutive_failures failures per in-flight worker before the ejection.
        no_retry_errors = 0
        for phase in tally["phases"]:
            for path, outcomes in phase["paths"].items():
                bad = {k: v for k, v in answered(outcomes).items() if k != "200"}
                if path.startswith("/r/") or path.startswith("/us/"):
                    check(not bad, f"{phase['phase']} {path}: errors despite retry: {fmt(bad)}")
                else:
                    no_retry_errors += sum(bad.values())
        bound = int(facts.get("consecutive_failures", "5")) * int(facts.get("no_retry_workers", "1"))
        check(no_retry_errors <= bound, f"{no_retry_errors} errors without retry, more than {bound}")
        facts["errors_without_retry"] = str(no_retry_errors)
        check(facts.get("time_to_ejection_s", "never") != "never", "the killed endpoint was never ejected")
        check(facts.get("traffic_back", "no") == "yes", "the restarted endpoint got no traffic back")

    print(f"#### {args.scenario}: {TITLES[args.scenario]}")
    print()
    print("| phase | sent | answered (by status) | lost | not sent (connect refused / failed) | p50 / p99 / max latency |")
    print("|---|---|---|---|---|---|")
    for e in tally["phases"]:
        o = e["outcomes"]
        a, l = answered(o), lost(o)
        sent = sum(a.values()) + sum(l.values())
        print(f"| {e['phase']} | {sent} | {fmt(a)} | {sum(l.values())}{' (' + fmt(l) + ')' if l else ''} | "
              f"{fmt({k: v for k, v in o.items() if not_sent(k)}) if any(map(not_sent, o)) else 0} | {e['latency_p50_ms']} / {e['latency_p99_ms']} / {e['latency_max_ms']} ms |")
    print()
    shown = {k: v for k, v in facts.items() if k != "latency_bound_ms"}
    if bound_ms:
        shown["latency bound"] = f"{bound_ms:.0f} ms"
    if args.scenario == "reload":
        shown["versions answered"] = ", ".join(sorted(tally["bodies"].get("/version", {}), key=lambda v: int(v[1:])))
    if shown:
        print("; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in shown.items()))
        print()
    print(("**PASS**" if not failures else "**FAIL**: " + "; ".join(failures)))
    print()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
