#!/bin/bash
# Scenario pollux-file: a file namespace (O_DIRECT, io_uring) served to the guest's kernel
# NVMe/TCP host; fio verify at 4k and 1m; then the crash test: pollux is killed with SIGKILL
# at random moments ROUNDS times and restarted while the guest writes and flushes; every
# write acknowledged after a completed flush must survive. Guest side:
# ci/guest/guest.d/pollux-file.sh. Ten rounds with the Linux host (ROUNDS): the fault
# campaign in ci/test (target/benches/faults) kills pollux under a file namespace at random
# moments too, checking every block against its history.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux
ROUNDS=${ROUNDS:-10}

nqn=nqn.2026-11.io.pollux.ci:file
p=$(free_port)
share=$CI_LOG_DIR/share
mkdir -p "$share"
disk=$CI_LOG_DIR/disk0.img
rm -f "$disk"
conf=$CI_LOG_DIR/pollux.toml
cat > "$conf" <<TOML
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:$p"

[control]
socket = "$CI_LOG_DIR/ctl.sock"

[[subsystem]]
nqn = "$nqn"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = { file = { path = "$disk", size = "512MiB", direct = true } }
TOML
"$POLLUX_BIN" --check "$conf" || fail "pollux --check rejects the scenario conf"
start_pollux "$conf" "$p"
# The namespace must be served through io_uring, not the worker-thread fallback: the
# fallback works but is not what this scenario measures.
subs=$("$POLLUX_BIN" ctl --config "$conf" subsystems) || fail "pollux ctl subsystems failed"
grep -q "io_uring" <<<"$subs" || fail "the file namespace is not on io_uring: $subs"
grep -q "io=\"io_uring\"\|io=io_uring" "$POLLUX_LOG" || fail "pollux did not log the namespace's I/O path at start"
run_guest pollux-file.sh --timeout 900 --guestfwd "4420=$p" --share "$share" --env "NQN=$nqn" &
guest=$!
ci_track "$guest"

# Wait until the guest has connected and passed the functional part.
deadline=$((SECONDS + 600))
while [ ! -e "$share/connected" ]; do
    kill -0 "$guest" 2>/dev/null || { wait "$guest" || true; fail "the guest ended before the crash test"; }
    [ $SECONDS -lt $deadline ] || fail "the guest never reached the crash test"
    sleep 0.5
done
kills=0
acked() { cat "$share/acked" 2>/dev/null || echo 0; }
while [ $kills -lt "$ROUNDS" ]; do
    # Each round: wait for a newly acknowledged generation (so the host has reconnected and
    # is writing), then kill at a random moment 0 to 0.9 s into the next one.
    last=$(acked)
    deadline=$((SECONDS + 120))
    while [ "$(acked)" = "$last" ]; do
        kill -0 "$guest" 2>/dev/null || { wait "$guest" || true; fail "the guest ended during the crash test"; }
        [ $SECONDS -lt $deadline ] || fail "no generation acknowledged for 120 s after restart $kills"
        sleep 0.1
    done
    sleep "0.$((RANDOM % 10))"
    kill -KILL "$POLLUX_PID"
    wait "$POLLUX_PID" 2>/dev/null || true
    POLLUX_PID=""
    kills=$((kills + 1))
    log "crash test: killed pollux ($kills/$ROUNDS) after generation $(acked)"
    start_pollux "$conf" "$p"
done
# Let the guest finish a few more generations on the last instance, then stop it.
sleep 3
touch "$share/stop"
wait "$guest" || fail "pollux-file guest failed"
log "crash test: $(cat "$share/acked") generations acknowledged; none lost over $ROUNDS kills"
stop_pollux || fail "pollux did not stop cleanly on SIGTERM"
log "PASS"
