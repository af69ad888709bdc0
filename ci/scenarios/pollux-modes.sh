#!/bin/bash
# Scenario pollux-modes: simulated-SSD namespaces served in each reactor mode (adaptive,
# hybrid, interrupt) to the guest's kernel NVMe/TCP host, with crc32c-verified fio through
# each. Afterwards each pollux must stop cleanly on SIGTERM and its reactor summary must show
# the mode it ran in (and, for adaptive, at least one policy switch).
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux

nqn=nqn.2026-11.io.pollux.ci:sim
declare -A port pid logf
for mode in adaptive hybrid interrupt; do
    p=$(free_port)
    port[$mode]=$p
    conf=$CI_LOG_DIR/$mode.toml
    cat > "$conf" <<TOML
[reactors]
cores = [1]
mode = "$mode"

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
backend = { sim = { size = "16MiB", read = { fixed_us = 10.0 }, write = { fixed_us = 10.0 }, parallelism = 8, bandwidth = "1GiB" } }
TOML
    start_pollux "$conf" "$p"
    pid[$mode]=$POLLUX_PID
    logf[$mode]=$POLLUX_LOG
    # start_pollux tracks one pollux at a time: keep this one running, start the next.
    POLLUX_PID=""
done
run_guest pollux-modes.sh --timeout 600 --guestfwd "4420=${port[adaptive]}" \
    --guestfwd "4421=${port[hybrid]}" --guestfwd "4422=${port[interrupt]}" --env "NQN=$nqn" ||
    fail "pollux-modes guest failed"
for mode in adaptive hybrid interrupt; do
    POLLUX_PID=${pid[$mode]} POLLUX_LOG=${logf[$mode]}
    stop_pollux || fail "pollux ($mode) did not stop cleanly"
    summary=$(grep "reactor summary" "${logf[$mode]}") || fail "no reactor summary from pollux ($mode)"
    log "$mode: ${summary#*INFO }"
done
grep "reactor summary" "${logf[adaptive]}" | grep -qE 'adaptive=true switches=[1-9]' ||
    fail "the adaptive reactor never switched mode under load"
grep "reactor summary" "${logf[hybrid]}" | grep -qE 'wakeups=[1-9]' ||
    fail "the hybrid reactor took no timed sleep"
log "PASS"
