#!/usr/bin/env python3
"""ci/bench polling (issue 25): per-namespace polling against poll mode, side by side.

One pollux target process, one reactor pinned to TARGET_CORE, serves two namespaces at once:
a RAM namespace read at QD1 by a busy-polling `pollux perf` (the latency-critical host) and
an 80 us simulated SSD read in the background by a second `pollux perf` (QD1, paced at
BENCH_POLLING_BG_RATE IOPS, waiting in poll(2): --blocking), both clients on CLIENT_CORE.

Two configurations, alternating A B A B ... in one run (BENCH_POLLING_PAIRS pairs):
  poll     mode = "poll", both namespaces `auto`: the reference.
  polling  mode = "interrupt", the RAM namespace `always`, the simulated one `never`.

Each cycle starts the target, starts the background load, and measures two windows:
  active   the RAM QD1 run (BENCH_POLLING_T s after a warmup): its latency, and the reactor's
           CPU over the window: the time its thread was runnable (on CPU or waiting for it,
           /proc schedstat) / wall, which another process on the core cannot lower (its
           on-CPU share is reported too);
  bulk     BENCH_POLLING_IDLE_T s with only the background load (the RAM host gone for 1.5 s
           first: the `always` hold has lapsed): the reactor CPU the `never` namespace's
           traffic costs.
Reported per pair: polling/poll ratios of the RAM QD1 p50, average and p99 latency, of the
reactor CPU in each window and over the whole cycle (active + bulk), and the background's
IOPS in each. Goal (issue 25): the RAM p50 within 5 % of poll mode while the reactor spends
less CPU than in poll mode.

usage: bench-polling.py POLLUX_BIN OUT_DIR TARGET_CORE CLIENT_CORE
env: BENCH_POLLING_PAIRS (3), BENCH_POLLING_T (3 s), BENCH_POLLING_IDLE_T (3 s),
     BENCH_POLLING_BG_RATE (4000), BENCH_QUICK=1 (1 pair of 1 s windows)
"""
import json
import os
import statistics
import subprocess
import sys
import time

from benchlib import free_port, start_target, stop_target

NQN_FAST = "nqn.2026-11.io.pollux:bench-fast"
NQN_BULK = "nqn.2026-11.io.pollux:bench-bulk"


def conf(path, port, tcore, mode, fast, bulk):
    with open(path, "w") as f:
        f.write(f"""[reactors]
cores = [{tcore}]
mode = "{mode}"

[[listener]]
address = "127.0.0.1:{port}"

[transport]
io_queue_depth = 256

[[subsystem]]
nqn = "{NQN_FAST}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
block_size = 4096
polling = "{fast}"
backend = {{ ram = {{ size = "128MiB" }} }}

[[subsystem]]
nqn = "{NQN_BULK}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
block_size = 4096
polling = "{bulk}"
backend = {{ sim = {{ size = "128MiB", read = {{ fixed_us = 80.0 }}, write = {{ fixed_us = 80.0 }} }} }}
""")


def reactor_tid(pid):
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() == "reactor-0":
                    return tid
        except OSError:
            pass
    return None


def run_wait_ns(pid, tid):
    # schedstat: time on CPU, time runnable waiting for it (ns), timeslices: ns precision,
    # unlike stat's ticks.
    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
        v = f.read().split()
        return int(v[0]), int(v[1])


def sample(pid, tid):
    return (time.monotonic_ns(),) + run_wait_ns(pid, tid)


def cpu_between(a, b):
    """(on-CPU, runnable) shares of the wall time between samples a and b. Runnable (on CPU
    or waiting for it) is what the reactor asked for: on this shared VM another process on
    the reactor's core takes CPU from a spinning reactor, which lowers its on-CPU time but
    not the time it wanted; the goal is judged on it."""
    wall = max(1, b[0] - a[0])
    return (b[1] - a[1]) / wall, ((b[1] - a[1]) + (b[2] - a[2])) / wall


def cycle(pollux, out, name, cfg, port, ccore, t, idle_t, bg_rate, warm):
    log_path = f"{out}/polling.target.log"
    logf = open(log_path, "a")
    target = start_target(pollux, cfg, port, logf, "polling")
    bg = None
    try:
        # The listener may accept before the reactor thread is named: look for a while.
        tid = None
        for _ in range(100):
            tid = reactor_tid(target.pid)
            if tid is not None:
                break
            time.sleep(0.05)
        if tid is None:
            raise SystemExit("polling: no reactor-0 thread in the target")
        trid = lambda nqn: f"trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}"
        total_t = warm + t + 1.5 + idle_t + 2.0
        bg = subprocess.Popen(
            [pollux, "perf", "-r", trid(NQN_BULK), "-q", "1", "-o", "4096", "-w", "randread",
             "--rate", str(bg_rate), "--blocking", "-t", str(total_t), "--cores", str(ccore),
             "--json", "--no-probe", "--hostnqn", "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-0000000000b1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(0.5)
        # Active: the RAM host's QD1 run. Its warmup is left out of the CPU window too.
        fg = subprocess.Popen(
            [pollux, "perf", "-r", trid(NQN_FAST), "-q", "1", "-o", "4096", "-w", "randread",
             "--span", "64MiB", "-t", str(t), "--warmup", str(warm), "--cores", str(ccore),
             "--json", "--no-probe"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(warm + 0.3)
        a0 = sample(target.pid, tid)
        time.sleep(max(0.1, t - 0.6))
        a1 = sample(target.pid, tid)
        fout, ferr = fg.communicate(timeout=t + warm + 60)
        if fg.returncode != 0:
            raise SystemExit(f"polling: the RAM host failed: {ferr.decode()[-500:]}")
        rep = json.loads(fout.decode().strip().splitlines()[-1])
        # Bulk only: after the `always` hold has lapsed.
        time.sleep(1.5)
        b0 = sample(target.pid, tid)
        time.sleep(idle_t)
        b1 = sample(target.pid, tid)
        bout, berr = bg.communicate(timeout=total_t + 60)
        if bg.returncode != 0:
            raise SystemExit(f"polling: the background host failed: {berr.decode()[-500:]}")
        bgrep = json.loads(bout.decode().strip().splitlines()[-1])
    finally:
        if bg and bg.poll() is None:
            bg.kill()
        stop_target(target)
        logf.close()
    lat = rep["latency_ns"]
    act_s, bulk_s = (a1[0] - a0[0]) / 1e9, (b1[0] - b0[0]) / 1e9
    (act_on, act_cpu), (bulk_on, bulk_cpu) = cpu_between(a0, a1), cpu_between(b0, b1)
    return {
        "config": name,
        "ram_iops": rep["iops"],
        "ram_p50_ns": lat["p50"], "ram_avg_ns": lat["avg"], "ram_p99_ns": lat["p99"],
        "active_cpu": act_cpu, "bulk_cpu": bulk_cpu,
        "active_on_cpu": act_on, "bulk_on_cpu": bulk_on,
        # The cycle as a whole: active and bulk windows weighted by their lengths.
        "cycle_cpu": (act_cpu * act_s + bulk_cpu * bulk_s) / (act_s + bulk_s),
        "bg_iops": bgrep["iops"], "bg_p50_ns": bgrep["latency_ns"]["p50"],
    }


def main():
    pollux, out, tcore, ccore = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    quick = os.environ.get("BENCH_QUICK") == "1"
    pairs = int(os.environ.get("BENCH_POLLING_PAIRS", "1" if quick else "3"))
    t = float(os.environ.get("BENCH_POLLING_T", "1" if quick else "3"))
    idle_t = float(os.environ.get("BENCH_POLLING_IDLE_T", "1" if quick else "3"))
    bg_rate = float(os.environ.get("BENCH_POLLING_BG_RATE", "4000"))
    warm = 0.5
    os.makedirs(f"{out}/conf", exist_ok=True)
    port = free_port()
    cfgs = {
        "poll": (f"{out}/conf/polling-poll.toml", "poll", "auto", "auto"),
        "polling": (f"{out}/conf/polling-polling.toml", "interrupt", "always", "never"),
    }
    for path, mode, fast, bulk in cfgs.values():
        conf(path, port, tcore, mode, fast, bulk)
    open(f"{out}/polling.target.log", "w").close()
    runs = []
    for pair in range(pairs):
        for name in ("poll", "polling"):  # A B A B: poll first in every pair
            r = cycle(pollux, out, name, cfgs[name][0], port, ccore, t, idle_t, bg_rate, warm)
            r["pair"] = pair
            runs.append(r)
            print(f"polling: pair {pair} {name}: RAM QD1 p50 {r['ram_p50_ns'] / 1e3:.1f} us "
                  f"avg {r['ram_avg_ns'] / 1e3:.1f} us p99 {r['ram_p99_ns'] / 1e3:.1f} us; reactor CPU "
                  f"active {100 * r['active_cpu']:.0f} % bulk-only {100 * r['bulk_cpu']:.0f} % "
                  f"(on CPU {100 * r['active_on_cpu']:.0f} / {100 * r['bulk_on_cpu']:.0f} %); "
                  f"background {r['bg_iops']:.0f} IOPS", flush=True)
    with open(f"{out}/polling.runs.jsonl", "w") as f:
        for r in runs:
            f.write(json.dumps(r) + "\n")
    keys = ["ram_p50_ns", "ram_avg_ns", "ram_p99_ns", "ram_iops", "active_cpu", "bulk_cpu", "cycle_cpu", "bg_iops"]
    ratios = []
    for pair in range(pairs):
        a = next(r for r in runs if r["pair"] == pair and r["config"] == "poll")
        b = next(r for r in runs if r["pair"] == pair and r["config"] == "polling")
        ratios.append({k: b[k] / a[k] if a[k] else None for k in keys} | {"pair": pair})
    med = {k: statistics.median(r[k] for r in ratios if r[k] is not None) for k in keys}
    goal = {
        "ram_p50_within_5pct": med["ram_p50_ns"] <= 1.05,
        "less_cpu_than_poll": med["cycle_cpu"] < 1.0,
    }
    summary = {
        "bench": "polling",
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "pairs": pairs, "window_s": t, "bulk_window_s": idle_t, "bg_rate": bg_rate,
        "configs": {k: {"mode": v[1], "ram": v[2], "sim80": v[3]} for k, v in cfgs.items()},
        "ratios_polling_over_poll": ratios,
        "median_ratio": med,
        "goal": goal,
        "runs": runs,
    }
    with open(f"{out}/polling.json", "w") as f:
        json.dump(summary, f, indent=1)
    lines = [
        "# polling (issue 25): always RAM QD1 + never 80 us sim background, vs poll mode",
        "",
        f"One reactor (core {tcore}), clients on core {ccore}; {pairs} ABAB pairs; "
        f"RAM QD1 window {t} s, bulk-only window {idle_t} s, background QD1 at {bg_rate:.0f} IOPS.",
        "",
        "Reactor CPU: the share of wall time its thread was runnable (on CPU or waiting for it); "
        "on CPU alone in parentheses.",
        "",
        "| pair | config | RAM p50 us | RAM avg us | RAM p99 us | CPU active | CPU bulk-only | CPU cycle | bg IOPS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(f"| {r['pair']} | {r['config']} | {r['ram_p50_ns'] / 1e3:.1f} | {r['ram_avg_ns'] / 1e3:.1f} | "
                     f"{r['ram_p99_ns'] / 1e3:.1f} | {100 * r['active_cpu']:.0f} % ({100 * r['active_on_cpu']:.0f} %) | "
                     f"{100 * r['bulk_cpu']:.0f} % ({100 * r['bulk_on_cpu']:.0f} %) | "
                     f"{100 * r['cycle_cpu']:.0f} % | {r['bg_iops']:.0f} |")
    lines += ["", "Ratios polling/poll per pair:", "",
              "| pair | RAM p50 | RAM avg | RAM p99 | CPU active | CPU bulk-only | CPU cycle | bg IOPS |",
              "|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    for r in ratios + [dict(med, pair="median")]:
        lines.append(f"| {r['pair']} | {fmt(r['ram_p50_ns'])} | {fmt(r['ram_avg_ns'])} | {fmt(r['ram_p99_ns'])} | "
                     f"{fmt(r['active_cpu'])} | {fmt(r['bulk_cpu'])} | {fmt(r['cycle_cpu'])} | {fmt(r['bg_iops'])} |")
    lines += ["", f"Goal: RAM p50 within 5 % of poll: {goal['ram_p50_within_5pct']}; "
              f"less reactor CPU than poll over the cycle: {goal['less_cpu_than_poll']}.", ""]
    with open(f"{out}/polling.md", "w") as f:
        f.write("\n".join(lines))
    print(f"polling: median ratios polling/poll: RAM p50 {med['ram_p50_ns']:.3f} avg {med['ram_avg_ns']:.3f} "
          f"p99 {med['ram_p99_ns']:.3f}; CPU active {med['active_cpu']:.3f} bulk-only {med['bulk_cpu']:.3f} "
          f"cycle {med['cycle_cpu']:.3f}", flush=True)


if __name__ == "__main__":
    main()
