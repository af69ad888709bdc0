#!/bin/bash
# Scenario perf-nvmet: pollux perf (the load generator of ci/bench, issue 5) against a
# target that is not pollux: the Linux kernel's nvmet-tcp in the guest. Its --verify mode
# must pass there with in-capsule and R2T writes, digests, and SQ flow control on and off;
# and its QD1 latency must agree with fio's through the kernel host on the same target.
# That comparison is a sanity check of what perf measures (a unit or clock mistake is off
# by 1000x), not a speed test: under TCG the two runs, one after the other, swing apart by
# more than 2x, so "agree" means within a factor of 5 either way. The ratio goes to
# $CI_LOG_DIR/perf-vs-fio.txt; the speed comparison itself lives in ci/bench. Guest steps: ci/guest/guest.d/perf-nvmet.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux

share=$CI_LOG_DIR/share
rm -rf "$share"
mkdir -p "$share"
cp "$POLLUX_BIN" "$share/pollux"
run_guest perf-nvmet.sh --timeout 300 --share "$share" \
    --env NQN=nqn.2024-01.io.pollux.ci:perf-nvmet --env PORT=4420 ||
    fail "perf-nvmet guest failed (console $CI_LOG_DIR/guest-perf-nvmet.log)"

/usr/bin/python3 - "$share" >"$CI_LOG_DIR/perf-vs-fio.txt" <<'PY' || { cat "$CI_LOG_DIR/perf-vs-fio.txt"; fail "pollux perf and fio disagree"; }
import json, sys
share = sys.argv[1]
perf = json.load(open(f"{share}/perf-qd1.json"))
fio = json.load(open(f"{share}/fio-qd1.json"))["jobs"][0]["read"]
p = perf["latency_ns"]["p50"] / 1e3
f = fio["lat_ns"]["percentile"]["50.000000"] / 1e3
print(f"QD1 4k randread against nvmet-tcp in the TCG guest: pollux perf p50 {p:.1f} us "
      f"({perf['iops']:.0f} IOPS), fio via the kernel host p50 {f:.1f} us ({fio['iops']:.0f} IOPS): "
      f"perf/fio = {p / f:.2f}")
sys.exit(0 if 0.2 <= p / f <= 5.0 else 1)
PY
cat "$CI_LOG_DIR/perf-vs-fio.txt"
rm -f "$share/pollux"
log "PASS"
