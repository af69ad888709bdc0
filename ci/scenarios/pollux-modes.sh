#!/bin/bash
# Scenario pollux-modes: simulated-SSD namespaces served in each reactor mode (adaptive,
# hybrid, interrupt, then busy-poll) to the guest's kernel NVMe/TCP host, with
# crc32c-verified fio through each. Afterwards each pollux must stop cleanly on SIGTERM and
# its reactor summary must show the mode it ran in (and, for adaptive, at least one policy
# switch). The busy-poll target runs alone, with a second guest boot: its reactor spins a
# core for as long as it runs, which the sleeping modes' targets on the same core and the
# TCG guest must not have to share. The interrupt-mode target's second namespace starts
# `polling = "never"` and is set to `always` through `pollux ctl set-polling` before the
# guest runs: the host's I/O to it must hold that reactor in busy-poll (hold_entries).
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux

nqn=nqn.2026-11.io.pollux.ci:sim
declare -A port pid logf
# start_target MODE: a pollux in MODE on a free port, left running.
start_target() {
    local mode=$1 p conf polling=auto
    p=$(free_port)
    port[$mode]=$p
    conf=$CI_LOG_DIR/$mode.toml
    [ "$mode" = interrupt ] && polling=never
    cat > "$conf" <<TOML
[reactors]
cores = [1]
mode = "$mode"

[control]
socket = "$CI_LOG_DIR/$mode.sock"

[[listener]]
address = "127.0.0.1:$p"

[[subsystem]]
nqn = "$nqn"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = { sim = { size = "64MiB", read = { median_us = 80.0, sigma = 0.3 }, write = { median_us = 30.0, sigma = 0.3 }, interrupt_delay_us = 3.0 } }

[[subsystem.namespace]]
nsid = 2
polling = "$polling"
backend = { sim = { size = "16MiB", read = { fixed_us = 10.0 }, write = { fixed_us = 10.0 }, parallelism = 8, bandwidth = "1GiB" } }
TOML
    start_pollux "$conf" "$p"
    pid[$mode]=$POLLUX_PID
    logf[$mode]=$POLLUX_LOG
    # start_pollux tracks one pollux at a time: keep this one running, start the next.
    POLLUX_PID=""
}
# stop_target MODE: SIGTERM, a clean stop, and its reactor summary in the log.
stop_target() {
    local mode=$1 summary
    POLLUX_PID=${pid[$mode]} POLLUX_LOG=${logf[$mode]}
    stop_pollux || fail "pollux ($mode) did not stop cleanly"
    summary=$(grep "reactor summary" "${logf[$mode]}") || fail "no reactor summary from pollux ($mode)"
    log "$mode: ${summary#*INFO }"
}
for mode in adaptive hybrid interrupt; do
    start_target "$mode"
done
ctl=("$POLLUX_BIN" ctl --socket "$CI_LOG_DIR/interrupt.sock")
"${ctl[@]}" set-polling "$nqn" 2 always >/dev/null || fail "ctl set-polling failed"
"${ctl[@]}" --json subsystems | grep '"polling": *"always"' >/dev/null ||
    fail "ctl subsystems does not show the namespace's polling set to always"
run_guest pollux-modes.sh --timeout 600 --guestfwd "4420=${port[adaptive]}" \
    --guestfwd "4421=${port[hybrid]}" --guestfwd "4422=${port[interrupt]}" --env "NQN=$nqn" ||
    fail "pollux-modes guest failed"
for mode in adaptive hybrid interrupt; do
    stop_target "$mode"
done
grep "reactor summary" "${logf[adaptive]}" | grep -qE 'adaptive=true switches=[1-9]' ||
    fail "the adaptive reactor never switched mode under load"
grep "reactor summary" "${logf[hybrid]}" | grep -qE 'wakeups=[1-9]' ||
    fail "the hybrid reactor took no timed sleep"
grep "reactor summary" "${logf[interrupt]}" | grep -qE 'hold_entries=[1-9]' ||
    fail "the always namespace's I/O never held the interrupt-mode reactor in busy-poll"

# Busy-poll: connections that carry I/O leave epoll and are read every iteration.
start_target poll
run_guest pollux-modes.sh --timeout 600 --guestfwd "4420=${port[poll]}" --env "NQN=$nqn" \
    --env "PORTS=4420" || fail "pollux-modes guest failed against the busy-poll target"
stop_target poll
grep "reactor summary" "${logf[poll]}" | grep -qE 'mode=poll .*poll_pct="100.0"' ||
    fail "the busy-poll reactor did not poll all the time"
grep "reactor summary" "${logf[poll]}" | grep -qE 'hot_entries=[1-9]' ||
    fail "no connection of the busy-poll reactor was ever polled outside epoll"
log "PASS"
