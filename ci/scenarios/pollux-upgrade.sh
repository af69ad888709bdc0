#!/bin/bash
# Scenario pollux-upgrade (issue 39): the Linux host keeps its connections while pollux is
# upgraded ten times in a row (`pollux ctl upgrade`, the same binary: every time a new
# process takes the listeners, the live connections and the queues' state over). The host
# runs fio verify on a RAM namespace through a controller of 4 I/O queues, and on a file
# namespace through two controllers over two paths (native multipath), while the guest asks
# for the upgrades one after another: fio finishes without an error, both verify, the
# kernel log has no reconnect, reset or I/O error, and each upgrade answered with a new pid.
# Measured (TCG: function, not speed): each upgrade's pause as the target reports it, in
# $CI_LOG_DIR/upgrade.txt. Guest side: ci/guest/guest.d/pollux-upgrade.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux

ram=nqn.2026-12.io.pollux.ci:upgrade-ram
file=nqn.2026-12.io.pollux.ci:upgrade-file
p1=$(free_port) p2=$(free_port) prel=$(free_port)
share=$CI_LOG_DIR/share
rm -rf "$share"
mkdir -p "$share"
disk=$CI_LOG_DIR/upgrade.img
rm -f "$disk"
truncate -s 64M "$disk"
sock=$CI_LOG_DIR/pollux.sock
conf=$CI_LOG_DIR/pollux.toml
cat > "$conf" <<TOML
[reactors]
cores = [0, 1]
mode = "interrupt"

[control]
socket = "$sock"

[[listener]]
address = "127.0.0.1:$p1"

[[listener]]
address = "127.0.0.1:$p2"
ana = { 1 = "non-optimized" }

[[subsystem]]
nqn = "$ram"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "64MiB" } }

[[subsystem]]
nqn = "$file"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = { file = { path = "$disk" } }
TOML
"$POLLUX_BIN" --check "$conf" >/dev/null || fail "the conf is invalid"
ctl() { "$POLLUX_BIN" ctl --socket "$sock" "$@"; }
# The pid serving now (an upgrade replaces the harness's process with another).
serving_pid() { ctl --json version | sed -n 's/.*"pid": *\([0-9]*\).*/\1/p'; }
stop_serving() {
    local pid
    pid=$(serving_pid 2>/dev/null) || return 0
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
}
trap 'stop_serving; ci_cleanup' EXIT

start_pollux "$conf" "$p1"
first=$POLLUX_PID
# The relay: a guest line "upgrade" on 10.0.2.100:9000 upgrades pollux now and answers
# "upgraded PID" (or the refusal), so the guest paces the upgrades.
relay=$CI_LOG_DIR/relay.sh
cat > "$relay" <<SH
#!/bin/bash
read -r cmd
[ "\$cmd" = upgrade ] || { echo "unknown \$cmd"; exit 0; }
out=\$("$POLLUX_BIN" ctl --socket "$sock" upgrade --binary "$POLLUX_BIN" 2>&1)
echo "\$out" >> "$CI_LOG_DIR/upgrade.txt"
case \$out in
    upgraded:*) echo "upgraded \$(echo "\$out" | sed -n 's/^upgraded: pid \\([0-9]*\\).*/\\1/p')" ;;
    *) echo "failed: \$out" | head -1 ;;
esac
SH
chmod +x "$relay"
: > "$CI_LOG_DIR/upgrade.txt"
busybox nc -ll -p "$prel" -e "$relay" >>"$CI_LOG_DIR/relay.log" 2>&1 &
ci_track $!

# Four vCPUs: the Linux host makes at most one I/O queue per CPU.
run_guest pollux-upgrade.sh --timeout 900 --smp 4 --share "$share" --guestfwd "4420=$p1" --guestfwd "4421=$p2" \
    --guestfwd "9000=$prel" --env "RAM=$ram" --env "FILE=$file" ||
    fail "pollux-upgrade guest failed (console $CI_LOG_DIR/guest-pollux-upgrade.log)"
cat "$CI_LOG_DIR/upgrade.txt"
n=$(grep -c '^upgraded: pid' "$CI_LOG_DIR/upgrade.txt" || true)
[ "$n" = 10 ] || fail "$n upgrades of 10 succeeded"
now=$(serving_pid)
if [ -z "$now" ] || [ "$now" = "$first" ]; then fail "the pid serving ($now) is still the first ($first)"; fi
kill -0 "$first" 2>/dev/null && fail "the first process ($first) still runs"
grep -q "upgrade: serving every queue handed over" "$POLLUX_LOG" || fail "no takeover logged"
# Every close is the host's own (its disconnect at the end). An I/O queue whose controller
# went first, because the host's admin queue close reached its reactor before the I/O
# queue's own, closes as "controller deleted": the controller's deletion must then be the
# host's doing too.
if grep -E "panicked|connection closed.*reason|controller deleted.*reason" "$POLLUX_LOG" |
    grep -v "Disconnect\|disconnect\|PeerClosed\|peer closed\|connection closed.*reason=\"controller deleted\"" |
    head -5 | grep .; then
    fail "a connection was closed across the upgrades"
fi
stop_serving
log "PASS"
