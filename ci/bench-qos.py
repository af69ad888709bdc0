#!/usr/bin/env python3
"""ci/bench qos (issue 38): per-namespace QoS limits, measured.

One pollux target process, one poll-mode reactor pinned to TARGET_CORE, serves one subsystem
with two RAM namespaces: nsid 1, the *tenant*, limited by `qos`, and nsid 2, the *neighbour*,
unlimited. Clients (`pollux perf`) run on CLIENT_CORE.

1. Accuracy: the tenant alone, flat out at QD32 (waiting in poll(2): --blocking, its I/O
   mostly held), under each cap of BENCH_QOS_CAPS, BENCH_QOS_REPS runs of BENCH_QOS_T s after
   a 0.5 s warmup (the first burst falls there): measured / cap, goal within 5 %.
     iops      qos = { iops = 20000 }, 4K random read
     mbps      qos = { mbps = 200 }, 128K sequential read (1600 IOPS)
     write     qos = { write_mbps = 100 }, 64K random write (R2T, 1600 IOPS)
2. Isolation: the neighbour's 4K random read at QD1 (busy-polling client) alone, against the
   same next to the tenant flat out at QD32 (4K random read, client --blocking) under
   `iops = BENCH_QOS_ISO_IOPS` (capped), in ABBA pairs (BENCH_QOS_PAIRS): the ratio of the
   neighbour's p99 (and p50, IOPS) next to the tenant over alone, per pair; goal: the median
   p99 ratio within 1.2. Each pair also runs, as controls, the neighbour next to the tenant
   without a limit but its client paced at the same rate (`paced`: the same load on the
   reactor and on the clients' core, without QoS: what the load itself costs the neighbour),
   and next to the tenant unlimited and flat out (`noisy`: what the cap spares it).

Each configuration starts its own target (the limits are the conf's). Writes
qos.runs.jsonl, qos.json and qos.md in OUT_DIR.

usage: bench-qos.py POLLUX_BIN OUT_DIR TARGET_CORE CLIENT_CORE
env: BENCH_QOS_T (3 s), BENCH_QOS_REPS (3), BENCH_QOS_PAIRS (4), BENCH_QOS_CAPS (iops mbps
     write; "none": no accuracy runs), BENCH_QOS_ISO_IOPS (20000), BENCH_QUICK=1 (1 rep, 1 pair
     of 1 s windows)
"""
import json
import os
import statistics
import subprocess
import sys
import time

from benchlib import free_port, start_target, stop_target

NQN = "nqn.2026-11.io.pollux:bench-qos"
HOST = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-0000000000b1"
# name: (qos table, perf workload, io size, the cap in the unit perf reports: IOPS)
CAPS = {
    "iops": ("{ iops = 20000 }", "randread", "4096", 20000.0),
    "mbps": ("{ mbps = 200 }", "read", "131072", 200.0 * 1048576 / 131072),
    "write": ("{ write_mbps = 100 }", "randwrite", "65536", 100.0 * 1048576 / 65536),
}


def conf(path, port, tcore, qos):
    tenant_qos = f"qos = {qos}\n" if qos else ""
    with open(path, "w") as f:
        f.write(f"""[reactors]
cores = [{tcore}]
mode = "poll"

[[listener]]
address = "127.0.0.1:{port}"

[transport]
io_queue_depth = 256

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
block_size = 4096
{tenant_qos}backend = {{ ram = {{ size = "256MiB" }} }}

[[subsystem.namespace]]
nsid = 2
block_size = 4096
backend = {{ ram = {{ size = "128MiB" }} }}
""")


def perf(pollux, port, ccore, nsid, args, t, warm, extra=()):
    trid = f"trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}"
    return subprocess.Popen(
        [pollux, "perf", "-r", trid, "--nsid", str(nsid), "-t", str(t), "--warmup", str(warm),
         "--cores", str(ccore), "--json", "--no-probe", "--hostnqn", HOST, *args, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def report(p, what, timeout):
    out, err = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"qos: {what} failed: {err.decode()[-500:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


def with_target(pollux, out, cfg, port, fn):
    logf = open(f"{out}/qos.target.log", "a")
    target = start_target(pollux, cfg, port, logf, "qos")
    try:
        return fn()
    finally:
        stop_target(target)
        logf.close()


def accuracy(pollux, out, port, tcore, ccore, name, t, rep):
    qos, workload, size, cap = CAPS[name]
    cfg = f"{out}/conf/qos-{name}.toml"
    conf(cfg, port, tcore, qos)

    def run():
        p = perf(pollux, port, ccore, 1, ["-q", "32", "-o", size, "-w", workload, "--span", "128MiB",
                                          "--blocking"], t, 0.5)
        return report(p, f"the {name} tenant", t + 60)

    r = with_target(pollux, out, cfg, port, run)
    return {"part": "accuracy", "cap": name, "rep": rep, "qos": qos, "workload": workload,
            "io_size": int(size), "cap_iops": cap, "iops": r["iops"], "ratio": r["iops"] / cap,
            "p50_ns": r["latency_ns"]["p50"], "p99_ns": r["latency_ns"]["p99"]}


def isolation(pollux, out, port, tcore, ccore, config, t, warm, pair, cap):
    """The neighbour's QD1 run alone (`alone`), or next to the tenant at QD32: flat out under
    `iops = cap` (`capped`), unlimited but paced at `cap` by its client (`paced`), or unlimited
    and flat out (`noisy`)."""
    qos = f"{{ iops = {cap} }}" if config == "capped" else None
    cfg = f"{out}/conf/qos-iso-{config}.toml"
    conf(cfg, port, tcore, qos)

    def run():
        tenant = None
        if config != "alone":
            pace = ["--rate", str(cap)] if config == "paced" else []
            tenant = perf(pollux, port, ccore, 1, ["-q", "32", "-o", "4096", "-w", "randread", "--span", "128MiB",
                                                   "--blocking", *pace], t + warm + 1.0, 0.0)
            time.sleep(0.5)
        fg = perf(pollux, port, ccore, 2, ["-q", "1", "-o", "4096", "-w", "randread", "--span", "64MiB"], t, warm)
        n = report(fg, "the neighbour", t + warm + 60)
        ten = report(tenant, "the tenant", t + warm + 60) if tenant else None
        return n, ten

    n, ten = with_target(pollux, out, cfg, port, run)
    lat = n["latency_ns"]
    return {"part": "isolation", "config": config, "pair": pair, "iops": n["iops"], "p50_ns": lat["p50"],
            "avg_ns": lat["avg"], "p99_ns": lat["p99"], "tenant_iops": ten["iops"] if ten else None}


def main():
    pollux, out, tcore, ccore = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    quick = os.environ.get("BENCH_QUICK") == "1"
    t = float(os.environ.get("BENCH_QOS_T", "1" if quick else "3"))
    reps = int(os.environ.get("BENCH_QOS_REPS", "1" if quick else "3"))
    pairs = int(os.environ.get("BENCH_QOS_PAIRS", "1" if quick else "4"))
    caps = [c for c in os.environ.get("BENCH_QOS_CAPS", "iops mbps write").split() if c != "none"]
    iso_cap = int(os.environ.get("BENCH_QOS_ISO_IOPS", "20000"))
    for c in caps:
        if c not in CAPS:
            raise SystemExit(f"qos: unknown cap {c} ({' '.join(CAPS)})")
    warm = 0.5
    os.makedirs(f"{out}/conf", exist_ok=True)
    open(f"{out}/qos.target.log", "w").close()
    port = free_port()
    runs = []
    for rep in range(reps):
        for name in caps:
            r = accuracy(pollux, out, port, tcore, ccore, name, t, rep)
            runs.append(r)
            print(f"qos: accuracy {name} rep {rep}: {r['iops']:.0f} IOPS for a cap of {r['cap_iops']:.0f} "
                  f"({r['ratio']:.4f})", flush=True)
    for pair in range(pairs):
        # ABBA: alone, capped, paced in even pairs, reversed in odd ones; the unlimited
        # tenant (for scale) last.
        order = ["alone", "capped", "paced"]
        if pair % 2:
            order.reverse()
        for config in order + ["noisy"]:
            r = isolation(pollux, out, port, tcore, ccore, config, t, warm, pair, iso_cap)
            runs.append(r)
            ten = f"; tenant {r['tenant_iops']:.0f} IOPS" if r["tenant_iops"] else ""
            print(f"qos: isolation pair {pair} {config}: neighbour QD1 p50 {r['p50_ns'] / 1e3:.1f} us "
                  f"p99 {r['p99_ns'] / 1e3:.1f} us, {r['iops']:.0f} IOPS{ten}", flush=True)
    with open(f"{out}/qos.runs.jsonl", "w") as f:
        for r in runs:
            f.write(json.dumps(r) + "\n")

    acc = {}
    for name in caps:
        rs = [r for r in runs if r["part"] == "accuracy" and r["cap"] == name]
        ratios = [r["ratio"] for r in rs]
        acc[name] = {"qos": rs[0]["qos"], "workload": rs[0]["workload"], "io_size": rs[0]["io_size"],
                     "cap_iops": rs[0]["cap_iops"], "median_iops": statistics.median(r["iops"] for r in rs),
                     "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
                     "within_5pct": all(abs(x - 1.0) <= 0.05 for x in ratios)}
    iso = [r for r in runs if r["part"] == "isolation"]
    ratios = []
    for pair in range(pairs):
        by = {r["config"]: r for r in iso if r["pair"] == pair}
        a = by["alone"]
        ratios.append({"pair": pair} | {
            f"{c}_{k}": by[c][k] / a[k] if a[k] else None
            for c in ("capped", "paced", "noisy") for k in ("p50_ns", "p99_ns", "iops")} | {
            f"capped_over_paced_{k}": by["capped"][k] / by["paced"][k] if by["paced"][k] else None
            for k in ("p50_ns", "p99_ns", "iops")})
    keys = [k for k in ratios[0] if k != "pair"]
    med = {k: statistics.median(r[k] for r in ratios if r[k] is not None) for k in keys}
    goal = {
        "caps_within_5pct": all(a["within_5pct"] for a in acc.values()) if acc else None,
        "neighbour_p99_within_1_2x": med["capped_p99_ns"] <= 1.2,
    }
    summary = {
        "bench": "qos",
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "window_s": t, "reps": reps, "pairs": pairs, "isolation_cap_iops": iso_cap,
        "accuracy": acc, "isolation_ratios_over_alone": ratios, "median_ratio": med, "goal": goal,
        "runs": runs,
    }
    with open(f"{out}/qos.json", "w") as f:
        json.dump(summary, f, indent=1)

    lines = [
        "# qos (issue 38): per-namespace QoS limits",
        "",
        f"One poll-mode reactor (core {tcore}), clients on core {ccore}; RAM namespaces; windows of {t} s "
        f"after a {warm} s warmup.",
        "",
    ]
    if acc:
        lines += [
            f"Accuracy: the limited namespace alone at QD32 (client waiting in poll(2)), {reps} runs per cap.",
            "",
            "| cap | workload | cap IOPS | median IOPS | median measured/cap | min | max | within 5 % |",
            "|---|---|---|---|---|---|---|---|",
        ]
    for name, a in acc.items():
        lines.append(f"| `qos = {a['qos']}` | {a['workload']} {a['io_size'] // 1024}K QD32 | {a['cap_iops']:.0f} | "
                     f"{a['median_iops']:.0f} | {a['median_ratio']:.4f} | {a['min_ratio']:.4f} | "
                     f"{a['max_ratio']:.4f} | {a['within_5pct']} |")
    lines += [
        "",
        f"Isolation: the unlimited neighbour namespace's 4K random read at QD1 alone, and next to the tenant "
        f"at QD32 (4K random read): flat out under `iops = {iso_cap}` (`capped`), unlimited but paced by its "
        f"client at {iso_cap} IOPS (`paced`), unlimited and flat out (`noisy`); {pairs} pairs, alone, capped "
        f"and paced in ABBA order, noisy last.",
        "",
        "| pair | config | neighbour p50 us | p99 us | IOPS | tenant IOPS |",
        "|---|---|---|---|---|---|",
    ]
    for r in iso:
        ten = f"{r['tenant_iops']:.0f}" if r["tenant_iops"] else "-"
        lines.append(f"| {r['pair']} | {r['config']} | {r['p50_ns'] / 1e3:.1f} | {r['p99_ns'] / 1e3:.1f} | "
                     f"{r['iops']:.0f} | {ten} |")
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    lines += ["", "Neighbour ratios per pair: over alone (capped, paced, noisy), and capped over paced:", "",
              "| pair | capped p50 | capped p99 | capped IOPS | paced p50 | paced p99 | paced IOPS | noisy p50 | "
              "noisy p99 | noisy IOPS | capped/paced p50 | capped/paced p99 |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ratios + [dict(med, pair="median")]:
        lines.append(f"| {r['pair']} | {fmt(r['capped_p50_ns'])} | {fmt(r['capped_p99_ns'])} | "
                     f"{fmt(r['capped_iops'])} | {fmt(r['paced_p50_ns'])} | {fmt(r['paced_p99_ns'])} | "
                     f"{fmt(r['paced_iops'])} | {fmt(r['noisy_p50_ns'])} | {fmt(r['noisy_p99_ns'])} | "
                     f"{fmt(r['noisy_iops'])} | {fmt(r['capped_over_paced_p50_ns'])} | "
                     f"{fmt(r['capped_over_paced_p99_ns'])} |")
    lines += ["", f"Goals: every cap within 5 %: {goal['caps_within_5pct']}; the neighbour's p99 next to the "
              f"capped tenant within 1.2x of alone (median): {goal['neighbour_p99_within_1_2x']}.", ""]
    with open(f"{out}/qos.md", "w") as f:
        f.write("\n".join(lines))
    caps_text = ", ".join("%s %.4f" % (n, a["median_ratio"]) for n, a in acc.items())
    print(f"qos: caps {caps_text or '-'}; neighbour p99 capped/alone {med['capped_p99_ns']:.3f}, "
          f"paced/alone {med['paced_p99_ns']:.3f}, capped/paced {med['capped_over_paced_p99_ns']:.3f}, "
          f"noisy/alone {med['noisy_p99_ns']:.3f}", flush=True)


if __name__ == "__main__":
    main()
