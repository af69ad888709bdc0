#!/usr/bin/env python3
"""ci/bench storm (issue 26): connect storms beside a verifying QD1 host.

One pollux target process (one reactor, pinned) serves a RAM namespace. Each cycle runs
`pollux perf --verify` at QD1 (the neighbour, on the client core) for CYCLE_T seconds; in
storm cycles, meanwhile, this script opens CONNS connections (a third bare sockets that never
send a byte, a third past ICReq that send one 8 KiB capsule before Connect, which grows their
receive buffers, and the rest as whole controllers: `pollux perf -w idle` processes with 32
I/O queues each), holds them, closes them all, and does it again until the cycle ends. Storm
and quiet cycles alternate in ABBA pairs. Reported per cycle: the target's RSS before, at its
peak and after the storm's connections closed; the neighbour's p50/p99/max; reactor stall
warnings in the target's log; the reactor thread's page faults. Per pair: storm/quiet ratios.
At the end, RSS per idle queue: 10 controllers of 32 I/O queues held idle on a fresh target;
and first connect storms: fresh targets, each taking 3 rounds of 1000 connections opened one
after another (connect, ICReq, ICResp), the round trip's p50/p99/max per round: the first
round is the target's first storm (alternating with BENCH_STORM_BASE_BIN, an older pollux,
if set; BENCH_STORM_FIRST_PAIRS pairs, 4). Any error of the neighbour
(verify mismatch, I/O error) or of the storm's controllers fails the run.

usage: bench-storm.py POLLUX_BIN OUT_DIR TARGET_CORE CLIENT_CORE
env: BENCH_STORM_PAIRS (3), BENCH_STORM_CONNS (1000), BENCH_STORM_T (6 s per cycle),
     BENCH_STORM_HOLD (1.0 s), BENCH_STORM_WARMUP (1: a quiet cycle before the pairs, in no
     ratio; 0: none, the first storm is the neighbour's first cycle too),
     BENCH_QUICK=1 (1 pair, 200 connections, 3 s)
"""
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

from benchlib import free_port, start_target, stop_target

NQN = "nqn.2026-11.io.pollux:bench-storm"
HOST = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-0000000000ff"


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def reactor_faults(pid):
    """Minor and major page faults of the reactor thread so far (the thread named reactor-0):
    first touches of memory that the reactor pays for while it serves, which machine noise
    does not move."""
    import glob
    for d in glob.glob(f"/proc/{pid}/task/*"):
        try:
            if open(f"{d}/comm").read().strip() != "reactor-0":
                continue
            f = open(f"{d}/stat").read().rsplit(")", 1)[1].split()
            return int(f[7]) + int(f[9])  # minflt, majflt (fields 10 and 12 of stat)
        except OSError:
            continue
    return 0


def populating(pid):
    """Whether the target still commits a RAM namespace in the background."""
    import glob
    for d in glob.glob(f"/proc/{pid}/task/*"):
        try:
            if open(f"{d}/comm").read().strip() == "pollux-ram-popu":
                return True
        except OSError:
            pass
    return False


def icreq():
    # ICReq: type 0, flags 0, hlen 128, pdo 0, plen 128; pfv 0, hpda 0, digests 0, maxr2t 0.
    return struct.pack("<BBBBI", 0, 0, 128, 0, 128) + bytes(120)


def big_capsule():
    # A Keep Alive capsule with 8 KiB of in-capsule data before Connect: refused with a
    # status (the queue has no controller), but its PDU needs more than the initial buffer.
    data = 8192
    ch = struct.pack("<BBBBI", 4, 0, 72, 72, 72 + data)
    sqe = bytearray(64)
    sqe[0] = 0x18  # Keep Alive
    sqe[1] = 0x40  # PSDT 01b
    struct.pack_into("<H", sqe, 2, 1)
    # SGL1: data block, offset 0, length `data` (type 0x01 offset subtype).
    struct.pack_into("<QIxxxB", sqe, 24, 0, data, 0x01)
    return ch + bytes(sqe) + bytes(data)


def read_some(s, n, timeout=5.0):
    s.settimeout(timeout)
    got = b""
    while len(got) < n:
        b = s.recv(n - len(got))
        if not b:
            raise ConnectionError("closed")
        got += b
    return got


class Storm:
    def __init__(self, pollux, port, conns, hold, client_core, errors):
        self.pollux, self.port, self.conns, self.hold = pollux, port, conns, hold
        self.core, self.errors = client_core, errors
        self.stop = threading.Event()
        self.rounds = 0

    def one_round(self):
        third = self.conns // 3
        ctrls = max(1, (self.conns - 2 * third) // 33)
        trid = f"trtype:tcp traddr:127.0.0.1 trsvcid:{self.port} subnqn:{NQN} hostnqn:{HOST}"
        procs = [
            subprocess.Popen(
                [self.pollux, "perf", "-r", trid, "-w", "idle", "-t", str(self.hold + 1.0),
                 "--cores", str(self.core), "--conns-per-core", "32", "-q", "1", "--no-probe"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(ctrls)
        ]
        socks = []
        try:
            for _ in range(third):
                socks.append(socket.create_connection(("127.0.0.1", self.port)))
            for _ in range(third):
                s = socket.create_connection(("127.0.0.1", self.port))
                s.sendall(icreq())
                read_some(s, 128)
                s.sendall(big_capsule())
                read_some(s, 24)
                socks.append(s)
            time.sleep(self.hold)
        finally:
            for s in socks:
                s.close()
        for p in procs:
            _, err = p.communicate(timeout=60)
            if p.returncode != 0:
                self.errors.append(f"storm controller exited {p.returncode}: {err.decode()[-300:]}")
        self.rounds += 1

    def run(self):
        try:
            while not self.stop.is_set():
                self.one_round()
                time.sleep(0.2)
        except Exception as e:  # noqa: BLE001 - reported as the run's failure
            self.errors.append(f"storm: {e!r}")


def conf_text(tcore, port, conns, ram="64MiB"):
    return f"""[reactors]
cores = [{tcore}]
mode = "poll"

[[listener]]
address = "127.0.0.1:{port}"

[transport]
max_connections = {conns + 64}
# The storm's controllers ask for 32 I/O queues each and get them (one reactor would
# grant 8 by default).
max_io_queues = 32

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
block_size = 512
backend = {{ ram = {{ size = "{ram}" }} }}
"""


def idle_queues(pollux, out, tcore, core, conns, errors, ctrls=10, queues=32):
    """RSS per idle queue, on a fresh target (the storms' target has their memory to reuse):
    `ctrls` controllers of `queues` I/O queues each (plus their admin queues) connected and
    idle, the target's RSS while they are held against before."""
    port = free_port()
    cfg = f"{out}/conf/storm-idle.toml"
    with open(cfg, "w") as f:
        # A small namespace: a RAM namespace is committed in the background after the
        # start, which would count as the queues' RSS.
        f.write(conf_text(tcore, port, conns, ram="1MiB"))
    logf = open(f"{out}/storm-idle.target.log", "w")
    target = start_target(pollux, cfg, port, logf, "storm-idle")
    try:
        return held_idle(pollux, port, core, target.pid, errors, ctrls, queues)
    finally:
        stop_target(target)
        logf.close()


def held_idle(pollux, port, core, pid, errors, ctrls, queues):
    trid = f"trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN} hostnqn:{HOST}"
    before = rss_kib(pid)
    for _ in range(20):  # settled: unchanged over 0.25 s
        time.sleep(0.25)
        now, before = before, rss_kib(pid)
        if now == before:
            break
    procs = [
        subprocess.Popen(
            [pollux, "perf", "-r", trid, "-w", "idle", "-t", "3", "--cores", str(core),
             "--conns-per-core", str(queues), "-q", "1", "--no-probe"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(ctrls)
    ]
    time.sleep(2.0)
    held = rss_kib(pid)
    for p in procs:
        _, err = p.communicate(timeout=60)
        if p.returncode != 0:
            errors.append(f"idle controller exited {p.returncode}: {err.decode()[-300:]}")
    time.sleep(1.0)
    after = rss_kib(pid)
    n = ctrls * (queues + 1)
    r = {"queues": n, "rss_before_kib": before, "rss_held_kib": held, "rss_after_kib": after,
         "rss_per_idle_queue_kib": (held - before) / n}
    print(f"storm: idle queues {n}: rss {before}->{held}->{after} KiB, "
          f"{r['rss_per_idle_queue_kib']:.1f} KiB per idle queue", flush=True)
    return r


def first_rounds(pollux, out, tcore, rounds=3, conns=1000):
    """On a fresh target, `rounds` rounds of `conns` connections opened one after another
    (connect, ICReq, ICResp), held, closed: each one's ICResp round trip, and the reactor's
    page faults per round. The first round is the first storm the target sees."""
    port = free_port()
    cfg = f"{out}/conf/storm-first.toml"
    with open(cfg, "w") as f:
        f.write(conf_text(tcore, port, conns + 64, ram="1MiB"))
    logf = open(f"{out}/storm-first.target.log", "w")
    target = start_target(pollux, cfg, port, logf, "storm-first")
    res = []
    try:
        for _ in range(rounds):
            f0 = reactor_faults(target.pid)
            rtts, socks = [], []
            try:
                for _ in range(conns):
                    t0 = time.perf_counter()
                    s = socket.create_connection(("127.0.0.1", port))
                    socks.append(s)
                    s.sendall(icreq())
                    read_some(s, 128)
                    rtts.append(time.perf_counter() - t0)
            finally:
                for s in socks:
                    s.close()
            rtts.sort()
            res.append({"faults": reactor_faults(target.pid) - f0,
                        "p50_us": rtts[len(rtts) // 2] * 1e6, "p99_us": rtts[int(len(rtts) * 0.99)] * 1e6,
                        "max_us": rtts[-1] * 1e6})
            time.sleep(0.3)
    finally:
        stop_target(target)
        logf.close()
    return res


def first_storms(pollux, base, out, tcore, pairs):
    """Alternating fresh targets of `pollux` (and `base`, an older pollux, if given):
    the ICResp round trips of the first storm against the later ones."""
    runs = []
    for k in range(pairs):
        bins = [("pollux", pollux)] + ([("base", base)] if base else [])
        if k % 2:
            bins.reverse()
        for name, b in bins:
            r = first_rounds(b, out, tcore)
            runs.append({"bin": name, "pair": k, "rounds": r})
            print(f"storm: first-connect {name} pair {k}: max us per round "
                  f"{[round(x['max_us']) for x in r]}, faults {[x['faults'] for x in r]}", flush=True)
    return runs


def main():
    pollux, out, tcore, ccore = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    quick = os.environ.get("BENCH_QUICK") == "1"
    pairs = int(os.environ.get("BENCH_STORM_PAIRS", "1" if quick else "3"))
    conns = int(os.environ.get("BENCH_STORM_CONNS", "200" if quick else "1000"))
    cycle_t = float(os.environ.get("BENCH_STORM_T", "3" if quick else "6"))
    hold = float(os.environ.get("BENCH_STORM_HOLD", "1.0"))
    warmup = os.environ.get("BENCH_STORM_WARMUP", "1") == "1"
    port = free_port()
    os.makedirs(f"{out}/conf", exist_ok=True)
    cfg = f"{out}/conf/storm.toml"
    with open(cfg, "w") as f:
        f.write(conf_text(tcore, port, conns))
    log_path = f"{out}/storm.target.log"
    logf = open(log_path, "w")
    target = start_target(pollux, cfg, port, logf, "storm")
    try:
        time.sleep(0.5)
        rss_start = rss_kib(target.pid)
        cycles = []
        errors = []
        trid = f"trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}"
        # A quiet warm-up cycle first (pair -1, in no ratio): the neighbour's first writes
        # commit its span of the RAM namespace, which the first storm would otherwise be
        # charged with.
        schedule = [(-1, [False])] if warmup else []
        schedule += [(p, [True, False] if p % 2 == 0 else [False, True]) for p in range(pairs)]
        for pair, order in schedule:
            for storm_on in order:
                stalls_before = open(log_path).read().count("stall")
                faults_before = reactor_faults(target.pid)
                populating_at_start = populating(target.pid)
                before = rss_kib(target.pid)
                peak = [before]
                sampling = threading.Event()

                def sample():
                    while not sampling.is_set():
                        peak[0] = max(peak[0], rss_kib(target.pid))
                        time.sleep(0.05)

                st = threading.Thread(target=sample)
                st.start()
                neighbour = subprocess.Popen(
                    [pollux, "perf", "-r", trid, "--hostnqn", HOST.replace("ff", "fe"), "-q", "1",
                     "-o", "4096", "-w", "randrw", "-M", "50", "--verify", "--span", "8MiB",
                     "-t", str(cycle_t), "--warmup", "0.5", "--cores", str(ccore), "--json",
                     "--no-probe"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                storm = None
                if storm_on:
                    time.sleep(0.6)
                    storm = Storm(pollux, port, conns, hold, ccore, errors)
                    th = threading.Thread(target=storm.run)
                    th.start()
                nout, nerr = neighbour.communicate(timeout=cycle_t + 120)
                if storm:
                    storm.stop.set()
                    th.join()
                time.sleep(1.0)  # the storm's connections closed: let the target settle
                sampling.set()
                st.join()
                after = rss_kib(target.pid)
                if neighbour.returncode != 0:
                    errors.append(f"neighbour exited {neighbour.returncode}: {nerr.decode()[-500:]}")
                    rep = {}
                else:
                    rep = json.loads(nout.decode().strip().splitlines()[-1])
                lat = rep.get("latency_ns", {})
                stalls = open(log_path).read().count("stall") - stalls_before
                faults = reactor_faults(target.pid) - faults_before
                c = {
                    "pair": pair, "storm": storm_on, "storm_rounds": storm.rounds if storm else 0,
                    "rss_before_kib": before, "rss_peak_kib": peak[0], "rss_after_kib": after,
                    "p50_ns": lat.get("p50"), "p99_ns": lat.get("p99"), "max_ns": lat.get("max"),
                    "ios": lat.get("count"), "stall_warnings": stalls, "reactor_faults": faults,
                    "ram_populating_at_start": populating_at_start,
                }
                cycles.append(c)
                print(f"storm: pair {pair} storm={storm_on} rounds={c['storm_rounds']} "
                      f"rss {before}->{peak[0]}->{after} KiB p99 {c['p99_ns']} max {c['max_ns']} "
                      f"stalls {stalls} reactor faults {faults} populating {populating_at_start}", flush=True)
                if errors:
                    break
            if errors:
                break
        rss_end = rss_kib(target.pid)
    finally:
        stop_target(target)
        logf.close()
    idle = idle_queues(pollux, out, tcore, ccore, conns, errors) if not errors else {}
    first = first_storms(pollux, os.environ.get("BENCH_STORM_BASE_BIN"), out, tcore,
                         int(os.environ.get("BENCH_STORM_FIRST_PAIRS", "1" if quick else "4")))
    with open(f"{out}/storm.runs.jsonl", "w") as f:
        for c in cycles:
            f.write(json.dumps(c) + "\n")

    def ratio(key, pair):
        s = [c for c in cycles if c["pair"] == pair and c["storm"]]
        q = [c for c in cycles if c["pair"] == pair and not c["storm"]]
        if not s or not q or not q[0][key]:
            return None
        return s[0][key] / q[0][key]

    ratios = {k: [ratio(k, p) for p in range(pairs)] for k in ("p50_ns", "p99_ns", "max_ns")}
    med = {k: statistics.median([r for r in v if r is not None]) if any(r is not None for r in v) else None
           for k, v in ratios.items()}
    summary = {
        "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "connections_per_round": conns, "pairs": pairs, "cycle_s": cycle_t,
        "rss_start_kib": rss_start, "rss_end_kib": rss_end,
        "rss_growth_kib": rss_end - rss_start,
        "rss_peak_kib": max((c["rss_peak_kib"] for c in cycles), default=0),
        "storm_over_quiet": ratios, "storm_over_quiet_median": med,
        "stall_warnings_storm": sum(c["stall_warnings"] for c in cycles if c["storm"]),
        "stall_warnings_quiet": sum(c["stall_warnings"] for c in cycles if not c["storm"]),
        "idle_queues": idle,
        "first_connect": first,
        "errors": errors,
    }
    with open(f"{out}/storm.json", "w") as f:
        json.dump(summary, f, indent=1)
    us = lambda ns: "-" if ns is None else f"{ns / 1000:.1f}"  # noqa: E731
    with open(f"{out}/storm.md", "w") as f:
        f.write(f"# storm: {conns} connections per round beside a QD1 verifying host\n\n")
        f.write("| pair | storm | rounds | RSS before / peak / after (MiB) | p50 us | p99 us | max us | stalls "
                "| reactor faults |\n")
        f.write("|---|---|---|---|---|---|---|---|---|\n")
        for c in cycles:
            f.write(f"| {c['pair']} | {'yes' if c['storm'] else 'no'} | {c['storm_rounds']} | "
                    f"{c['rss_before_kib'] / 1024:.1f} / {c['rss_peak_kib'] / 1024:.1f} / "
                    f"{c['rss_after_kib'] / 1024:.1f} | {us(c['p50_ns'])} | {us(c['p99_ns'])} | "
                    f"{us(c['max_ns'])} | {c['stall_warnings']} | {c['reactor_faults']} |\n")
        f.write(f"\nstorm/quiet per pair: p50 {ratios['p50_ns']}, p99 {ratios['p99_ns']}, "
                f"max {ratios['max_ns']}\n\nRSS {rss_start / 1024:.1f} MiB at start, "
                f"{rss_end / 1024:.1f} MiB at the end\n")
        if first:
            f.write("\nfirst connect storms (fresh targets, 3 rounds of 1000 connections opened one after "
                    "another; ICResp round trip, us):\n\n| binary | pair | round | p50 | p99 | max | "
                    "reactor faults |\n|---|---|---|---|---|---|---|\n")
            for r in first:
                for i, x in enumerate(r["rounds"]):
                    f.write(f"| {r['bin']} | {r['pair']} | {i} | {x['p50_us']:.0f} | {x['p99_us']:.0f} | "
                            f"{x['max_us']:.0f} | {x['faults']} |\n")
        if idle:
            f.write(f"\nidle queues: {idle['queues']} held ({idle['queues'] // 33} controllers of 32 I/O "
                    f"queues), RSS {idle['rss_before_kib'] / 1024:.1f} -> {idle['rss_held_kib'] / 1024:.1f} "
                    f"-> {idle['rss_after_kib'] / 1024:.1f} MiB: "
                    f"{idle['rss_per_idle_queue_kib']:.1f} KiB per idle queue\n")
    if errors:
        print("storm: FAILED: " + "; ".join(errors), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
