#!/bin/bash
# Scenario pollux-multipath: the Linux host's native NVMe multipath over pollux's ANA (NVMe
# 2.0 §8.1.3). One pollux, two listeners of one subsystem: the host connects both, sees one
# namespace with two paths, optimized and non-optimized (`nvme list-subsys`, the paths'
# ana_state in sysfs); fio verify runs while `pollux ctl set-ana-state` makes the optimized
# path inaccessible and then optimized again: no I/O error, the I/O moves to the other path
# (its sysfs counters grow) and back, and the host's view of the states follows.
# Guest side: ci/guest/guest.d/pollux-multipath.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux

sub=nqn.2026-11.io.pollux.ci:multipath
p1=$(free_port) p2=$(free_port)
share=$CI_LOG_DIR/share
mkdir -p "$share"
sock=$CI_LOG_DIR/pollux.sock
conf=$CI_LOG_DIR/pollux.toml
cat > "$conf" <<TOML
[reactors]
cores = [0, 1]

[control]
socket = "$sock"

[[listener]]
address = "127.0.0.1:$p1"

[[listener]]
address = "127.0.0.1:$p2"
ana = { 1 = "non-optimized" }

[[subsystem]]
nqn = "$sub"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "64MiB" } }
TOML
ctl() { "$POLLUX_BIN" ctl --socket "$sock" "$@"; }
wait_guest() {
    local deadline=$((SECONDS + 300))
    while [ ! -e "$share/g-$1" ]; do
        kill -0 "$guest" 2>/dev/null || { wait "$guest" || true; fail "the guest ended before step $1"; }
        [ $SECONDS -lt $deadline ] || fail "the guest never reached step $1"
        sleep 0.3
    done
}
answer() { : > "$share/h-$1"; }

start_pollux "$conf" "$p1"
run_guest pollux-multipath.sh --timeout 600 --share "$share" --guestfwd "4420=$p1" --guestfwd "4421=$p2" \
    --env "SUB=$sub" &
guest=$!
ci_track "$guest"

wait_guest inaccessible
t0=$(date +%s%N)
ctl set-ana-state "127.0.0.1:$p1" 1 inaccessible || fail "ctl set-ana-state inaccessible"
echo "$t0" > "$share/h-inaccessible.t0"
ctl subsystems | tee "$CI_LOG_DIR/subsystems-inaccessible.txt"
grep -q "127.0.0.1:$p1 ana 1:inaccessible" "$CI_LOG_DIR/subsystems-inaccessible.txt" ||
    fail "ctl subsystems does not show the inaccessible path"
# A bad request changes nothing.
if out=$(ctl set-ana-state "127.0.0.1:$p1" 999 optimized 2>&1); then fail "group 999 was accepted"; fi
log "refused as expected: $out"
answer inaccessible

wait_guest optimized
ctl set-ana-state "127.0.0.1:$p1" 1 optimized || fail "ctl set-ana-state optimized"
answer optimized

wait "$guest" || fail "pollux-multipath guest failed (console $CI_LOG_DIR/guest-pollux-multipath.log)"
grep -q "ANA states changed" "$CI_LOG_DIR"/pollux.log || fail "no ANA change logged"
stop_pollux || fail "pollux did not stop cleanly"
log "PASS"
