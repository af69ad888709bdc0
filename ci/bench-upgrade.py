#!/usr/bin/env python3
"""ci/bench upgrade (issue 39): what hosts see of `pollux ctl upgrade`.

One pollux process (reactors on TARGET_CORE and CLIENT_CORE's sibling set by the conf,
interrupt mode, a control socket, one 256 MiB RAM namespace) serves BENCH_UPGRADE_CONNS
I/O queues (default 64: `pollux perf --conns-per-core 64`, QD BENCH_UPGRADE_QD, 4K random
reads and writes with --verify, so a command lost or run twice fails the run) on
CLIENT_CORE. Each cycle is one perf run of BENCH_UPGRADE_T s; in an `upgrade` cycle
`pollux ctl upgrade` (to the same binary) runs 0.5 s in, in a `quiet` cycle nothing does.
Cycles alternate (quiet, upgrade, upgrade, quiet, ...) BENCH_UPGRADE_N times each (20).

Per upgrade cycle: the longest completion any queue saw (perf's max latency: the pause a
host queue sees, since every queue has commands in flight when the pause starts), the
target's own figures from the ctl answer (pause_ms: from the pause's start to the new
process taking over; total_ms: from the command to then), and the ctl command's wall time.
Per quiet cycle: the same max latency without an upgrade, the control. Reported: p50 and
max over cycles, and each upgrade cycle's max over the quiet cycle beside it.

Goal (issue 39): under 100 ms at the worst for 64 connections on this machine.

usage: bench-upgrade.py POLLUX_BIN OUT_DIR TARGET_CORE CLIENT_CORE
env: BENCH_UPGRADE_N (20), BENCH_UPGRADE_T (2 s), BENCH_UPGRADE_CONNS (64),
     BENCH_UPGRADE_QD (4), BENCH_QUICK=1 (3 of each)
"""
import json
import os
import statistics
import subprocess
import sys
import time

from benchlib import free_port, start_target, stop_target

NQN = "nqn.2026-12.io.pollux:bench-upgrade"


def conf(path, port, sock, tcore):
    with open(path, "w") as f:
        f.write(f"""[reactors]
cores = [{tcore}]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:{port}"

[transport]
max_connections = 1024
max_io_queues = 128

[control]
socket = "{sock}"

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "256MiB" }} }}
""")


def perf(pollux, port, ccore, t, conns, qd):
    trid = f"trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}"
    return subprocess.Popen(
        [pollux, "perf", "-r", trid, "-t", str(t), "-q", str(qd), "-w", "randrw", "--verify",
         "--span", "64MiB", "--cores", str(ccore), "--conns-per-core", str(conns), "--no-probe", "--json",
         "--timeout", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def main():
    pollux, out, tcore, ccore = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3], sys.argv[4]
    quick = os.environ.get("BENCH_QUICK") == "1"
    n = 3 if quick else int(os.environ.get("BENCH_UPGRADE_N", "20"))
    t = float(os.environ.get("BENCH_UPGRADE_T", "2"))
    conns = int(os.environ.get("BENCH_UPGRADE_CONNS", "64"))
    qd = int(os.environ.get("BENCH_UPGRADE_QD", "4"))
    os.makedirs(f"{out}/conf", exist_ok=True)
    port = free_port()
    sock = f"{out}/upgrade.sock"
    cfg = f"{out}/conf/upgrade.toml"
    conf(cfg, port, sock, tcore)
    logf = open(f"{out}/upgrade.target.log", "w")
    target = start_target(pollux, cfg, port, logf, "upgrade")
    runs = []
    order = []
    for i in range(n):
        order += ["quiet", "upgrade"] if i % 2 == 0 else ["upgrade", "quiet"]
    try:
        with open(f"{out}/upgrade.runs.jsonl", "w") as jl:
            for i, kind in enumerate(order):
                p = perf(pollux, port, ccore, t, conns, qd)
                ans = None
                wall = None
                if kind == "upgrade":
                    time.sleep(0.5)
                    t0 = time.time()
                    u = subprocess.run([pollux, "ctl", "--json", "--socket", sock, "upgrade", "--binary", pollux],
                                       capture_output=True, timeout=200)
                    wall = (time.time() - t0) * 1e3
                    if u.returncode != 0:
                        raise SystemExit(f"upgrade {i}: {u.stderr.decode()[-500:]}")
                    ans = json.loads(u.stdout)
                o, e = p.communicate(timeout=t + 120)
                if p.returncode != 0:
                    raise SystemExit(f"cycle {i} ({kind}): perf failed: {e.decode()[-800:]}")
                r = json.loads(o.decode().strip().splitlines()[-1])
                lat = r["latency_ns"]
                row = {"cycle": i, "kind": kind, "iops": r["iops"], "p50_ns": lat["p50"], "p99_ns": lat["p99"],
                       "max_ns": lat["max"], "errors": r.get("errors", 0)}
                if ans:
                    row.update({"pause_ms": ans["pause_ms"], "total_ms": ans["total_ms"], "ctl_wall_ms": wall,
                                "queues": ans["queues"], "pid": ans["pid"]})
                runs.append(row)
                jl.write(json.dumps(row) + "\n")
                print(f"upgrade: cycle {i:2} {kind:7} max {lat['max'] / 1e6:7.2f} ms  p99 {lat['p99'] / 1e3:8.1f} us"
                      + (f"  pause {ans['pause_ms']:6.1f} ms  total {ans['total_ms']:6.1f} ms  queues {ans['queues']}"
                         if ans else ""), flush=True)
    finally:
        # Whichever process serves now.
        subprocess.run([pollux, "ctl", "--socket", sock, "version"], capture_output=True)
        try:
            v = json.loads(subprocess.run([pollux, "ctl", "--json", "--socket", sock, "version"],
                                          capture_output=True).stdout)
            os.kill(int(v["pid"]), 15)
        except Exception:
            pass
        stop_target(target)
        logf.close()
    up = [r for r in runs if r["kind"] == "upgrade"]
    qu = [r for r in runs if r["kind"] == "quiet"]
    ratios = [u["max_ns"] / max(1, q["max_ns"]) for u, q in zip(up, qu)]
    ms = lambda ns: ns / 1e6
    summary = {
        "conns": conns, "qd": qd, "cycles": n, "t": t,
        "host_max_ms": {"upgrade_p50": ms(pct([r["max_ns"] for r in up], 0.5)),
                        "upgrade_max": ms(max(r["max_ns"] for r in up)),
                        "quiet_p50": ms(pct([r["max_ns"] for r in qu], 0.5)),
                        "quiet_max": ms(max(r["max_ns"] for r in qu))},
        "pause_ms": {"p50": pct([r["pause_ms"] for r in up], 0.5), "max": max(r["pause_ms"] for r in up)},
        "total_ms": {"p50": pct([r["total_ms"] for r in up], 0.5), "max": max(r["total_ms"] for r in up)},
        "ctl_wall_ms": {"p50": pct([r["ctl_wall_ms"] for r in up], 0.5), "max": max(r["ctl_wall_ms"] for r in up)},
        "max_ratio_upgrade_over_quiet": {"p50": statistics.median(ratios), "max": max(ratios)},
        "queues": up[0]["queues"] if up else 0,
        "goal_ms": 100.0,
    }
    summary["goal_met"] = summary["host_max_ms"]["upgrade_max"] < 100.0
    with open(f"{out}/upgrade.json", "w") as f:
        json.dump(summary, f, indent=1)
    h = summary["host_max_ms"]
    md = [
        f"# ci/bench upgrade: {conns} I/O queues at QD{qd}, 4K randrw --verify, {n} upgrades and {n} quiet cycles, alternating",
        "",
        "| | p50 over cycles | max over cycles |",
        "|---|---|---|",
        f"| longest completion a host saw, upgrade cycles (ms) | {h['upgrade_p50']:.1f} | {h['upgrade_max']:.1f} |",
        f"| longest completion a host saw, quiet cycles (ms) | {h['quiet_p50']:.1f} | {h['quiet_max']:.1f} |",
        f"| the target's pause: quiesce, handover, takeover (ms) | {summary['pause_ms']['p50']:.1f} | {summary['pause_ms']['max']:.1f} |",
        f"| command to the new process serving (ms) | {summary['total_ms']['p50']:.1f} | {summary['total_ms']['max']:.1f} |",
        f"| `pollux ctl upgrade` wall time (ms) | {summary['ctl_wall_ms']['p50']:.1f} | {summary['ctl_wall_ms']['max']:.1f} |",
        f"| upgrade max / the quiet cycle's beside it | {summary['max_ratio_upgrade_over_quiet']['p50']:.2f} | {summary['max_ratio_upgrade_over_quiet']['max']:.2f} |",
        "",
        f"Goal: under 100 ms at the worst: {'met' if summary['goal_met'] else 'not met'}.",
    ]
    with open(f"{out}/upgrade.md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
