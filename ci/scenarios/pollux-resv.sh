#!/bin/bash
# Scenario pollux-resv: persistent reservations (NVMe 2.0 §8.19) between two Linux hosts
# sharing one file namespace of pollux. The guest connects twice with distinct host NQNs and
# host IDs (nvme_core.multipath=N, so each controller is its own block device, as two cluster
# nodes would see it) and drives nvme-cli's resv-register, resv-acquire (write exclusive,
# exclusive access, preempt), resv-report (extended) and resv-release: the non-holder's
# writes fail with Reservation Conflict and its reads follow the type. Then pollux is killed
# with SIGKILL and started again on the same conf: with PTPL set, the guest's hosts reconnect
# and find the same registrants and reservation, still enforced. Guest side:
# ci/guest/guest.d/pollux-resv.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux

sub=nqn.2026-11.io.pollux.ci:resv
port=$(free_port) prel=$(free_port)
share=$CI_LOG_DIR/share
mkdir -p "$share"
conf=$CI_LOG_DIR/pollux.toml
cat > "$conf" <<TOML
state_dir = "$CI_LOG_DIR/state"

[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:$port"

[[subsystem]]
nqn = "$sub"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = { file = { path = "$CI_LOG_DIR/shared.img", size = "64MiB" } }
TOML
"$POLLUX_BIN" --check "$conf" || fail "pollux --check rejects the scenario conf"
start_pollux "$conf" "$port"

# The relay: a guest line "kill" on 10.0.2.100:9000 kills pollux with SIGKILL and starts it
# again on the same conf and port.
pid_file=$CI_LOG_DIR/pollux-b.pid
relay=$CI_LOG_DIR/relay.sh
cat > "$relay" <<SH
#!/bin/bash
read -r cmd
[ "\$cmd" = kill ] || { echo "unknown \$cmd"; exit 0; }
kill -9 $POLLUX_PID
while kill -0 $POLLUX_PID 2>/dev/null; do sleep 0.05; done
NO_COLOR=1 setsid "$POLLUX_BIN" --config "$conf" >>"$CI_LOG_DIR/pollux-restarted.log" 2>&1 </dev/null &
echo \$! > "$pid_file"
for _ in \$(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && { echo restarted; exit 0; }; sleep 0.1; done
echo "not listening"
SH
chmod +x "$relay"
busybox nc -ll -p "$prel" -e "$relay" >"$CI_LOG_DIR/relay.log" 2>&1 &
ci_track $!
stop_b() { [ -s "$pid_file" ] && kill "$(cat "$pid_file")" 2>/dev/null; rm -f "$pid_file"; }
trap 'stop_b; ci_cleanup' EXIT

run_guest pollux-resv.sh --timeout 600 --share "$share" --guestfwd "4420=$port" --guestfwd "9000=$prel" \
    --append "nvme_core.multipath=N" --env "SUB=$sub" ||
    fail "pollux-resv guest failed (console $CI_LOG_DIR/guest-pollux-resv.log)"
ls "$CI_LOG_DIR/state"/resv-*.json >/dev/null 2>&1 || fail "no reservation state file was written"
grep -q "reservations restored" "$CI_LOG_DIR/pollux-restarted.log" ||
    fail "the restarted pollux did not restore the reservations"
# The first pollux was killed: the harness must not wait for it.
_ci_forget "$POLLUX_PID"
POLLUX_PID=""
[ -s "$pid_file" ] || fail "the restarted pollux is gone"
kill -TERM "$(cat "$pid_file")"
rm -f "$pid_file"
log "PASS"
