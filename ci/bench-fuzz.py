#!/usr/bin/env python3
"""ci/bench fuzz (issue 54): SPDK's own fuzzer, `nvme_fuzz` (test/app/fuzz/nvme_fuzz of SPDK
v26.05, a peer nobody here wrote), against a pollux target, as a standing tool.

One pollux process (one reactor, on TARGET_CORE) serves two subsystems of one namespace
each: a RAM namespace (nqn.2016-06.io.spdk:cnode1) and a file namespace
(nqn.2016-06.io.spdk:cnode2). For every seed (BENCH_FUZZ_SEEDS: a fixed one, and `random`,
drawn here and printed) and every subsystem, nvme_fuzz runs admin and I/O commands (`-a`)
for BENCH_FUZZ_T seconds on CLIENT_CORE. A run passes when the fuzzer ends by itself
("Fuzzing completed", exit 0) within BENCH_FUZZ_T + 120 s, and the target is alive, still
answers `pollux ctl`, and, once the fuzzer's connections are gone, has no command open (every
command it received ended in a completion or went with its closed queue).

One namespace per subsystem, not two: nvme_fuzz opens a fuzzing context of 16 admin
commands per namespace, all on the controller's one admin queue, whose SPDK host has 32
requests; with two namespaces its submissions fail with -ENOMEM, and the fuzzer counts the
command it failed to submit as outstanding, waits for it and never ends, against SPDK's own
nvmf_tgt as against pollux (ci/BENCHMARKS.md, "fuzz").

nvme_fuzz comes from an SPDK build: SPDK_DIR (default /tmp/anchors/spdk, what
shared/tools/build-spdk.sh builds). Results: OUT_DIR/fuzz.json and a summary line per run.

usage: bench-fuzz.py POLLUX_BIN OUT_DIR TARGET_CORE CLIENT_CORE
env: BENCH_FUZZ_T (60 s a run), BENCH_FUZZ_SEEDS ("123456 random"), SPDK_DIR
"""
import json
import os
import random
import re
import subprocess
import sys
import time

from benchlib import free_port, start_target, stop_target

SUBSYSTEMS = [("ram", "nqn.2016-06.io.spdk:cnode1"), ("file", "nqn.2016-06.io.spdk:cnode2")]


def conf(port, out, sock, core):
    disk = os.path.join(out, "fuzz-disk.img")
    return f"""
[reactors]
cores = [{core}]

[control]
socket = "{sock}"

[[listener]]
address = "127.0.0.1:{port}"

[[subsystem]]
nqn = "{SUBSYSTEMS[0][1]}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = {{ ram = {{ size = "64MiB" }} }}

[[subsystem]]
nqn = "{SUBSYSTEMS[1][1]}"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
block_size = 4096
backend = {{ file = {{ path = "{disk}", size = "64MiB", direct = false }} }}
"""


def reactors(pollux, sock):
    """The target's reactors as `pollux ctl reactors --json` gives them."""
    r = subprocess.run([pollux, "ctl", "--socket", sock, "--json", "reactors"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"pollux ctl reactors failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def open_commands(pollux, sock):
    """(open commands, held AERs) summed over the reactors, once the fuzzer's queues closed."""
    end = time.time() + 10
    while True:
        rs = reactors(pollux, sock)
        conns = sum(r["connections"] for r in rs)
        q = [r["requests"] for r in rs]
        opened = sum(max(0, x["received"] - x["ended"] - x["dropped"]) for x in q)
        aers = sum(x["aers"] for x in q)
        if (conns == 0 and opened == 0) or time.time() > end:
            return opened, aers, conns
        time.sleep(0.2)


def main():
    pollux, out, tc, cc = sys.argv[1:5]
    out = os.path.abspath(out)
    t = int(os.environ.get("BENCH_FUZZ_T", "60"))
    seeds = []
    for s in os.environ.get("BENCH_FUZZ_SEEDS", "123456 random").split():
        seeds.append(random.randrange(1, 2**31) if s == "random" else int(s))
    spdk = os.environ.get("SPDK_DIR", "/tmp/anchors/spdk")
    fuzz = os.path.join(spdk, "test/app/fuzz/nvme_fuzz/nvme_fuzz")
    if not os.access(fuzz, os.X_OK):
        raise SystemExit(f"fuzz: no nvme_fuzz at {fuzz}: build SPDK with shared/tools/build-spdk.sh (OUT={spdk})")
    os.makedirs(out, exist_ok=True)
    port = free_port()
    sock = os.path.join(out, "fuzz-ctl.sock")
    cfg = os.path.join(out, "conf", "fuzz.toml")
    os.makedirs(os.path.dirname(cfg), exist_ok=True)
    with open(cfg, "w") as f:
        f.write(conf(port, out, sock, tc))
    logf = open(os.path.join(out, "fuzz-target.log"), "w")
    target = start_target(pollux, cfg, port, logf, "fuzz")
    runs, failed = [], 0
    try:
        for seed in seeds:
            for kind, nqn in SUBSYSTEMS:
                flog = os.path.join(out, f"fuzz-{kind}-{seed}.log")
                cmd = [fuzz, "-m", hex(1 << int(cc)), "--no-huge", "-s", "1024", "-U", "-t", str(t), "-S", str(seed), "-a",
                       "-F", f"trtype:tcp adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}"]
                print(f"fuzz: {kind} seed {seed}, {t} s: {' '.join(cmd)}", file=sys.stderr)
                t0 = time.time()
                with open(flog, "w") as lf:
                    try:
                        rc = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, timeout=t + 120).returncode
                    except subprocess.TimeoutExpired:
                        rc = "hung"
                wall = time.time() - t0
                text = open(flog, errors="replace").read()
                completed = "Fuzzing completed" in text
                timed_out = [m for m in re.findall(r"An (Admin|I/O) queue has timed out", text)]
                unable = re.findall(r"Unable to submit command with rc (-?\d+)", text)
                totals = re.findall(r"(I/O|admin) qp, Total commands completed: (\d+), total successful commands: (\d+)", text)
                io = sum(int(n) for q, n, _ in totals if q == "I/O")
                adm = sum(int(n) for q, n, _ in totals if q == "admin")
                alive = target.poll() is None
                opened, aers, conns = open_commands(pollux, sock) if alive else (None, None, None)
                ok = rc == 0 and completed and not timed_out and not unable and alive and opened == 0
                failed += not ok
                run = {"subsystem": kind, "seed": seed, "seconds": t, "wall_s": round(wall, 1), "rc": rc,
                       "completed": completed, "queue_timeouts": timed_out, "submit_errors": unable,
                       "io_commands": io, "admin_commands": adm, "target_alive": alive,
                       "open_after": opened, "aers_after": aers, "connections_after": conns, "ok": ok, "log": flog}
                runs.append(run)
                print(f"fuzz {kind:4} seed {seed:>10}: {'ok' if ok else 'FAILED'}, ended by itself: {completed} "
                      f"(rc {rc}, {wall:.0f} s), {io} I/O and {adm} admin commands completed, "
                      f"queue timeouts {len(timed_out)}, submit errors {unable or 'none'}, "
                      f"target alive: {alive}, commands open after: {opened}")
    finally:
        stop_target(target)
        logf.close()
    with open(os.path.join(out, "fuzz.json"), "w") as f:
        json.dump({"fuzzer": fuzz, "seconds": t, "seeds": seeds, "runs": runs, "failed": failed}, f, indent=1)
    with open(os.path.join(out, "fuzz.md"), "w") as f:
        f.write(f"# ci/bench fuzz: SPDK nvme_fuzz -a, {t} s a run\n\n")
        f.write("| subsystem | seed | ended by itself | wall s | I/O commands | admin commands | queue timeouts | submit errors | open after |\n")
        f.write("|---|---|---|---|---|---|---|---|---|\n")
        for r in runs:
            f.write(f"| {r['subsystem']} | {r['seed']} | {'yes' if r['completed'] and r['rc'] == 0 else 'NO'} | {r['wall_s']} | "
                    f"{r['io_commands']} | {r['admin_commands']} | {len(r['queue_timeouts'])} | "
                    f"{', '.join(r['submit_errors']) or 'none'} | {r['open_after']} |\n")
    print(f"fuzz: {len(runs) - failed} of {len(runs)} runs ended by themselves with every command completed; {out}/fuzz.json")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
