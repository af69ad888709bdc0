#!/usr/bin/python3
"""Tables, JSON summaries and plots for ci/bench (see ci/BENCHMARKS.md).

    bench-report.py rates RUNS.jsonl FRACTION   "ns qd rate" lines: FRACTION of poll mode's
                                                 median saturating IOPS
    bench-report.py perf OUTDIR                 perf.json, perf.md, perf-iops.png, perf-p99.png
    bench-report.py modes OUTDIR                modes.json, modes.md, modes-cpu-p50.png
    bench-report.py reactor OUTDIR              reactor.md, reactor-wakeup.png (reactor.json
                                                 comes from the cargo bench)
    bench-report.py ab OUTDIR                   ab.json, ab.md: two binaries side by side
                                                 (per-pair ratios, instructions per I/O)
    bench-report.py results OUTDIR              results.json: every summary in OUTDIR (perf,
                                                 modes, reactor, file), each with when it was
                                                 written and the load average around it
"""

import datetime
import glob
import json
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict

# Issue 5 targets (shared/docs/prior-art.md: SPDK nvmf_tgt, 1 core, RAM bdev, spdk_nvme_perf).
SPDK_QD1_P50_US = 13.5
SPDK_QD1_IOPS = (71e3, 79e3)
SPDK_QD32_IOPS = 400e3
SPDK_QD32_RANGE = (378e3, 425e3)
# A cache line's round trip between the client's and the target's cores (pollux perf's
# "placement" probe, before and after each run): under this many ns both times, the host had
# the two vCPUs near each other (measured: 64-121 ns); at or above, apart (428-510 ns).
NEAR_NS = 250


def placement(r):
    """near / apart / moved (the probes disagree), or None without probes."""
    p = r.get("placement")
    if not p:
        return None
    near = [p["before_ns"] < NEAR_NS, p["after_ns"] < NEAR_NS]
    return "near" if all(near) else "apart" if not any(near) else "moved"


def load_runs(path):
    runs = []
    if not os.path.exists(path):
        return runs
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                runs.append(json.loads(line))
    return runs


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def us(ns):
    return None if ns is None else ns / 1000.0


def fmt(x, nd=1):
    if x is None:
        return "-"
    if isinstance(x, float) and abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{nd}f}"


def pct(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def kiops(x):
    return "-" if x is None else f"{x / 1000:.1f}K"


def summarize(runs):
    """Median over repeated runs of every figure of a pollux perf report."""
    def m(f):
        return med([f(r) for r in runs])

    tgt = [r for r in runs if r.get("target")]

    def tm(f):
        return med([f(r["target"]) for r in tgt]) if tgt else None

    iops = [r["iops"] for r in runs]

    def thr(prefix, key):
        return m(lambda r: sum(t[key] for t in r.get("thread_cpu", []) if t["name"].startswith(prefix)) if r.get("thread_cpu") else None)

    return {
        "target_user": thr("reactor-", "user"),
        "target_sys": thr("reactor-", "sys"),
        "client_user": thr("perf-", "user"),
        "client_sys": thr("perf-", "sys"),
        "runs": len(runs),
        "iops": m(lambda r: r["iops"]),
        "iops_min": min(iops) if iops else None,
        "iops_max": max(iops) if iops else None,
        # The least disturbed run (the machine is shared): best p50 and p99 over runs.
        "p50_best_us": min(us(r["latency_ns"]["p50"]) for r in runs) if runs else None,
        "p99_best_us": min(us(r["latency_ns"]["p99"]) for r in runs) if runs else None,
        "mib_s": m(lambda r: r["mib_s"]),
        "lat_us": {
            k: m(lambda r, k=k: us(r["latency_ns"][k]))
            for k in ["avg", "min", "p50", "p90", "p99", "p999", "p9999", "max"]
        },
        "lat_count": m(lambda r: r["latency_ns"]["count"]),
        "client_cpu": m(lambda r: r["client_cpu"]),
        "client_busy": m(lambda r: r["client_busy"]),
        "client_ns_per_io": m(lambda r: r["client_ns_per_io"]),
        "client_iterations_per_io": m(lambda r: r["client_iterations_per_io"]),
        "target_cpu": tm(lambda t: t["cpu"]),
        "target_ns_per_io": tm(lambda t: t["cpu_ns_per_io"]),
        "target_busy": tm(lambda t: t["reactors"][0]["busy"] if t["reactors"] else None),
        "mode_share": [tm(lambda t, i=i: t["reactors"][0]["mode_share"][i] if t["reactors"] else None) for i in range(3)],
        "switches": tm(lambda t: t["reactors"][0]["switches"] if t["reactors"] else None),
        "wakeups": tm(lambda t: t["reactors"][0]["wakeups"] if t["reactors"] else None),
    }


def load_note(out, name):
    """The machine's load average when the benchmark started and ended (ci/bench writes it)."""
    p = os.path.join(out, f"{name}.load")
    if not os.path.exists(p):
        return ""
    lines = [l.strip() for l in open(p) if l.strip()]
    return "Load average (1/5/15 min) at start and end: " + "; ".join(lines) + \
        " (2 cores: anything above ~2 besides this benchmark means other work competed for the CPUs)."


def plt_or_none():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        print("bench-report: matplotlib missing: no plots", file=sys.stderr)
        return None


# ------------------------------------------------------------------ rates

def cmd_rates(path, fraction):
    groups = defaultdict(list)
    for r in load_runs(path):
        t = r.get("tags", {})
        if t.get("load") == "saturating" and t.get("mode") == "poll":
            groups[(t["ns"], t["qd"])].append(r["iops"])
    for (ns, qd), v in sorted(groups.items()):
        print(ns, qd, f"{statistics.median(v) * fraction:.0f}")


# ------------------------------------------------------------------ perf

def callgrind_totals(path):
    """(role, instructions) of one callgrind per-thread file: the reactor thread runs
    Reactor::run, a client thread perf::worker::thread_body, the rest is the main thread."""
    with open(path, errors="replace") as f:
        text = f.read()
    m = re.search(r"^totals:\s+(\d+)", text, re.M) or re.search(r"^summary:\s+(\d+)", text, re.M)
    total = int(m.group(1)) if m else 0
    if re.search(r"^c?fn=.*worker::thread_body", text, re.M):
        role = "client"
    elif re.search(r"^c?fn=.*pollux_reactor::.*Reactor.*::run\b", text, re.M):
        role = "target"
    else:
        role = "main"
    return role, total


def callgrind_runs(cgdir):
    """{name: {ios: {role: Ir}}} from build/bench/callgrind/NAME.IOS.PID-TT files."""
    out = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    for p in glob.glob(os.path.join(cgdir, "*.*.*-*")):
        m = re.match(r"(.+)\.(\d+)\.\d+-\d+$", os.path.basename(p))
        if not m:
            continue
        role, total = callgrind_totals(p)
        out[m.group(1)][int(m.group(2))][role] += total
    return out


def annotate(cgdir, name, ios, role):
    """{function: self Ir} of the role's thread(s) in one run (callgrind_annotate)."""
    res = defaultdict(int)
    for p in glob.glob(os.path.join(cgdir, f"{name}.{ios}.*-*")):
        if callgrind_totals(p)[0] != role:
            continue
        try:
            txt = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100", p],
                                 capture_output=True, text=True, check=False).stdout
        except OSError:
            return res
        for line in txt.splitlines():
            m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*)$", line)
            if not m or "PROGRAM TOTALS" in line or m.group(2).startswith("=>"):
                continue
            fn = re.sub(r"\s+\[[^\]]*\]$", "", m.group(2))
            fn = re.sub(r"^\./\S+/", "", fn)
            fn = re.sub(r"^/rustc/[0-9a-f]+/library/", "std:", fn)
            res[fn] += int(m.group(1).replace(",", ""))
    return res


SYSCALLS = re.compile(r"^(recv|read|readv|write|writev|send|sendmsg|recvmsg|epoll_wait|epoll_pwait|poll|malloc|free|realloc|calloc)$")


def call_counts(path):
    """{callee: calls} of one callgrind file (libc wrappers: one call is one system call)."""
    names, out, cur = {}, defaultdict(int), None
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"^c?fn=\((\d+)\)(?: (.*))?$", line)
            if m:
                if m.group(2):
                    names[m.group(1)] = m.group(2).strip()
                if line.startswith("cfn"):
                    cur = names.get(m.group(1), m.group(1))
                continue
            if line.startswith("calls=") and cur:
                out[cur] += int(line.split()[0][6:])
    return out


def calls_per_io(cgdir, name, small, big, role):
    """System calls and allocations per I/O of a role (difference of the two runs)."""
    def total(ios):
        acc = defaultdict(int)
        for p in glob.glob(os.path.join(cgdir, f"{name}.{ios}.*-*")):
            if callgrind_totals(p)[0] == role:
                for k, v in call_counts(p).items():
                    if SYSCALLS.match(k):
                        acc[k] += v
        return acc
    a, b = total(small), total(big)
    return {k: round((b[k] - a.get(k, 0)) / (big - small), 2) for k in sorted(b) if abs(b[k] - a.get(k, 0)) / (big - small) >= 0.01}


def top_functions(cgdir, name, small, big, role, n=12):
    """The functions with the most self instructions per I/O: the difference of the two runs
    divided by the difference of their I/O counts (set-up, --fill and teardown cancel)."""
    a, b = annotate(cgdir, name, small, role), annotate(cgdir, name, big, role)
    d = big - small
    rows = sorted(((b[f] - a.get(f, 0)) / d, f) for f in b)
    rows.reverse()
    total = sum(max(0.0, x) for x, _ in rows) or 1.0
    return [(x, 100 * x / total, f[:120]) for x, f in rows[:n] if x > 0]


def cmd_perf(out):
    runs = load_runs(os.path.join(out, "perf.runs.jsonl"))
    by = defaultdict(list)
    order = []
    for r in runs:
        n = r["tags"]["name"]
        if n not in by:
            order.append(n)
        by[n].append(r)
    jobs = {}
    for n in order:
        if n.startswith(("pair-", "pair32-")):
            continue  # the pairs have their own section
        s = summarize(by[n])
        r0 = by[n][0]
        s.update(
            workload=r0["workload"], io_size=r0["io_size"], qd=r0["queue_depth"],
            digests=r0["hdgst"] or r0["ddgst"],
        )
        jobs[n] = s

    # Instructions per I/O.
    cgdir = os.path.join(out, "callgrind")
    pmu = open(os.path.join(cgdir, "pmu.txt")).read().strip() if os.path.exists(os.path.join(cgdir, "pmu.txt")) else "?"
    instr = instr_per_io(cgdir)
    tops = {}
    for name, counts in sorted(callgrind_runs(cgdir).items()):
        if name not in instr:
            continue
        ks = sorted(counts)
        a, b = ks[0], ks[-1]
        tops[name] = {role: top_functions(cgdir, name, a, b, role) for role in ("target", "client")}
        instr[name]["calls"] = {role: calls_per_io(cgdir, name, a, b, role) for role in ("target", "client")}

    goals = []
    qd1 = jobs.get("4k-randread-qd1")
    qd32 = jobs.get("4k-randread-qd32")
    if qd1:
        p50 = qd1["lat_us"]["p50"]
        goals.append({
            "goal": f"QD1 4K randread p50 <= {SPDK_QD1_P50_US} us (SPDK nvmf_tgt RAM bdev)",
            "measured": f"median {p50:.1f} us, best run {qd1['p50_best_us']:.1f} us ({kiops(qd1['iops'])} IOPS, best {kiops(qd1['iops_max'])}; SPDK {SPDK_QD1_IOPS[0]/1e3:.0f}-{SPDK_QD1_IOPS[1]/1e3:.0f}K)",
            "ratio": p50 / SPDK_QD1_P50_US,
            "met": p50 <= SPDK_QD1_P50_US,
        })
    if qd32:
        goals.append({
            "goal": f"QD32 4K randread > {SPDK_QD32_IOPS/1e3:.0f}K IOPS (SPDK {SPDK_QD32_RANGE[0]/1e3:.0f}-{SPDK_QD32_RANGE[1]/1e3:.0f}K)",
            "measured": f"median {kiops(qd32['iops'])} IOPS, best run {kiops(qd32['iops_max'])} (p50 {qd32['lat_us']['p50']:.1f} us)",
            "ratio": qd32["iops"] / SPDK_QD32_IOPS,
            "met": qd32["iops"] > SPDK_QD32_IOPS,
        })
    # QD1 against the loopback floor run next to it in the same rep (same bytes, plain TCP,
    # both sides spinning): the per-rep difference cancels the VM's drift between reps.
    floors = []
    for n in order:
        if not n.startswith("floor-") or n[len("floor-"):] not in by:
            continue
        job = n[len("floor-"):]
        fl = {r["tags"]["rep"]: us(r["latency_ns"]["p50"]) for r in by[n]}
        px = {r["tags"]["rep"]: us(r["latency_ns"]["p50"]) for r in by[job]}
        reps = sorted(set(fl) & set(px))
        if not reps:
            continue
        fi = {r["tags"]["rep"]: r["iops"] for r in by[n]}
        pi = {r["tags"]["rep"]: r["iops"] for r in by[job]}
        floors.append({
            "job": job,
            "qd": by[job][0]["queue_depth"],
            "pollux_iops": med([pi[k] for k in reps]),
            "floor_iops": med([fi[k] for k in reps]),
            "iops_ratio": med([pi[k] / fi[k] for k in reps]),
            "pollux_p50_us": med([px[k] for k in reps]),
            "floor_p50_us": med([fl[k] for k in reps]),
            "added_us": med([px[k] - fl[k] for k in reps]),
            "ratio": med([px[k] / fl[k] for k in reps]),
            "reps": len(reps),
            "per_rep": [{"rep": k, "pollux_p50_us": px[k], "floor_p50_us": fl[k],
                         "pollux_iops": pi[k], "floor_iops": fi[k]} for k in reps],
        })
    for f in floors:
        for g in goals:
            if f["job"] == "4k-randread-qd1" and g["goal"].startswith("QD1 "):
                g["measured"] += f"; the loopback floor in the same reps: {f['floor_p50_us']:.1f} us (pollux adds {f['added_us']:+.1f} us)"
            if f["job"] == "4k-randread-qd32" and g["goal"].startswith("QD32 "):
                g["measured"] += (f"; the loopback floor (plain TCP, the same bytes from random blocks of a RAM region "
                                  f"as large) in the same reps: {kiops(f['floor_iops'])} IOPS, pollux reaches "
                                  f"{f['iops_ratio']:.0%} of it")
    # QD1 in alternating 1 s pairs (floor, then pollux): the distribution of the differences.
    pairs = None
    fl = {r["tags"]["pair"]: us(r["latency_ns"]["p50"]) for r in by.get("pair-floor", [])}
    px = {r["tags"]["pair"]: us(r["latency_ns"]["p50"]) for r in by.get("pair-pollux", [])}
    keys = sorted(set(fl) & set(px), key=int)
    if keys:
        d = [px[k] - fl[k] for k in keys]
        q = statistics.quantiles(d, n=4) if len(d) >= 2 else [d[0], d[0], d[0]]
        pairs = {
            "pairs": len(keys),
            "seconds": round(med([r["seconds"] for r in by["pair-pollux"]]), 1),
            "floor_p50_us": med([fl[k] for k in keys]),
            "floor_range_us": [min(fl.values()), max(fl.values())],
            "pollux_p50_us": med([px[k] for k in keys]),
            "added_us": med(d),
            "added_quartiles_us": [q[0], q[2]],
            "pollux_at_goal": sum(px[k] <= SPDK_QD1_P50_US for k in keys),
            "floor_at_goal": sum(fl[k] <= SPDK_QD1_P50_US for k in keys),
            "per_pair": [{"pair": k, "pollux_p50_us": px[k], "floor_p50_us": fl[k]} for k in keys],
        }
        for g in goals:
            if g["goal"].startswith("QD1 "):
                g["measured"] += (f"; in {len(keys)} alternating {pairs['seconds']:g} s pairs pollux adds {pairs['added_us']:+.1f} us "
                                  f"to a floor of {pairs['floor_p50_us']:.1f} us")
    # QD32 in alternating 1 s pairs: pollux's IOPS over the floor's a second before.
    f32 = {r["tags"]["pair"]: r["iops"] for r in by.get("pair32-floor", [])}
    p32 = {r["tags"]["pair"]: r["iops"] for r in by.get("pair32-pollux", [])}
    k32 = sorted(set(f32) & set(p32), key=int)
    pairs32 = None
    if k32:
        pairs32 = {"pairs": len(k32), "seconds": round(med([r["seconds"] for r in by["pair32-pollux"]]), 1),
                   "iops_ratio": med([p32[k] / f32[k] for k in k32]),
                   "pollux_iops": med([p32[k] for k in k32]), "floor_iops": med([f32[k] for k in k32])}
        for g in goals:
            if g["goal"].startswith("QD32 "):
                g["measured"] += (f"; in {len(k32)} alternating {pairs32['seconds']:g} s pairs pollux reaches {pairs32['iops_ratio']:.0%} of the "
                                  f"floor (medians {kiops(pairs32['pollux_iops'])} and {kiops(pairs32['floor_iops'])})")
    # By placement: the same runs, grouped by where the host had the two vCPUs (the probes
    # before and after each run). SPDK's quiet-run figures (QD1 71-79K IOPS, avg 12.7-14.0 us)
    # are below this VM's loopback floor with the vCPUs apart (19-22 us), so they were taken
    # with them near each other: the like-for-like comparison is the "near" group.
    by_place = {}
    # Each figure: its runs (pollux's and the floor's jobs), the value of a run, and the goal its
    # near median is held to (met when `meets`; quoted once `min_runs` near runs exist).
    figures = {
        "qd1_p50_us": dict(label="QD1 4K randread p50 us (reps and pairs)", pollux=["4k-randread-qd1", "pair-pollux"],
                           floor=["floor-4k-randread-qd1", "pair-floor"], val=lambda r: us(r["latency_ns"]["p50"]),
                           show=fmt, unit="us", spdk=SPDK_QD1_P50_US, meets=lambda x: x <= SPDK_QD1_P50_US, min_runs=3,
                           goal=f"QD1 4K randread p50 <= {SPDK_QD1_P50_US} us, the two vCPUs near each other (as in SPDK's quiet runs)"),
        "qd32_iops": dict(label="QD32 4K randread IOPS (reps and pairs)", pollux=["4k-randread-qd32", "pair32-pollux"],
                          floor=["floor-4k-randread-qd32", "pair32-floor"], val=lambda r: r["iops"],
                          show=kiops, unit="IOPS", spdk=SPDK_QD32_IOPS, meets=lambda x: x > SPDK_QD32_IOPS, min_runs=2,
                          goal=f"QD32 4K randread > {SPDK_QD32_IOPS/1e3:.0f}K IOPS, the two vCPUs near each other"),
    }
    for key, fig in figures.items():
        g = {}
        for cls in ("near", "apart", "moved"):
            pv = [fig["val"](r) for n in fig["pollux"] for r in by.get(n, []) if placement(r) == cls]
            fv = [fig["val"](r) for n in fig["floor"] for r in by.get(n, []) if placement(r) == cls]
            g[cls] = {"pollux": med(pv), "pollux_runs": len(pv), "floor": med(fv), "floor_runs": len(fv)}
        if not any(v["pollux_runs"] or v["floor_runs"] for v in g.values()):
            continue
        by_place[key] = g
        near = g["near"]
        if near["pollux_runs"] >= fig["min_runs"]:
            show, unit = fig["show"], fig["unit"]
            goals.append({
                "goal": fig["goal"],
                "measured": (f"median {show(near['pollux'])} {unit} over the {near['pollux_runs']} runs (reps and pairs) with a "
                             f"cache-line round trip under {NEAR_NS} ns before and after; the floor in its "
                             f"{near['floor_runs']} such runs: {show(near['floor'])} {unit}"),
                "ratio": near["pollux"] / fig["spdk"],
                "met": fig["meets"](near["pollux"]),
            })
        else:
            # Said rather than left out: a run the host kept apart cannot decide this goal,
            # and the floor's own figure there shows why.
            apart = g["apart"]
            show, unit = fig["show"], fig["unit"]
            seen = (f"; with them apart pollux's median was {show(apart['pollux'])} {unit} over {apart['pollux_runs']} runs "
                    f"and the floor's {show(apart['floor'])} {unit} over {apart['floor_runs']}") if apart["pollux_runs"] and apart["floor_runs"] else ""
            goals.append({
                "goal": fig["goal"],
                "measured": (f"not measured: {near['pollux_runs']} runs (fewer than {fig['min_runs']}) had the two vCPUs near "
                             f"each other{seen}"),
                "ratio": None,
                "met": None,
            })
    doc = {"jobs": jobs, "instructions_per_io": instr, "instructions_pmu": pmu, "goals": goals, "qd1_floor": floors,
           "qd1_pairs": pairs, "qd32_pairs": pairs32, "by_placement": by_place,
           "top_functions_per_io": {k: {r: [{"ir_per_io": a, "pct": b, "fn": c} for a, b, c in v] for r, v in t.items()} for k, t in tops.items()}}
    with open(os.path.join(out, "perf.json"), "w") as f:
        json.dump(doc, f, indent=2)

    L = ["# ci/bench perf", "",
         "RAM namespace (256 MiB, preconditioned with `--fill`), one poll-mode reactor; target and "
         "client in one process (`pollux perf --target-conf`), reactor and client pinned to "
         "different cores. Medians of the repeated runs; latency in us; IOPS range = min-max over runs; "
         "(best) = the lowest p50 of the runs, the least disturbed one on a shared machine.", "",
         "| job | IOPS | IOPS range | MiB/s | avg | p50 (best) | p90 | p99 | p99.9 | p99.99 | max | target CPU (user+sys) | target ns/IO | client ns/IO | client busy | client CPU (user+sys) |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, s in jobs.items():
        l = s["lat_us"]
        L.append(
            f"| {n} | {kiops(s['iops'])} | {kiops(s['iops_min'])}-{kiops(s['iops_max'])} | {fmt(s['mib_s'])} | {fmt(l['avg'])} | {fmt(l['p50'])} ({fmt(s['p50_best_us'])}) | "
            f"{fmt(l['p90'])} | {fmt(l['p99'])} | {fmt(l['p999'])} | {fmt(l['p9999'])} | {fmt(l['max'])} | "
            f"{pct(s['target_cpu'])} ({pct(s['target_user'])}+{pct(s['target_sys'])}) | {fmt(s['target_ns_per_io'], 0)} | "
            f"{fmt(s['client_ns_per_io'], 0)} | {pct(s['client_busy'])} | {pct(s['client_user'])}+{pct(s['client_sys'])} |")
    L += ["", "## Against the issue-5 targets", "", "| goal | measured | ratio | met |", "|---|---|---|---|"]
    for g in goals:
        ratio = "-" if g["ratio"] is None else f"{g['ratio']:.2f}"
        met = "not measured" if g["met"] is None else "yes" if g["met"] else "**no**"
        L.append(f"| {g['goal']} | {g['measured']} | {ratio} | {met} |")
    if floors:
        L += ["", "## Against the loopback floor", "",
              "`floor-*` rows: `pollux perf --floor`, the same bytes per command (a 72-byte capsule "
              "answered by a C2HData header and 4 KiB, or a capsule with 4 KiB answered by a 24-byte "
              "response) over plain loopback TCP between the same two cores, both sides busy-polling, "
              "no NVMe/TCP at all, each block read from or written to a random place of a 128 MiB region "
              "(the DRAM traffic of pollux's RAM namespace), run right before pollux's QD1 job in every rep. `added` is the median "
              "over reps of pollux's p50 minus the floor's in the same rep: what pollux (target and "
              "client) costs on top of the kernel's own round trip, with this VM's drift between reps "
              "cancelled.", "",
              "| job | pollux p50 us | floor p50 us | added us | ratio | per rep (pollux / floor) |", "|---|---|---|---|---|---|"]
        for f in floors:
            if f["qd"] != 1:
                continue
            per = ", ".join(f"{p['pollux_p50_us']:.1f} / {p['floor_p50_us']:.1f}" for p in f["per_rep"])
            L.append(f"| {f['job']} | {f['pollux_p50_us']:.1f} | {f['floor_p50_us']:.1f} | {f['added_us']:+.1f} | {f['ratio']:.2f} | {per} |")
        deep = [f for f in floors if f["qd"] != 1]
        if deep:
            L += ["", "Deeper queues against the floor: `pollux perf --floor -q N --span S`, the client keeping N "
                  "requests in flight and the floor's server answering every complete request of one read with "
                  "one `writev`, each block read from a random place of a region as large as pollux's span (the "
                  "DRAM reads a RAM namespace pays too). The ratio is the median over reps of pollux's IOPS over "
                  "the floor's in the same rep: the share of what plain TCP does on this machine that pollux reaches.", "",
                  "| job | pollux IOPS | floor IOPS | ratio | pollux p50 us | floor p50 us | per rep IOPS (pollux / floor) |",
                  "|---|---|---|---|---|---|---|"]
            for f in deep:
                per = ", ".join(f"{kiops(p['pollux_iops'])} / {kiops(p['floor_iops'])}" for p in f["per_rep"])
                L.append(f"| {f['job']} | {kiops(f['pollux_iops'])} | {kiops(f['floor_iops'])} | {f['iops_ratio']:.2f} | "
                         f"{f['pollux_p50_us']:.1f} | {f['floor_p50_us']:.1f} | {per} |")
    if pairs:
        L += ["", "## QD1 in alternating pairs", "",
              f"{pairs['pairs']} pairs of {pairs['seconds']:g} s QD1 4K random-read runs, `pollux perf --floor` then pollux, "
              "seconds apart: the difference within a pair is what pollux adds, with the spread that "
              "the few long reps above cannot give.", "",
              "| floor p50 median (range) | pollux p50 median | pollux - floor: median (quartiles) | "
              f"runs at or under {SPDK_QD1_P50_US} us: pollux / floor |", "|---|---|---|---|",
              f"| {pairs['floor_p50_us']:.1f} us ({pairs['floor_range_us'][0]:.1f}-{pairs['floor_range_us'][1]:.1f}) | "
              f"{pairs['pollux_p50_us']:.1f} us | {pairs['added_us']:+.2f} us ({pairs['added_quartiles_us'][0]:+.2f} / "
              f"{pairs['added_quartiles_us'][1]:+.2f}) | {pairs['pollux_at_goal']} / {pairs['floor_at_goal']} of {pairs['pairs']} |",
              "", "Per pair (pollux / floor): " + ", ".join(
                  f"{p['pollux_p50_us']:.1f} / {p['floor_p50_us']:.1f}" for p in pairs["per_pair"])]
    if by_place:
        L += ["", "## By placement of the two vCPUs", "",
              "`pollux perf` times a cache line's round trip between the client's core and the target's right "
              "before and after each run. On this VM the host moves the two vCPUs every few seconds between "
              f"places that share a cache (round trips of 64-121 ns) and places that do not (428-510 ns); the "
              "loopback round trip of every run follows (QD1 floor ~12-14 us near, ~19-22 us apart). "
              f"near: both probes under {NEAR_NS} ns; apart: both at or above; moved: one of each (placement "
              "changed during the run). SPDK's quiet-run figures (QD1 71-79K IOPS, avg 12.7-14.0 us) are below "
              "the floor with the vCPUs apart, so they compare with the near rows.", "",
              "| figure | placement | pollux: median (runs) | floor: median (runs) |", "|---|---|---|---|"]
        for key, g in by_place.items():
            label, show = figures[key]["label"], figures[key]["show"]
            for cls, v in g.items():
                if v["pollux_runs"] or v["floor_runs"]:
                    L.append(f"| {label} | {cls} | {show(v['pollux'])} ({v['pollux_runs']}) | {show(v['floor'])} ({v['floor_runs']}) |")
    L += ["", "## Instructions per I/O", "",
          f"Hardware counters: {pmu}. Counted with callgrind (user space only: the kernel's TCP "
          "work is not in these figures) as the difference of two count-based runs, target reactor "
          "in interrupt mode and client waiting in poll(2) so that idle spinning is not counted.", "",
          "System calls and allocations per I/O are counted the same way (calls of the libc wrappers; "
          "the client's are less exact: its poll(2) waits and partial reads depend on valgrind's scheduling).", "",
          "| job | target instructions/IO | client instructions/IO | target calls/IO | client calls/IO |", "|---|---|---|---|---|"]
    for n, v in instr.items():
        tc = ", ".join(f"{k} {x}" for k, x in v["calls"]["target"].items()) or "-"
        cc = ", ".join(f"{k} {x}" for k, x in v["calls"]["client"].items()) or "-"
        L.append(f"| {n} | {v['target']:,.0f} | {v['client']:,.0f} | {tc} | {cc} |")
    for n, t in tops.items():
        for role in ("target", "client"):
            if not t[role]:
                continue
            L += ["", f"Top functions, {role}, {n} (self instructions per I/O; `file:function` names the inlined source):", "",
                  "| Ir/IO | % | function |", "|---|---|---|"]
            for a, b, c in t[role]:
                L.append(f"| {a:,.0f} | {b:.1f} | `{c}` |")
    L[2:2] = [load_note(out, "perf"), ""]
    with open(os.path.join(out, "perf.md"), "w") as f:
        f.write("\n".join(L) + "\n")

    plt = plt_or_none()
    if not plt:
        return
    for metric, fname, ylabel in [("iops", "perf-iops.png", "IOPS (thousands)"), ("p99", "perf-p99.png", "p99 latency (us)")]:
        fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
        for wl, style in [("randread", "o-"), ("randwrite", "s-")]:
            for dg in (False, True):
                pts = sorted(
                    (s["qd"], s["iops"] / 1e3 if metric == "iops" else s["lat_us"]["p99"])
                    for s in jobs.values()
                    if s["workload"] == wl and s["io_size"] == 4096 and s["digests"] == dg
                )
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style if not dg else style.replace("-", "--"),
                            label=f"4K {wl}{' + digests' if dg else ''}")
        if metric == "iops":
            ax.axhline(SPDK_QD32_IOPS / 1e3, color="gray", ls=":", label="SPDK QD32 4K randread (400K)")
            ax.set_ylim(bottom=0)
        else:
            ax.set_yscale("log")
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 8, 32, 128])
        ax.set_xticklabels(["1", "8", "32", "128"])
        ax.set_xlabel("queue depth")
        ax.set_ylabel(ylabel)
        ax.set_title(f"pollux, RAM namespace, 1 poll-mode reactor: {ylabel.split(' (')[0]} vs QD")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, fname))
        plt.close(fig)


# ------------------------------------------------------------------ modes

MODES = ["poll", "hybrid-linux", "hybrid", "interrupt", "adaptive"]
NS = ["ram", "sim10", "sim80"]


def cmd_modes(out):
    runs = load_runs(os.path.join(out, "modes.runs.jsonl"))
    by = defaultdict(list)
    for r in runs:
        t = r["tags"]
        by[(t["load"], t["mode"], t["ns"], int(t["qd"]))].append(r)
    rows = {}
    for k, rs in by.items():
        s = summarize(rs)
        s["rate"] = rs[0].get("rate")
        rows[k] = s

    def get(load, mode, ns, qd):
        return rows.get((load, mode, ns, qd))

    goals = []

    def goal(text, measured, met):
        goals.append({"goal": text, "measured": measured, "met": met})

    def paired(load, ns, qd, f):
        """Median over reps of f(adaptive run) / f(poll run) of the same rep: the two ran
        seconds apart, so the VM's drift between reps cancels out of the ratio."""
        runs_of = lambda m: {r["tags"]["rep"]: r for r in by.get((load, m, ns, qd), [])}
        pr, ar = runs_of("poll"), runs_of("adaptive")
        xs = [f(ar[k]) / f(pr[k]) for k in sorted(set(pr) & set(ar)) if f(pr[k])]
        return med(xs), len(xs)

    iops_of = lambda r: r["iops"]
    p50_of = lambda r: r["latency_ns"]["p50"]
    cpu_of = lambda r: r["target"]["cpu"] if r.get("target") else 0.0
    # sim 80 us QD1: adaptive >= 97% of poll's IOPS, p50 within 5%, CPU <= 30% of poll's.
    p, a = get("saturating", "poll", "sim80", 1), get("saturating", "adaptive", "sim80", 1)
    if p and a:
        (ri, n), (rp, _), (rc, _) = (paired("saturating", "sim80", 1, f) for f in (iops_of, p50_of, cpu_of))
        pair = f"median of {n} per-rep ratios"
        goal("sim 80 us QD1: adaptive IOPS >= 97% of poll", f"{ri:.1%} ({pair}; medians {kiops(a['iops'])} vs {kiops(p['iops'])})", ri >= 0.97)
        goal("sim 80 us QD1: adaptive p50 within 5% of poll", f"{rp:.3f}x ({pair}; medians {a['lat_us']['p50']:.1f} vs {p['lat_us']['p50']:.1f} us)", rp <= 1.05)
        goal("sim 80 us QD1: adaptive CPU <= 30% of poll", f"{rc:.1%} ({pair}; medians {a['target_cpu']:.1%} vs {p['target_cpu']:.1%} of a core)", rc <= 0.30)
    for ns in NS:
        p, a = get("saturating", "poll", ns, 32), get("saturating", "adaptive", ns, 32)
        if p and a:
            r, n = paired("saturating", ns, 32, iops_of)
            goal(f"{ns} QD32 saturating: adaptive IOPS within 2% of poll", f"{r:.1%} (median of {n} per-rep ratios; medians {kiops(a['iops'])} vs {kiops(p['iops'])})", r >= 0.98)
    # RAM QD1: adaptive not worse than the poll-interrupt line at its own CPU.
    for load, metric in [("saturating", "iops"), ("paced25", "p50")]:
        p, i, a = (get(load, m, "ram", 1) for m in ("poll", "interrupt", "adaptive"))
        if not (p and i and a):
            continue
        x0, x1, xa = i["target_cpu"], p["target_cpu"], a["target_cpu"]
        v = (lambda s: s["iops"]) if metric == "iops" else (lambda s: s["lat_us"]["p50"])
        y0, y1 = v(i), v(p)

        def line_at(x0, y0, x1, y1, xa):
            frac = 0.0 if x1 == x0 else min(1.0, max(0.0, (xa - x0) / (x1 - x0)))
            return y0 + frac * (y1 - y0)

        line = line_at(x0, y0, x1, y1, xa)
        best = max(y0, y1) if metric == "iops" else min(y0, y1)
        # Decided per rep, like the ratios above: adaptive against the line through that
        # rep's interrupt and poll runs (the three ran back to back), median over reps.
        rv = (lambda r: r["iops"]) if metric == "iops" else (lambda r: r["latency_ns"]["p50"])
        reps_of = lambda m: {r["tags"]["rep"]: r for r in by.get((load, m, "ram", 1), [])}
        ir, pr, ar = reps_of("interrupt"), reps_of("poll"), reps_of("adaptive")
        ks = sorted(set(ir) & set(pr) & set(ar))
        ratios = [rv(ar[k]) / line_at(cpu_of(ir[k]), rv(ir[k]), cpu_of(pr[k]), rv(pr[k]), cpu_of(ar[k])) for k in ks]
        r = med(ratios) if ratios else (v(a) / line)
        if metric == "iops":
            met = r >= 0.98
            txt = f"{r:.1%} of the line (median of {len(ratios)} per-rep ratios); medians: adaptive {kiops(v(a))} at {xa:.0%} CPU; line {kiops(line)}; interrupt {kiops(y0)} at {x0:.0%}, poll {kiops(y1)} at {x1:.0%}"
        else:
            met = r <= 1.02
            txt = f"{r:.1%} of the line (median of {len(ratios)} per-rep ratios); medians: adaptive p50 {v(a):.1f} us at {xa:.0%} CPU; line {line:.1f}; interrupt {y0:.1f} at {x0:.0%}, poll {y1:.1f} at {x1:.0%}"
        goal(f"RAM QD1 {load}: adaptive on or better than the poll-interrupt line at its CPU (best of the two: {fmt(best)})", txt, met)
    idle = {m: get("idle", m, "ram", 0) for m in MODES}
    wake = {m: get("wake", m, "ram", 1) for m in MODES}
    for m in MODES:
        # Poll mode spins by design; every other mode should sleep when idle.
        if idle[m] and m != "poll":
            c = idle[m]["target_cpu"]
            goal(f"idle, {m}: <= 1% CPU per reactor", f"{c:.2%}", c <= 0.01)
    # What waking costs is what a sleeping reactor adds over one that never sleeps: the control
    # is poll mode's first I/O after the same 1 s gap, measured in the same alternating rounds
    # (median of the rounds' medians), so the client's own wake-up, cold caches and the
    # loopback path after idle (all slow on this VM: see the ping-pong) are in both.
    pp_path = os.path.join(out, "pingpong.json")
    pingpong = json.load(open(pp_path)) if os.path.exists(pp_path) else []
    base_us = wake["poll"]["lat_us"]["p50"] if wake.get("poll") else None
    for m in MODES:
        if wake[m] and base_us is not None:
            add = wake[m]["lat_us"]["p50"] - base_us
            wake[m]["added_us"] = add
            if m != "poll":
                goal(f"wake-up from 1 s idle, {m}: adds <= 50 us", f"{add:+.1f} us (first I/O {wake[m]['lat_us']['p50']:.1f} us; poll mode's {base_us:.1f} us, {fmt(wake[m]['lat_count'], 0)} and {fmt(wake['poll']['lat_count'], 0)} samples per round)", add <= 50)

    doc = {
        "rows": [{"load": k[0], "mode": k[1], "ns": k[2], "qd": k[3], **v} for k, v in sorted(rows.items())],
        "goals": goals,
        "loopback_pingpong": pingpong,
    }
    with open(os.path.join(out, "modes.json"), "w") as f:
        json.dump(doc, f, indent=2)

    L = ["# ci/bench modes", "",
         "4K random reads; one reactor pinned to its own core, in-process target; RAM (256 MiB, 64 MiB "
         "span preconditioned) and simulated SSDs of 10 us and 80 us (lognormal, sigma 0.2). "
         "`saturating`: as fast as the queue depth allows; `paced25`: paced at 25% of poll mode's "
         "saturating IOPS (the same rate for every mode). Medians of the repeated runs. Target CPU is "
         "the reactor thread's CPU time over wall time; `vs poll` is its ratio to poll mode's.", ""]
    for ns in NS:
        L += [f"## {ns}", "",
              "| QD | load | mode | IOPS | p50 us | p99 us | p99.99 us | target CPU | vs poll | ns/IO | poll/hybrid/intr % | switches |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for qd in (1, 32):
            for load in ("saturating", "paced25"):
                pc = get(load, "poll", ns, qd)
                for m in MODES:
                    s = get(load, m, ns, qd)
                    if not s:
                        continue
                    l = s["lat_us"]
                    vs = s["target_cpu"] / pc["target_cpu"] if pc and pc["target_cpu"] else None
                    ms = "/".join(fmt(100 * x, 0) if x is not None else "-" for x in s["mode_share"])
                    L.append(f"| {qd} | {load} | {m} | {kiops(s['iops'])} | {fmt(l['p50'])} | {fmt(l['p99'])} | {fmt(l['p9999'])} | "
                             f"{fmt(100 * s['target_cpu'], 1)}% | {fmt(vs, 2)} | {fmt(s['target_ns_per_io'], 0)} | {ms} | {fmt(s['switches'], 0)} |")
        L.append("")
    L += ["## Idle and wake-up", "",
          "Idle: connected, no I/O for the measured seconds. Wake-up: one 4K read per second on RAM "
          "(each after ~1 s without I/O), median over alternating rounds of each round's median; "
          "`added` is that minus poll mode's (the control: its reactor never sleeps, and it runs in the "
          "same rounds). On this VM an isolated round trip is slow even when both sides spin (the bare "
          "loopback ping-pong below), so steady-state QD1 latency is not the baseline.", "",
          "| mode | idle target CPU | wake-up p50 us | wake-up max us | samples per round | added us |", "|---|---|---|---|---|---|"]
    for m in MODES:
        i, w = idle[m], wake[m]
        L.append(f"| {m} | {fmt(100 * i['target_cpu'], 2) + '%' if i else '-'} | {fmt(w['lat_us']['p50']) if w else '-'} | "
                 f"{fmt(w['lat_us']['max']) if w else '-'} | {fmt(w['lat_count'], 0) if w else '-'} | {fmt(w.get('added_us')) if w else '-'} |")
    if pingpong:
        L += ["", "Loopback TCP ping-pong without pollux (64 bytes, two busy-polling processes on the "
              "client and target cores), after a gap without traffic:", "",
              "| gap | p50 us | min us | samples |", "|---|---|---|---|"]
        for p in pingpong:
            L.append(f"| {p['gap_ms']:g} ms | {p['p50_us']:.1f} | {p['min_us']:.1f} | {p['samples']} |")
    L += ["", "## Goals (issue 7)", "", "| goal | measured | met |", "|---|---|---|"]
    for g in goals:
        L.append(f"| {g['goal']} | {g['measured']} | {'yes' if g['met'] else '**no**'} |")
    L[2:2] = [load_note(out, "modes"), ""]
    with open(os.path.join(out, "modes.md"), "w") as f:
        f.write("\n".join(L) + "\n")

    plt = plt_or_none()
    if not plt:
        return
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), dpi=100)
    colors = dict(zip(MODES, ["tab:red", "tab:orange", "tab:green", "tab:blue", "tab:purple"]))
    markers = dict(zip(MODES, ["o", "v", "^", "s", "D"]))
    for r, qd in enumerate((1, 32)):
        for c, ns in enumerate(NS):
            ax = axes[r][c]
            for m in MODES:
                for load, filled in (("saturating", True), ("paced25", False)):
                    s = get(load, m, ns, qd)
                    if not s:
                        continue
                    ax.scatter([100 * s["target_cpu"]], [s["lat_us"]["p50"]], s=70, marker=markers[m],
                               facecolors=colors[m] if filled else "none", edgecolors=colors[m], linewidths=1.8,
                               label=f"{m} ({'sat' if filled else '25%'})")
            ax.set_title(f"{ns}, QD{qd}")
            ax.set_xlabel("target reactor CPU (% of a core)")
            ax.set_ylabel("p50 latency (us)")
            ax.set_xlim(-5, 105)
            ax.grid(True, alpha=0.3)
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=5, fontsize=9)
    fig.suptitle("Reactor modes: median latency against target CPU (filled: saturating, hollow: paced at 25%)")
    fig.tight_layout(rect=(0, 0.09, 1, 0.96))
    fig.savefig(os.path.join(out, "modes-cpu-p50.png"))
    plt.close(fig)


# ------------------------------------------------------------------ ab

def quartiles(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None, None, None
    if len(xs) < 4:
        return xs[0], statistics.median(xs), xs[-1]
    q = statistics.quantiles(xs, n=4)
    return q[0], q[1], q[2]


def instr_per_io(cgdir):
    """{job: {role: instructions per I/O}} of one binary's callgrind runs."""
    out = {}
    for name, counts in sorted(callgrind_runs(cgdir).items()):
        ks = sorted(counts)
        if len(ks) < 2:
            continue
        a, b = ks[0], ks[-1]
        out[name] = {role: (counts[b][role] - counts[a][role]) / (b - a) for role in ("target", "client")}
    return out


def paired(runs, base, new):
    """{job: per-pair ratio quartiles and medians} of runs tagged side=BASE and side=NEW."""
    by = defaultdict(dict)  # (name, pair) -> {side: run}
    names = []
    for r in runs:
        t = r["tags"]
        if t["name"] not in names:
            names.append(t["name"])
        by[(t["name"], t["pair"])][t["side"]] = r
    jobs = {}
    for n in names:
        pairs = [(v[base], v[new]) for (name, _), v in by.items() if name == n and base in v and new in v]
        iops = [a["iops"] / b["iops"] for b, a in pairs if b["iops"]]
        dp50 = [us(a["latency_ns"]["p50"] - b["latency_ns"]["p50"]) for b, a in pairs]
        p50 = [us(a["latency_ns"]["p50"]) / us(b["latency_ns"]["p50"]) for b, a in pairs if b["latency_ns"]["p50"]]
        cpu = [a["target"]["cpu_ns_per_io"] / b["target"]["cpu_ns_per_io"] for b, a in pairs
               if a.get("target") and b.get("target") and b["target"]["cpu_ns_per_io"]]
        jobs[n] = {
            "pairs": len(pairs),
            "iops_ratio": quartiles(iops),
            "p50_ratio": quartiles(p50),
            "p50_diff_us": quartiles(dp50),
            "target_cpu_per_io_ratio": quartiles(cpu),
            f"{base}_iops_median": med([b["iops"] for b, _ in pairs]),
            f"{new}_iops_median": med([a["iops"] for _, a in pairs]),
            f"{base}_p50_us_median": med([us(b["latency_ns"]["p50"]) for b, _ in pairs]),
            f"{new}_p50_us_median": med([us(a["latency_ns"]["p50"]) for _, a in pairs]),
        }
    return jobs


def q3(t, nd=3):
    lo, mid, hi = t
    return "-" if mid is None else f"{mid:.{nd}f} ({lo:.{nd}f} / {hi:.{nd}f})"


def paired_table(jobs, new, base):
    lines = [f"| job | pairs | IOPS {new}/{base} | p50 {new}/{base} | p50 {new}-{base} (us) | "
             f"target CPU per I/O {new}/{base} |", "|---|---|---|---|---|---|"]
    for n, j in jobs.items():
        lines.append(f"| {n} | {j['pairs']} | {q3(j['iops_ratio'])} | {q3(j['p50_ratio'])} | "
                     f"{q3(j['p50_diff_us'], 2)} | {q3(j['target_cpu_per_io_ratio'])} |")
    return lines


def cmd_tls(out):
    runs = load_runs(os.path.join(out, "tls.runs.jsonl"))
    jobs = paired(runs, "plain", "tls")
    with open(os.path.join(out, "tls.json"), "w") as f:
        json.dump({"jobs": jobs}, f, indent=1)
    lines = ["# ci/bench tls: TLS 1.3 (PSK) against plain TCP, side by side", "",
             "One poll-mode target with a tls = \"allowed\" listener, RAM namespace; plain and TLS",
             "connections alternating in pairs (ABBA order), 1 s runs. Median of the per-pair",
             "figures, quartiles in brackets.", ""]
    lines += paired_table(jobs, "tls", "plain")
    with open(os.path.join(out, "tls.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def cmd_ab(out):
    runs = load_runs(os.path.join(out, "ab.runs.jsonl"))
    jobs = paired(runs, "base", "new")
    instr = {side: instr_per_io(os.path.join(out, "ab-callgrind", side)) for side in ("base", "new", "base2", "new2")}
    res = {"jobs": jobs, "instructions_per_io": instr}
    with open(os.path.join(out, "ab.json"), "w") as f:
        json.dump(res, f, indent=1)

    lines = ["# ci/bench ab: new against base, side by side", "",
             "Alternating pairs (ABBA order), 1 s runs, RAM namespace, poll-mode reactor. Median of the",
             "per-pair figures, quartiles in brackets.", ""]
    lines += paired_table(jobs, "new", "base")
    lines += ["", "Instructions per I/O (callgrind, difference of two run lengths, span unfilled; two",
              "rounds, base and new alternating):", "",
              "| job | target base | target new | client base | client new |", "|---|---|---|---|---|"]
    def cell(k, *sides):
        v = [instr[s].get(n, {}).get(k) for s in sides]
        return " / ".join("-" if x is None else f"{x:,.0f}" for x in v)
    for n in sorted(set(instr["base"]) | set(instr["new"])):
        lines.append(f"| {n} | {cell('target', 'base', 'base2')} | {cell('target', 'new', 'new2')} | "
                     f"{cell('client', 'base', 'base2')} | {cell('client', 'new', 'new2')} |")
    with open(os.path.join(out, "ab.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


# ------------------------------------------------------------------ reactor

def cmd_reactor(out):
    path = os.path.join(out, "reactor.json")
    with open(path) as f:
        d = json.load(f)
    L = ["# ci/bench reactor", "", "From `cargo bench -p pollux-reactor --bench reactor`.", "",
         "| wake-up method | sleep us | late p50 us | late p99 us |", "|---|---|---|---|"]
    for w in d.get("wakeup_error", []):
        L.append(f"| {w['method']} | {w['sleep_us']} | {w['late_p50_ns'] / 1e3:.2f} | {w['late_p99_ns'] / 1e3:.2f} |")
    L += ["", "| message round trip 0->1->0 | p50 us | p99 us |", "|---|---|---|"]
    for m in d.get("message_rtt", []):
        L.append(f"| {m['mode']} | {m['rtt_p50_ns'] / 1e3:.2f} | {m['rtt_p99_ns'] / 1e3:.2f} |")
    L += ["", "| mode | idle CPU |", "|---|---|"]
    for i in d.get("idle_cpu", []):
        L.append(f"| {i['mode']} | {100 * i['idle_cpu_fraction']:.2f}% |")
    with open(os.path.join(out, "reactor.md"), "w") as f:
        f.write("\n".join(L) + "\n")
    plt = plt_or_none()
    if not plt or not d.get("wakeup_error"):
        return
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    ws = d["wakeup_error"]
    labels = [f"{w['method']}\n{w['sleep_us']} us" for w in ws]
    x = range(len(ws))
    ax.bar([i - 0.2 for i in x], [w["late_p50_ns"] / 1e3 for w in ws], width=0.4, label="p50")
    ax.bar([i + 0.2 for i in x], [w["late_p99_ns"] / 1e3 for w in ws], width=0.4, label="p99")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("wake-up lateness (us)")
    ax.set_yscale("log")
    ax.set_title("Timed wake-up error by method and requested sleep")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "reactor-wakeup.png"))
    plt.close(fig)


def cmd_storm(out):
    """ci/bench-storm.py writes storm.json and storm.md itself: check they are there."""
    for name in ("storm.json", "storm.md"):
        if not os.path.exists(os.path.join(out, name)):
            raise SystemExit(f"storm: {name} missing")


def cmd_polling(out):
    """ci/bench-polling.py writes polling.json and polling.md itself: check they are there."""
    for name in ("polling.json", "polling.md"):
        if not os.path.exists(os.path.join(out, name)):
            raise SystemExit(f"polling: {name} missing")


def cmd_qos(out):
    """ci/bench-qos.py writes qos.json and qos.md itself: check they are there."""
    for name in ("qos.json", "qos.md"):
        if not os.path.exists(os.path.join(out, name)):
            raise SystemExit(f"qos: {name} missing")


def cmd_scale(out):
    """The scale bench (cargo bench -p pollux-target --bench scale) writes scale.json and
    scale.md itself: check they are there."""
    for name in ("scale.json", "scale.md"):
        if not os.path.exists(os.path.join(out, name)):
            raise SystemExit(f"scale: {name} missing")


def cmd_rbd(out):
    """ci/bench-rbd.py writes rbd.json and rbd.md: plot each cell's IOPS of rbd bench,
    fio-rbd and the pollux gateway (rbd-iops.png), and their p50 (rbd-p50.png)."""
    path = os.path.join(out, "rbd.json")
    if not os.path.exists(path) or not os.path.exists(os.path.join(out, "rbd.md")):
        raise SystemExit("rbd: rbd.json or rbd.md missing")
    with open(path) as f:
        cells = json.load(f)["cells"]
    plt = plt_or_none()
    if plt is None:
        return
    names = [f"{c['workload']}\nQD{c['qd']}" for c in cells]
    for what, keys, ylabel in (
        ("iops", ("rbd_bench_iops", "fio_iops", "pollux_iops"), "IOPS (median)"),
        ("p50", (None, "fio_p50_us", "pollux_p50_us"), "p50 latency, us (median)"),
    ):
        fig, ax = plt.subplots(figsize=(8, 4))
        for i, (k, label) in enumerate(zip(keys, ("rbd bench (librbd)", "fio rbd engine (librbd)", "pollux gateway"))):
            if k is None:
                continue
            ax.bar([x + (i - 1) * 0.27 for x in range(len(cells))], [c[k] or 0 for c in cells], 0.27, label=label)
        ax.set_xticks(range(len(cells)))
        ax.set_xticklabels(names)
        ax.set_ylabel(ylabel)
        ax.set_title("4K random I/O on a one-node Ceph cluster: librbd vs the pollux gateway")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"rbd-{what}.png"), dpi=100)
        plt.close(fig)


def cmd_resv(out):
    """The resv bench (cargo bench -p pollux-target --bench resv) writes resv.json and resv.md
    itself: check they are there, and plot each run's p50 and p99 (resv-latency.png)."""
    path = os.path.join(out, "resv.json")
    if not os.path.exists(path) or not os.path.exists(os.path.join(out, "resv.md")):
        raise SystemExit("resv: resv.json or resv.md missing")
    with open(path) as f:
        runs = json.load(f)["runs"]
    plt = plt_or_none()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    for cell, marker in (("target", "o"), ("cluster", "s")):
        rs = [r for r in runs if r["cell"] == cell]
        ax.plot([r["pair"] for r in rs], [r["p50_us"] for r in rs], marker=marker, label=f"{cell} p50")
        ax.plot([r["pair"] for r in rs], [r["p99_us"] for r in rs], marker=marker, linestyle="--",
                label=f"{cell} p99")
    ax.set_yscale("log")
    ax.set_xlabel("ABBA pair")
    ax.set_ylabel("reservation change round trip, us")
    ax.set_title("Register Replace: the target's own reservations vs kept in the cluster")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "resv-latency.png"), dpi=100)
    plt.close(fig)


def cmd_failover(out):
    """The failover bench (cargo bench -p pollux-target --bench failover) writes failover.json
    and failover.md itself: check they are there, and plot every cycle's stall
    (failover-stall.png)."""
    path = os.path.join(out, "failover.json")
    if not os.path.exists(path) or not os.path.exists(os.path.join(out, "failover.md")):
        raise SystemExit("failover: failover.json or failover.md missing")
    with open(path) as f:
        runs = json.load(f)["runs"]
    plt = plt_or_none()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    for cell, marker, label in (("group", "o", "gateway group"), ("none", "s", "no group")):
        rs = [r for r in runs if r["cell"] == cell]
        ax.plot([r["cycle"] for r in rs], [r["stall_s"] for r in rs], marker=marker, linestyle="", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("kill cycle")
    ax.set_ylabel("SIGKILL to the survivor's first write, s")
    ax.set_title("Failover of the gateway holding an RBD image's lock")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "failover-stall.png"), dpi=100)
    plt.close(fig)


def cmd_faults(out):
    """The fault campaign (cargo bench -p pollux-target --bench faults) writes faults.json and
    faults.md itself: check they are there."""
    for name in ("faults.json", "faults.md"):
        if not os.path.exists(os.path.join(out, name)):
            raise SystemExit(f"faults: {name} missing")


def cmd_group(out):
    """The group bench (cargo bench -p pollux-target --bench group) writes group.json and
    group.md itself: check they are there."""
    for name in ("group.json", "group.md"):
        if not os.path.exists(os.path.join(out, name)):
            raise SystemExit(f"group: {name} missing")


def cmd_fuzz(out):
    """ci/bench-fuzz.py writes fuzz.json and fuzz.md itself: check they are there."""
    for name in ("fuzz.json", "fuzz.md"):
        if not os.path.exists(os.path.join(out, name)):
            raise SystemExit(f"fuzz: {name} missing")


RESULT_SECTIONS = ("perf", "modes", "reactor", "file", "ab", "tls", "storm", "polling", "qos", "scale", "frontier",
                   "rbd", "resv", "failover", "group", "fuzz", "faults")


def cmd_results(out):
    """One file with every benchmark's summary, so that a run's figures travel together.

    A section is whatever its last run wrote (`ci/bench perf` alone leaves the modes from an
    earlier run): `written` and `load` say when, and under what load, each was measured."""
    results = {"generated": _utc(None), "sections": {}}
    for name in RESULT_SECTIONS:
        path = os.path.join(out, f"{name}.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            summary = json.load(f)
        load_path = os.path.join(out, f"{name}.load")
        load = None
        if os.path.exists(load_path):
            with open(load_path) as f:
                load = [line.split() for line in f if line.strip()]
        results["sections"][name] = {
            "written": _utc(os.path.getmtime(path)),
            "load_before_after": load,
            "summary": summary,
        }
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


def _utc(t):
    """`t` (seconds since the epoch, or now when None) as an ISO 8601 UTC time."""
    utc = datetime.timezone.utc
    ts = datetime.datetime.now(utc) if t is None else datetime.datetime.fromtimestamp(t, utc)
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ")


def main(argv):
    if len(argv) >= 3 and argv[1] == "rates":
        cmd_rates(argv[2], float(argv[3]) if len(argv) > 3 else 0.25)
    elif len(argv) == 3 and argv[1] in ("perf", "modes", "reactor", "results", "ab", "tls", "storm", "polling", "qos",
                                        "scale", "rbd", "resv", "failover", "group", "fuzz", "faults"):
        {"perf": cmd_perf, "modes": cmd_modes, "reactor": cmd_reactor, "results": cmd_results,
         "ab": cmd_ab, "tls": cmd_tls, "storm": cmd_storm, "polling": cmd_polling, "qos": cmd_qos,
         "scale": cmd_scale, "rbd": cmd_rbd, "resv": cmd_resv, "failover": cmd_failover,
         "group": cmd_group, "fuzz": cmd_fuzz, "faults": cmd_faults}[argv[1]](argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
