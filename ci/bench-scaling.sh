#!/bin/bash
# Issue 38 item 3: 4K random read IOPS of one pollux target with 1, 2, 4 and 8 poll-mode
# reactors (cores 0..N-1), loaded by `pollux perf` on 8 other cores (2 connections each, QD32,
# so the client's capacity is the same for every N), the target in the perf process
# (--target-conf). Needs 16 cores: run on a lent 16-core machine, once, as one script:
#   ci/bench-scaling.sh POLLUX_BIN OUT_DIR
# Runs N in the order 1 2 4 8 8 4 2 1 (BENCH_SCALING_T s each, 3; 1 s warmup after --fill)
# and writes OUT_DIR/scaling.jsonl (one perf report per run) and OUT_DIR/scaling.md.
set -euo pipefail
bin=$1 out=$2
t=${BENCH_SCALING_T:-3}
export RUST_LOG=${RUST_LOG:-warn}
mkdir -p "$out"
cores=$(nproc)
[ "$cores" -ge 16 ] || { echo "bench-scaling: $cores cores, 16 needed" >&2; exit 2; }
echo "bench-scaling: $cores cores, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" | tee "$out/scaling.txt"
: > "$out/scaling.jsonl"
for n in 1 2 4 8 8 4 2 1; do
    list=$(seq -s, 0 $((n - 1)))
    conf=$out/scaling-$n.toml
    cat > "$conf" <<TOML
[reactors]
cores = [$list]
mode = "poll"

[[listener]]
address = "127.0.0.1:0"

[transport]
max_io_queues = 64
io_queue_depth = 256

[[subsystem]]
nqn = "nqn.2026-12.io.pollux:scaling"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
block_size = 4096
backend = { ram = { size = "1GiB" } }
TOML
    r=$("$bin" perf --target-conf "$conf" -r "subnqn:nqn.2026-12.io.pollux:scaling" --cores 8-15 \
        --conns-per-core 2 -q 32 -w randread -o 4096 -t "$t" --warmup 1 --fill --span 512MiB --no-probe \
        --json --tag "reactors=$n" 2>>"$out/perf.log")
    echo "$r" | tail -1 >> "$out/scaling.jsonl"
    echo "$r" | tail -1 | python3 -c "import json,sys; r=json.load(sys.stdin); print('reactors', $n, 'iops', round(r['iops']), 'p50_us', r['latency_ns']['p50']/1e3)" | tee -a "$out/scaling.txt"
done
python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
runs = [json.loads(l) for l in open(f"{out}/scaling.jsonl")]
by = {}
for r in runs:
    by.setdefault(int(r["tags"]["reactors"]), []).append(r)
base = statistics.median(x["iops"] for x in by[1])
lines = ["| reactors | IOPS (each run) | median | x 1 reactor | p50 us (median) |", "|---|---|---|---|---|"]
for n in sorted(by):
    ios = [x["iops"] for x in by[n]]
    m = statistics.median(ios)
    p50 = statistics.median(x["latency_ns"]["p50"] for x in by[n]) / 1e3
    lines.append(f"| {n} | {', '.join(f'{i / 1e3:.0f}k' for i in ios)} | {m / 1e3:.0f}k | {m / base:.2f} | {p50:.0f} |")
open(f"{out}/scaling.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
