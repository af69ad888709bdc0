#!/usr/bin/python3
"""The report of `ci/bench frontier` (issue 25, goal 2; see ci/BENCHMARKS.md).

    bench-frontier.py frontier OUTDIR   frontier.json, frontier.md, frontier-<device>.png
                                        from OUTDIR/frontier.runs.jsonl

Per cell (device, QD, load): each point's median p50, p99, IOPS and reactor CPU over its
runs; the Pareto frontier of (p50, reactor CPU) among the fixed points (poll, interrupt,
hybrid with the measured or a fixed wake margin, spinning or sleeping through the host's
turnaround); adaptive's point at each budget and its verdict:

    work     = poll mode's busy share / its IOPS: the reactor's CPU per I/O of real work in this
               cell (in poll mode every iteration either finds work or spins, so its busy share
               is exact; a sleeping mode's counts the wait that ends in an event as busy)
    idle(X)  = CPU(X) - IOPS(X) x work: the CPU X spends not doing I/O work (spinning, and the
               cost of its sleeps and wake-ups), which is what cpu_budget bounds (a saturated
               poll-mode reactor is at 100 % CPU and in budget)
    F        = the lowest-p50 frontier point with idle(F) <= budget + TOL: the best latency
               the budget allows among the fixed mechanisms
    pass     = p50(A) <= 1.05 p50(F) and CPU(A) <= CPU(F) + TOL and idle(A) <= budget + TOL

TOL is 0.02 of a core: one run's CPU figure moves by about that on this VM.
"""

import importlib.util
import json
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("bench_report", os.path.join(HERE, "bench-report.py"))
br = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(br)

TOL = 0.02
SLACK = 1.05
DEVICES = ["ram", "sim10", "sim80ln", "simgc"]
DEVICE_NAMES = {
    "ram": "RAM",
    "sim10": "sim 10 us (fixed)",
    "sim80ln": "sim 80 us lognormal (sigma 0.3)",
    "simgc": "sim bimodal (80 us, 2 % at 1 ms)",
}
LOADS = ["saturating", "paced25"]


def short(name):
    """A point's label on the plots."""
    if name == "poll":
        return "poll"
    if name == "interrupt":
        return "intr"
    if name.startswith("hybrid-"):
        _, m, t = name.split("-")
        return f"{m.replace('m', '', 1) if m != 'p99' else 'p99'}{'s' if t == 'spin' else 'z'}"
    return name


def point_summary(runs):
    s = br.summarize(runs)
    cpu = s["target_cpu"]
    busy = s["target_busy"]
    return {
        "runs": s["runs"],
        "p50_us": s["lat_us"]["p50"],
        "p99_us": s["lat_us"]["p99"],
        "iops": s["iops"],
        "cpu": cpu,
        "busy": busy,
        "idle_cpu": None,
        "mode_share": s["mode_share"],
        "switches": s["switches"],
        "rate": runs[0].get("rate") if runs else None,
    }


def is_adaptive(name):
    """Adaptive's points (this binary's, and BENCH_FRONTIER_BASE_BIN's `base-`): never fixed."""
    return name.startswith("adaptive-") or name.startswith("base-adaptive-")


def frontier_of(points):
    """Names of the fixed points that no other fixed point beats in both p50 and CPU."""
    ok = {n: p for n, p in points.items() if p["p50_us"] is not None and p["cpu"] is not None}
    front = []
    for n, p in ok.items():
        dominated = any(
            q["p50_us"] <= p["p50_us"] and q["cpu"] <= p["cpu"] and (q["p50_us"] < p["p50_us"] or q["cpu"] < p["cpu"])
            for m, q in ok.items() if m != n)
        if not dominated:
            front.append(n)
    return sorted(front, key=lambda n: (ok[n]["cpu"], ok[n]["p50_us"]))


def verdict(points, front, a, budget):
    """Adaptive's point `a` against the frontier `front` at `budget` (see the module doc)."""
    allowed = [n for n in front if points[n]["idle_cpu"] is not None and points[n]["idle_cpu"] <= budget + TOL]
    if a is None or not allowed:
        return None
    f = min(allowed, key=lambda n: (points[n]["p50_us"], points[n]["cpu"]))
    F = points[f]
    ratio = a["p50_us"] / F["p50_us"] if F["p50_us"] else None
    dcpu = a["cpu"] - F["cpu"]
    in_budget = a["idle_cpu"] is not None and a["idle_cpu"] <= budget + TOL
    lat_ok = ratio is not None and ratio <= SLACK
    cpu_ok = dcpu <= TOL
    # How far above the frontier adaptive sits at its own CPU: the best p50 of a frontier
    # point that uses no more CPU than it does.
    cheaper = [points[n]["p50_us"] for n in front if points[n]["cpu"] <= a["cpu"] + TOL]
    at_cpu = min(cheaper) if cheaper else None
    return {
        "budget": budget,
        "F": f,
        "F_p50_us": F["p50_us"],
        "F_cpu": F["cpu"],
        "F_idle_cpu": F["idle_cpu"],
        "A_p50_us": a["p50_us"],
        "A_cpu": a["cpu"],
        "A_idle_cpu": a["idle_cpu"],
        "p50_ratio": ratio,
        "cpu_minus_F": dcpu,
        "frontier_p50_at_A_cpu": at_cpu,
        "p50_over_frontier_at_A_cpu": a["p50_us"] / at_cpu if at_cpu else None,
        # Adaptive is on (or below) the frontier: within SLACK of the best fixed p50 at its own
        # CPU, or cheaper than every fixed point of the frontier.
        "on_frontier": at_cpu is None or a["p50_us"] <= SLACK * at_cpu,
        "latency_ok": lat_ok,
        "cpu_ok": cpu_ok,
        "in_budget": in_budget,
        "pass": bool(lat_ok and cpu_ok and in_budget),
    }


def why(v):
    if v is None:
        return "-"
    if v["pass"]:
        return "pass"
    r = []
    if not v["latency_ok"]:
        r.append(f"p50 {v['p50_ratio']:.2f}x")
    if not v["cpu_ok"]:
        r.append(f"CPU +{100 * v['cpu_minus_F']:.0f} pts")
    if not v["in_budget"]:
        r.append(f"idle {100 * v['A_idle_cpu']:.0f}% over budget")
    return "**miss**: " + ", ".join(r)


def cmd_frontier(out):
    runs = br.load_runs(os.path.join(out, "frontier.runs.jsonl"))
    by = defaultdict(list)
    for r in runs:
        t = r["tags"]
        by[(t["ns"], int(t["qd"]), t["load"], t["point"])].append(r)
    cells = defaultdict(dict)
    for (ns, qd, load, point), rs in by.items():
        cells[(ns, qd, load)][point] = point_summary(rs)
    budgets = sorted({float(r["tags"]["budget"]) for r in runs if r["tags"].get("mode") == "adaptive"})

    doc_cells = []
    for key in sorted(cells, key=lambda k: (DEVICES.index(k[0]) if k[0] in DEVICES else 99, k[2] != "saturating", k[1])):
        ns, qd, load = key
        pts = cells[key]
        poll = pts.get("poll")
        work = poll["busy"] / poll["iops"] if poll and poll["busy"] is not None and poll["iops"] else None
        for p in pts.values():
            if work is not None and p["cpu"] is not None and p["iops"]:
                p["idle_cpu"] = max(0.0, p["cpu"] - p["iops"] * work)
        fixed = {n: p for n, p in pts.items() if not is_adaptive(n)}
        front = frontier_of(fixed)
        verdicts = {}
        for b in budgets:
            a = pts.get(f"adaptive-{b:g}")
            verdicts[f"{b:g}"] = verdict(fixed, front, a, b)
            if f"base-adaptive-{b:g}" in pts:
                verdicts[f"base-{b:g}"] = verdict(fixed, front, pts[f"base-adaptive-{b:g}"], b)
        doc_cells.append({"ns": ns, "qd": qd, "load": load, "work_us_per_io": None if work is None else 1e6 * work, "points": pts, "frontier": front, "verdicts": verdicts})

    doc = {"tolerance_cpu": TOL, "slack_p50": SLACK, "budgets": budgets, "cells": doc_cells}
    with open(os.path.join(out, "frontier.json"), "w") as f:
        json.dump(doc, f, indent=1)

    reps = max((len(v) for v in by.values()), default=0)
    L = ["# ci/bench frontier (issue 25, goal 2)", "",
         br.load_note(out, "frontier"), "",
         "4K random reads, one reactor pinned to its own core, in-process target. Devices: RAM (64 MiB "
         "span preconditioned), sim 10 us fixed, sim 80 us lognormal (sigma 0.3), sim bimodal (80 us, "
         "2 % at 1 ms). `saturating`: as fast as the QD allows; `paced25`: paced at 25 % of poll mode's "
         f"saturating IOPS in that cell. Medians of {reps} run(s) per point. CPU: the reactor thread's CPU "
         "time over wall time. idle: CPU minus IOPS x the cell's work per I/O (poll mode's busy share over "
         "its IOPS: in poll mode an iteration either finds work or spins), i.e. the CPU not spent on I/O "
         "work (spinning, sleeping and waking), what `cpu_budget` bounds.", "",
         "Points: `poll`, `interrupt`, `hybrid-p99-*` (the measured p99 lateness as wake margin), "
         "`hybrid-mN-*` (`hybrid_margin_us = N`); `-spin`/`-sleep`: `hybrid_turnaround`. Plot labels: "
         "`p99s` = hybrid-p99-spin, `10z` = hybrid-m10-sleep, and so on.", "",
         f"Verdict: F is the lowest-p50 frontier point whose idle CPU is within the budget (+{TOL:.2f}); "
         f"adaptive passes when its p50 <= {SLACK:.2f} x F's, its CPU <= F's + {TOL:.2f} and its idle CPU "
         f"<= the budget + {TOL:.2f}. `at own CPU`: adaptive's p50 over the best frontier p50 at no more "
         "CPU than adaptive's (how far above the frontier it sits).", ""]
    vkeys = [(f"{b:g}", f"{b:g}", "adaptive") for b in budgets]
    vkeys += [(f"base-{b:g}", f"{b:g}", "base-adaptive") for b in budgets
              if any(f"base-{b:g}" in c["verdicts"] for c in doc_cells)]
    for vk, bs, prefix in vkeys:
        n_pass = sum(1 for c in doc_cells if c["verdicts"].get(vk) and c["verdicts"][vk]["pass"])
        n_all = sum(1 for c in doc_cells if c["verdicts"].get(vk))
        n_on = sum(1 for c in doc_cells if c["verdicts"].get(vk) and c["verdicts"][vk]["on_frontier"])
        who = "adaptive" if prefix == "adaptive" else "the base binary's adaptive (BENCH_FRONTIER_BASE_BIN)"
        L += [f"## Verdicts of {who}, cpu_budget {bs}: {n_pass} of {n_all} cells pass; on the frontier in {n_on}", "",
              "| device | QD | load | F | F p50 us | F CPU | adaptive p50 us | adaptive CPU | adaptive idle | p50 / F | CPU - F | at own CPU | verdict |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in doc_cells:
            v = c["verdicts"].get(vk)
            if not v:
                a = c["points"].get(f"{prefix}-{bs}")
                if a:
                    L.append(f"| {c['ns']} | {c['qd']} | {c['load']} | none within the budget | - | - | {br.fmt(a['p50_us'])} | "
                             f"{br.pct(a['cpu'])} | {br.pct(a['idle_cpu'])} | - | - | - | no verdict |")
                continue
            L.append(f"| {c['ns']} | {c['qd']} | {c['load']} | {v['F']} | {br.fmt(v['F_p50_us'])} | {br.pct(v['F_cpu'])} | "
                     f"{br.fmt(v['A_p50_us'])} | {br.pct(v['A_cpu'])} | {br.pct(v['A_idle_cpu'])} | {br.fmt(v['p50_ratio'], 3)} | "
                     f"{100 * v['cpu_minus_F']:+.0f} pts | {br.fmt(v['p50_over_frontier_at_A_cpu'], 3)}{' (on)' if v['on_frontier'] else ''} | {why(v)} |")
        L.append("")
    L += ["## Every point", ""]
    for c in doc_cells:
        pts = c["points"]
        L += [f"### {c['ns']}, QD{c['qd']}, {c['load']}" + (f" ({pts['poll']['rate']:.0f} IOPS)" if c["load"] == "paced25" and pts.get("poll", {}).get("rate") else "")
              + (f"; work {c['work_us_per_io']:.1f} us of CPU per I/O" if c["work_us_per_io"] else ""), "",
              "| point | p50 us | p99 us | IOPS | CPU | idle | poll/hybrid/intr % | frontier |", "|---|---|---|---|---|---|---|---|"]
        for n, p in sorted(pts.items(), key=lambda kv: (is_adaptive(kv[0]), kv[1]["cpu"] or 0)):
            ms = "/".join(br.fmt(100 * x, 0) if x is not None else "-" for x in p["mode_share"])
            L.append(f"| {n} | {br.fmt(p['p50_us'])} | {br.fmt(p['p99_us'])} | {br.kiops(p['iops'])} | {br.pct(p['cpu'])} | "
                     f"{br.pct(p['idle_cpu'])} | {ms} | {'yes' if n in c['frontier'] else ''} |")
        L.append("")
    with open(os.path.join(out, "frontier.md"), "w") as f:
        f.write("\n".join(L) + "\n")

    plt = br.plt_or_none()
    if not plt:
        return
    qds = sorted({c["qd"] for c in doc_cells})
    for ns in DEVICES:
        mine = {(c["qd"], c["load"]): c for c in doc_cells if c["ns"] == ns}
        if not mine:
            continue
        fig, axes = plt.subplots(len(LOADS), len(qds), figsize=(5.2 * len(qds), 4.6 * len(LOADS)), dpi=100, squeeze=False)
        for r, load in enumerate(LOADS):
            for k, qd in enumerate(qds):
                ax = axes[r][k]
                c = mine.get((qd, load))
                ax.set_title(f"QD{qd}, {load}")
                ax.set_xlabel("reactor CPU (% of a core)")
                ax.set_ylabel("p50 latency (us)")
                ax.grid(True, alpha=0.3)
                if not c:
                    continue
                pts = c["points"]
                for n, p in pts.items():
                    if is_adaptive(n) or p["cpu"] is None:
                        continue
                    color = "tab:red" if n == "poll" else "tab:blue" if n == "interrupt" else \
                        "tab:green" if n.endswith("-spin") else "tab:olive"
                    ax.scatter([100 * p["cpu"]], [p["p50_us"]], s=28, color=color, zorder=3)
                    ax.annotate(short(n), (100 * p["cpu"], p["p50_us"]), fontsize=6, xytext=(3, 2), textcoords="offset points")
                fr = [pts[n] for n in c["frontier"]]
                if fr:
                    xs, ys = [], []
                    for p in fr:
                        # A step: from a frontier point, the next lower p50 costs more CPU.
                        if xs:
                            xs.append(100 * p["cpu"])
                            ys.append(ys[-1])
                        xs.append(100 * p["cpu"])
                        ys.append(p["p50_us"])
                    ax.plot(xs, ys, color="black", linewidth=1.2, zorder=2, label="frontier (fixed)")
                for b, mk in zip(sorted(k for k in c["verdicts"] if not k.startswith("base-")), ("*", "D", "P", "X")):
                    a = pts.get(f"adaptive-{b}")
                    if not a or a["cpu"] is None:
                        continue
                    v = c["verdicts"][b]
                    ax.scatter([100 * a["cpu"]], [a["p50_us"]], s=160 if mk == "*" else 60, marker=mk, color="tab:purple",
                               edgecolors="black", zorder=4,
                               label=f"adaptive {b} ({'pass' if v and v['pass'] else 'miss'})")
                    base = pts.get(f"base-adaptive-{b}")
                    if base and base["cpu"] is not None:
                        ax.scatter([100 * base["cpu"]], [base["p50_us"]], s=60 if mk == "*" else 30, marker=mk,
                                   color="tab:gray", edgecolors="black", zorder=4, label=f"base adaptive {b}")
                    if v:
                        F = pts[v["F"]]
                        ax.scatter([100 * F["cpu"]], [F["p50_us"]], s=110, facecolors="none", edgecolors="tab:purple",
                                   linewidths=1.2, zorder=4)
                ax.legend(fontsize=7, loc="best")
        fig.suptitle(f"{DEVICE_NAMES.get(ns, ns)}: p50 against reactor CPU\nred: poll, blue: interrupt, green: hybrid "
                     "turnaround spin (s), olive: sleep (z), label: wake margin us; purple circle: F per budget", fontsize=10)
        fig.tight_layout(rect=(0, 0, 1, 0.93))
        fig.savefig(os.path.join(out, f"frontier-{ns}.png"))
        plt.close(fig)


def main(argv):
    if len(argv) == 3 and argv[1] == "frontier":
        cmd_frontier(argv[2])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
