#!/bin/bash
# Scenario pollux-failover: two pollux targets, A and B, export one subsystem over one
# shared file (`shared = true`) with disjoint controller-ID ranges; the Linux host's native
# multipath sees one namespace with two paths (A optimized, B non-optimized). fio verify
# runs while A is killed with SIGKILL: fio finishes without an error through B; A restarts
# and the host reconnects its path by itself, and I/O comes back to it. A refers to B in
# its discovery log (a referral entry the host's nvme discover lists). Measured, not
# asserted (TCG: function, not speed): the time from the kill to the first I/O completed
# through B, the largest fio completion latency, and the host's reconnect time, in
# $CI_LOG_DIR/failover.txt. Guest side: ci/guest/guest.d/pollux-failover.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux

sub=nqn.2026-11.io.pollux.ci:failover
only_b=nqn.2026-11.io.pollux.ci:only-b
pa=$(free_port) pb=$(free_port) prel=$(free_port)
share=$CI_LOG_DIR/share
rm -rf "$share"
mkdir -p "$share"
disk=$CI_LOG_DIR/shared.img
rm -f "$disk"
truncate -s 64M "$disk"
# conf NAME PORT CNTLID-RANGE EXTRA-LISTENER EXTRA: target NAME's conf.
conf() {
    cat > "$CI_LOG_DIR/$1.toml" <<TOML
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:$2"
$4

[[subsystem]]
nqn = "$sub"
allow_any_host = true
$3

[[subsystem.namespace]]
nsid = 1
backend = { file = { path = "$disk", shared = true } }
$5
TOML
    "$POLLUX_BIN" --check "$CI_LOG_DIR/$1.toml" >/dev/null || fail "conf $1 is invalid"
}
# A refers to B's discovery (as the guest reaches it: 10.0.2.100:4421).
conf a "$pa" $'min_cntlid = 1\nmax_cntlid = 100' "" $'\n[[referral]]\naddress = "10.0.2.100:4421"'
conf b "$pb" $'min_cntlid = 101\nmax_cntlid = 200' 'ana = { 1 = "non-optimized" }' \
    "$(printf '\n[[subsystem]]\nnqn = "%s"\nallow_any_host = true\n[[subsystem.namespace]]\nnsid = 1\nbackend = { ram = { size = "8MiB" } }\n' "$only_b")"

# Target B runs as the harness's pollux; A is started and killed by the relay below.
start_pollux "$CI_LOG_DIR/b.toml" "$pb"
a_pid=$CI_LOG_DIR/a.pid
trap 'stop_side_pollux a; ci_cleanup' EXIT
start_side_pollux a "$CI_LOG_DIR/a.toml" "$pa"

# The relay: a guest line "kill" or "restart" on 10.0.2.100:9000 runs it now, so the
# guest times the failover from its own clock.
relay=$CI_LOG_DIR/relay.sh
cat > "$relay" <<SH
#!/bin/bash
read -r cmd
case \$cmd in
    kill) kill -9 "\$(cat "$a_pid")" && rm -f "$a_pid" && echo killed ;;
    restart) NO_COLOR=1 setsid "$POLLUX_BIN" --config "$CI_LOG_DIR/a.toml" >>"$CI_LOG_DIR/pollux-a.log" 2>&1 </dev/null &
        echo \$! > "$a_pid"; sleep 0.5; echo restarted ;;
    *) echo "unknown \$cmd" ;;
esac
SH
chmod +x "$relay"
busybox nc -ll -p "$prel" -e "$relay" >"$CI_LOG_DIR/relay.log" 2>&1 &
ci_track $!

run_guest pollux-failover.sh --timeout 600 --share "$share" --guestfwd "4420=$pa" --guestfwd "4421=$pb" \
    --guestfwd "9000=$prel" --env "SUB=$sub" --env "ONLY_B=$only_b" ||
    fail "pollux-failover guest failed (console $CI_LOG_DIR/guest-pollux-failover.log)"
cp "$share/failover.txt" "$CI_LOG_DIR/failover.txt" 2>/dev/null || fail "the guest wrote no measurements"
cat "$CI_LOG_DIR/failover.txt"
grep -q "controller created cntlid=1[0-9][0-9] " "$POLLUX_LOG" || fail "B handed out no controller ID from 101..=200"
stop_side_pollux a
stop_pollux || fail "pollux B did not stop cleanly"
log "PASS"
