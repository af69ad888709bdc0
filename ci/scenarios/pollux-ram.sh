#!/bin/bash
# Scenario pollux-ram: the guest's kernel NVMe/TCP host (nvme-cli, fio) against pollux running
# on the host, serving two subsystems of RAM namespaces. The guest reaches pollux at
# 10.0.2.100:4420 and :8009 through slirp guestfwd relays. Steps and checks:
# ci/guest/guest.d/pollux-ram.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux

p_io=$(free_port)
p_disc=$(free_port)
sub1=nqn.2026-11.io.pollux.ci:ram1
sub2=nqn.2026-11.io.pollux.ci:restricted
hostid=6c0e5c1a-2f5b-4d8e-9b44-3a2f1c0d9e77
allowed=nqn.2014-08.org.nvmexpress:uuid:$hostid
conf=$CI_LOG_DIR/pollux.toml
cat > "$conf" <<TOML
[reactors]
cores = [0, 1]
mode = "interrupt"

[[listener]]
address = "127.0.0.1:$p_io"

[[listener]]
address = "127.0.0.1:$p_disc"

[[subsystem]]
nqn = "$sub1"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "64MiB" } }

[[subsystem.namespace]]
nsid = 2
block_size = 4096
backend = { ram = { size = "16MiB" } }

[[subsystem]]
nqn = "$sub2"
hosts = ["$allowed"]

[[subsystem.namespace]]
nsid = 1
backend = { ram = { size = "16MiB" } }
TOML
"$POLLUX_BIN" --check "$conf" || fail "pollux --check rejects the scenario conf"
start_pollux "$conf" "$p_io"
run_guest pollux-ram.sh --timeout 600 --guestfwd "4420=$p_io" --guestfwd "8009=$p_disc" \
    --env "SUB1=$sub1" --env "SUB2=$sub2" --env "ALLOWED_HOST=$allowed" --env "ALLOWED_HOSTID=$hostid" ||
    fail "pollux-ram guest failed (pollux log: $POLLUX_LOG)"
grep -q "controller created" "$POLLUX_LOG" || fail "pollux logged no controller"
stop_pollux || fail "pollux did not stop cleanly on SIGTERM"
log "PASS"
