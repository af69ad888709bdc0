#!/bin/bash
# Scenario pollux-multipath: the Linux host's native NVMe multipath over pollux's ANA (NVMe
# 2.0 §8.1.3). One pollux, two listeners of one subsystem: the host connects both, sees one
# namespace with two paths, optimized and non-optimized (`nvme list-subsys`, the paths'
# ana_state in sysfs); fio verify runs while `pollux ctl set-ana-state` makes the optimized
# path inaccessible and then optimized again: no I/O error, the I/O moves to the other path
# (its sysfs counters grow) and back, and the host's view of the states follows. Measured
# (TCG: function, not speed): from `set-ana-state` to the host showing the new state and to
# the first I/O through the other path, in $CI_LOG_DIR/ana-change.txt.
# Guest side: ci/guest/guest.d/pollux-multipath.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux

sub=nqn.2026-11.io.pollux.ci:multipath
p1=$(free_port) p2=$(free_port) prel=$(free_port)
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

start_pollux "$conf" "$p1"
# The relay: a guest line "inaccessible" or "optimized" on 10.0.2.100:9000 sets group 1 of
# the first listener so at once, so the guest times the change from its own clock.
relay=$CI_LOG_DIR/relay.sh
cat > "$relay" <<SH
#!/bin/bash
read -r state
"$POLLUX_BIN" ctl --socket "$sock" set-ana-state "127.0.0.1:$p1" 1 "\$state" >>"$CI_LOG_DIR/relay.log" 2>&1 &&
    echo set || echo failed
SH
chmod +x "$relay"
busybox nc -ll -p "$prel" -e "$relay" >>"$CI_LOG_DIR/relay.log" 2>&1 &
ci_track $!
run_guest pollux-multipath.sh --timeout 600 --share "$share" --guestfwd "4420=$p1" --guestfwd "4421=$p2" \
    --guestfwd "9000=$prel" --env "SUB=$sub" &
guest=$!
ci_track "$guest"

wait_guest inaccessible
ctl subsystems | tee "$CI_LOG_DIR/subsystems-inaccessible.txt"
grep -qE "^ +127\.0\.0\.1:$p1 +none +1:inaccessible\b" "$CI_LOG_DIR/subsystems-inaccessible.txt" ||
    fail "ctl subsystems does not show the inaccessible path"
# A bad request changes nothing.
if out=$(ctl set-ana-state "127.0.0.1:$p1" 999 optimized 2>&1); then fail "group 999 was accepted"; fi
log "refused as expected: $out"
answer inaccessible

wait "$guest" || fail "pollux-multipath guest failed (console $CI_LOG_DIR/guest-pollux-multipath.log)"
cp "$share/ana-change.txt" "$CI_LOG_DIR/ana-change.txt" 2>/dev/null || fail "the guest wrote no measurements"
cat "$CI_LOG_DIR/ana-change.txt"
grep -q "ANA states changed" "$CI_LOG_DIR"/pollux.log || fail "no ANA change logged"
stop_pollux || fail "pollux did not stop cleanly"
log "PASS"
