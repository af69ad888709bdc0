#!/usr/bin/env python3
"""ci/bench rbd (issue 34): pollux as a gateway to Ceph RBD against librbd's own rate.

A one-node Ceph cluster (ci/ceph.sh: one mon, one memstore OSD on 127.0.0.1) holds one image
of BENCH_RBD_SIZE, written whole first so that reads read data. In one run, per cell (4K
random read and write at QD1 and QD32), three clients alternate, one run each, in
BENCH_RBD_ROUNDS rounds (order rotated every round):
  rbd       `rbd bench` (librbd, QD = --io-threads; IOPS only);
  fio       fio's rbd engine (librbd through fio's aio: IOPS and latency);
  pollux    `pollux perf --blocking` (an NVMe/TCP host waiting in poll(2), as fio does)
            against a pollux gateway on the same machine serving the image (adaptive
            reactor, the conf's default), target reactor on TARGET_CORE, client on
            CLIENT_CORE; the gateway's CPU per run from /proc.
librbd's references run with the cache pollux has (rbd_cache off, unless BENCH_RBD_CONF
turns write_cache on): with it, librbd acknowledges writes before the cluster has them.
Every run also records the whole machine's busy CPU (/proc/stat) per I/O: on this 2-core
machine the OSD, the client and the gateway share the cores, and that figure says what
each way of reaching the image costs.
The OSD and monitor run unpinned on the same two cores. Reported per cell: the medians of
each client's IOPS and p50, pollux/librbd ratios (against fio, and against rbd bench), the
gateway's CPU (cores), and pollux's p50 minus fio's (what the gateway adds to librbd's
latency) beside this machine's loopback floor (pollux perf against a RAM namespace at QD1,
measured in the same run).

usage: bench-rbd.py POLLUX_BIN OUT_DIR TARGET_CORE CLIENT_CORE
env: BENCH_RBD_ROUNDS (3), BENCH_RBD_T (s per run, 4), BENCH_RBD_SIZE (256M),
     BENCH_RBD_CELLS ("randread:1 randread:32 randwrite:1 randwrite:32"),
     BENCH_RBD_CONF (extra [[subsystem.namespace]] backend keys, e.g. ", write_cache = true"),
     BENCH_RBD_MODE (the gateway's reactor mode, adaptive),
     BENCH_QUICK=1 (1 round of 1 s)
"""
import json
import os
import re
import statistics
import subprocess
import sys
import time

from benchlib import free_port, start_target, stop_target

NQN = "nqn.2026-12.io.pollux:bench-rbd"
HERE = os.path.dirname(os.path.abspath(__file__))


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def machine_busy_s():
    """Seconds the whole machine's CPUs were busy so far (all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """User + system seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_rbd_bench(conf, image, rw, qd, t, iops_guess, cache):
    """`rbd bench` sized to run about t s (it takes a total, not a duration)."""
    total = max(int(iops_guess * t), 200) * 4096
    out = sh(["rbd", "-c", conf, f"--rbd_cache={cache}", "--rbd_cache_writethrough_until_flush=false", "bench", "--io-type", "read" if rw == "randread" else "write",
              "--io-size", "4096", "--io-threads", str(qd), "--io-total", str(total),
              "--io-pattern", "rand", f"rbd/{image}"])
    m = re.search(r"elapsed:\s*([\d.]+)\s+ops:\s*(\d+)\s+ops/sec:\s*([\d.]+)", out)
    if not m:
        raise SystemExit(f"rbd bench: no summary in\n{out}")
    return {"iops": float(m.group(3)), "p50_us": None, "cpu": None}


def run_fio(conf, image, rw, qd, t, cache):
    out = sh(["fio", "--name=rbd", "--ioengine=rbd", "--clientname=admin", "--pool=rbd",
              f"--rbdname={image}", f"--rw={rw}", "--bs=4k", f"--iodepth={qd}", "--time_based",
              f"--runtime={t}", "--direct=1", "--output-format=json"],
             env=dict(os.environ, CEPH_CONF=conf,
                      CEPH_ARGS=f"--rbd_cache={cache} --rbd_cache_writethrough_until_flush=false"))
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["read" if rw == "randread" else "write"]
    return {"iops": side["iops"], "p50_us": side["clat_ns"]["percentile"]["50.000000"] / 1000, "cpu": None}


def run_pollux(pollux, port, target, rw, qd, t, ccore):
    trid = f"trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}"
    c0, w0 = cpu_s(target.pid), time.time()
    # --blocking: the host waits in poll(2) as fio and rbd bench do, rather than spinning a
    # core that the OSD and the gateway need on this 2-core machine.
    out = sh([pollux, "perf", "-r", trid, "-q", str(qd), "-o", "4096", "-w", rw, "-t", str(t),
              "--cores", str(ccore), "--json", "--no-probe", "--blocking"])
    cpu = (cpu_s(target.pid) - c0) / (time.time() - w0)
    rep = json.loads(out.strip().splitlines()[-1])
    return {"iops": rep["iops"], "p50_us": rep["latency_ns"]["p50"] / 1000, "cpu": cpu}


def run_floor(pollux, port, ccore, t):
    trid = f"trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN} "
    out = sh([pollux, "perf", "-r", trid, "--nsid", "2", "-q", "1", "-o", "4096", "-w", "randread",
              "-t", str(t), "--cores", str(ccore), "--json", "--no-probe", "--blocking"])
    return json.loads(out.strip().splitlines()[-1])["latency_ns"]["p50"] / 1000


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    pollux, out, tcore, ccore = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    quick = os.environ.get("BENCH_QUICK") == "1"
    rounds = 1 if quick else int(os.environ.get("BENCH_RBD_ROUNDS", "3"))
    t = 1 if quick else float(os.environ.get("BENCH_RBD_T", "4"))
    size = os.environ.get("BENCH_RBD_SIZE", "256M")
    cells = [(c.split(":")[0], int(c.split(":")[1])) for c in
             os.environ.get("BENCH_RBD_CELLS", "randread:1 randread:32 randwrite:1 randwrite:32").split()]
    extra = os.environ.get("BENCH_RBD_CONF", "")
    # librbd's own rate with the cache pollux has (off unless BENCH_RBD_CONF turns it on):
    # with it, librbd acknowledges writes before the cluster has them.
    cache = "true" if "write_cache = true" in extra else "false"
    mode = os.environ.get("BENCH_RBD_MODE", "adaptive")
    os.makedirs(out, exist_ok=True)
    cdir = os.path.abspath(f"{out}/rbd-ceph")
    env = dict(os.environ, CEPH_IMG_SIZE="")
    sh(["bash", f"{HERE}/ceph.sh", "start", cdir], env=env)
    conf = f"{cdir}/ceph.conf"
    target = None
    try:
        sh(["rbd", "-c", conf, "create", "--size", size, "rbd/bench"])
        # Written whole: reads of objects never written return at once, without the OSD.
        sh(["rbd", "-c", conf, "bench", "--io-type", "write", "--io-size", "4M", "--io-threads", "4",
            "--io-total", str(int(size.rstrip("M")) << 20), "--io-pattern", "seq", "rbd/bench"])
        port = free_port()
        cfg = f"{out}/rbd-gateway.toml"
        with open(cfg, "w") as f:
            f.write(f"""[reactors]
cores = [{tcore}]
mode = "{mode}"

[[listener]]
address = "127.0.0.1:{port}"

[transport]
io_queue_depth = 256

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = {{ rbd = {{ pool = "rbd", image = "bench", ceph_conf = "{conf}"{extra} }} }}

[[subsystem.namespace]]
nsid = 2
backend = {{ ram = {{ size = "64MiB" }} }}
""")
        logf = open(f"{out}/rbd-gateway.log", "w")
        target = start_target(pollux, cfg, port, logf, "rbd")
        runs, results = [], {}
        floor = []
        for rw, qd in cells:
            guess = 3000.0
            for r in range(rounds):
                order = ["rbd", "fio", "pollux"]
                order = order[r % 3:] + order[:r % 3]
                for who in order:
                    b0, w0 = machine_busy_s(), time.time()
                    if who == "rbd":
                        res = run_rbd_bench(conf, "bench", rw, qd, t, guess, cache)
                        guess = res["iops"]
                    elif who == "fio":
                        res = run_fio(conf, "bench", rw, qd, t, cache)
                    else:
                        res = run_pollux(pollux, port, target, rw, qd, t, ccore)
                    machine = (machine_busy_s() - b0) / (time.time() - w0)
                    res.update(client=who, rw=rw, qd=qd, round=r, machine_cpu=machine,
                               machine_us_per_io=machine * 1e6 / res["iops"] if res["iops"] else None)
                    runs.append(res)
                    print(f"rbd: {rw} QD{qd} round {r} {who}: {res['iops']:.0f} IOPS"
                          + (f", p50 {res['p50_us']:.0f} us" if res["p50_us"] else "")
                          + (f", gateway CPU {res['cpu']:.2f}" if res["cpu"] is not None else ""), flush=True)
                if qd == 1 and rw == "randread":
                    floor.append(run_floor(pollux, port, ccore, t))
        with open(f"{out}/rbd.runs.jsonl", "w") as f:
            for r in runs:
                f.write(json.dumps(r) + "\n")
        floor_us = med(floor)
        rows = []
        for rw, qd in cells:
            by = {w: [r for r in runs if r["rw"] == rw and r["qd"] == qd and r["client"] == w]
                  for w in ("rbd", "fio", "pollux")}
            m = {w: {k: med([r[k] for r in rs]) for k in ("iops", "p50_us", "cpu", "machine_us_per_io")}
                 for w, rs in by.items()}
            # Per round ratios, then their median: each pair ran minutes apart at most.
            ratio = lambda ref: med([p["iops"] / f["iops"] for p, f in zip(by["pollux"], by[ref]) if f["iops"]])
            row = {"workload": rw, "qd": qd, "rbd_bench_iops": m["rbd"]["iops"], "fio_iops": m["fio"]["iops"],
                   "pollux_iops": m["pollux"]["iops"], "pollux_vs_fio": ratio("fio"),
                   "pollux_vs_rbd_bench": ratio("rbd"), "fio_p50_us": m["fio"]["p50_us"],
                   "pollux_p50_us": m["pollux"]["p50_us"], "gateway_cpu": m["pollux"]["cpu"],
                   "fio_machine_us_per_io": m["fio"]["machine_us_per_io"],
                   "pollux_machine_us_per_io": m["pollux"]["machine_us_per_io"]}
            if row["fio_p50_us"] and row["pollux_p50_us"]:
                row["added_p50_us"] = row["pollux_p50_us"] - row["fio_p50_us"]
            rows.append(row)
        summary = {"rounds": rounds, "seconds": t, "image": size, "loopback_floor_p50_us": floor_us, "mode": mode,
                   "conf_extra": extra, "librbd_cache": cache, "cells": rows}
        with open(f"{out}/rbd.json", "w") as f:
            json.dump(summary, f, indent=1)
        fmt = lambda v, p=0: "-" if v is None else f"{v:.{p}f}"
        md = [f"# ci/bench rbd: {rounds} rounds of {t} s, image {size}, rbd_cache {cache}{extra}, gateway reactor {mode}; loopback floor p50 {fmt(floor_us)} us", "",
              "| cell | rbd bench IOPS | fio-rbd IOPS | pollux IOPS | pollux/fio | pollux/rbd bench | fio p50 us | pollux p50 us | added us | gateway CPU | machine CPU us/IO fio, pollux |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            md.append(f"| {r['workload']} QD{r['qd']} | {fmt(r['rbd_bench_iops'])} | {fmt(r['fio_iops'])} | "
                      f"{fmt(r['pollux_iops'])} | {fmt(r['pollux_vs_fio'], 2)} | {fmt(r['pollux_vs_rbd_bench'], 2)} | "
                      f"{fmt(r['fio_p50_us'])} | {fmt(r['pollux_p50_us'])} | {fmt(r.get('added_p50_us'))} | "
                      f"{fmt(r['gateway_cpu'], 2)} | {fmt(r['fio_machine_us_per_io'])}, {fmt(r['pollux_machine_us_per_io'])} |")
        with open(f"{out}/rbd.md", "w") as f:
            f.write("\n".join(md) + "\n")
        print("\n".join(md))
    finally:
        if target is not None:
            stop_target(target)
        subprocess.run(["bash", f"{HERE}/ceph.sh", "stop", cdir], capture_output=True)


if __name__ == "__main__":
    main()
