#!/bin/bash
# Scenario pollux-spdk-rpc (issue 51): a pollux target configured only through SPDK's own RPC
# client (`spdk-rpc`, the spdk package's rpc.py) in the sequence SPDK users run (transport, a
# malloc bdev, a subsystem with ANA reporting, a namespace, a listener, a host), served to
# the guest's Linux NVMe/TCP host, which discovers it, connects and runs fio verify; then
# the target's state saved as an SPDK JSON config (`save_config`) and served by a fresh
# pollux from that file (`pollux --spdk-config`) to the same host, which connects and
# verifies again (a malloc bdev, like SPDK's, starts empty). Steps and checks:
# ci/guest/guest.d/pollux-spdk-rpc.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux
rpc_bin=$(ensure_spdk_client) || fail "cannot install SPDK's Python client (the spdk package)"

p_io=$(free_port)
p_ctl=$(free_port)
sub=nqn.2016-06.io.spdk:cnode1
hostid=6c0e5c1a-2f5b-4d8e-9b44-3a2f1c0d9e51
host=nqn.2014-08.org.nvmexpress:uuid:$hostid
sock=$CI_LOG_DIR/spdk.sock
conf=$CI_LOG_DIR/pollux.toml
# Only what SPDK takes from its command line: a core and the RPC socket. pollux needs a
# listener to start: the control port, which serves no subsystem.
cat > "$conf" <<TOML
[reactors]
cores = [0, 1]
mode = "interrupt"

[control]
socket = "$sock"

[[listener]]
address = "127.0.0.1:$p_ctl"
TOML
start_pollux "$conf" "$p_ctl"
rpc() { "$rpc_bin" -s "$sock" "$@"; }
rpc nvmf_create_transport -t TCP || fail "nvmf_create_transport"
rpc bdev_malloc_create -b Malloc0 64 512 || fail "bdev_malloc_create"
rpc nvmf_create_subsystem "$sub" -s SPDK00000000000001 -m 32 -r || fail "nvmf_create_subsystem"
rpc nvmf_subsystem_add_ns "$sub" Malloc0 || fail "nvmf_subsystem_add_ns"
rpc nvmf_subsystem_add_listener "$sub" -t tcp -a 127.0.0.1 -s "$p_io" -f ipv4 || fail "nvmf_subsystem_add_listener"
rpc nvmf_subsystem_add_host "$sub" "$host" || fail "nvmf_subsystem_add_host"
rpc nvmf_get_subsystems | tee "$CI_LOG_DIR/subsystems.json"
run_guest pollux-spdk-rpc.sh --timeout 600 --guestfwd "4420=$p_io" \
    --env "SUB=$sub" --env "HOST_NQN=$host" --env "HOST_ID=$hostid" ||
    fail "pollux-spdk-rpc guest failed (pollux log: $POLLUX_LOG)"
rpc save_config > "$CI_LOG_DIR/saved.json" || fail "save_config"
stop_pollux || fail "pollux did not stop cleanly on SIGTERM"

# The saved config served by a fresh pollux, to the same host.
log "serving the saved SPDK JSON config"
start_pollux_with "$p_io" --spdk-config "$CI_LOG_DIR/saved.json"
# Its calls follow the listener.
sleep 1
run_guest pollux-spdk-rpc.sh --timeout 600 --guestfwd "4420=$p_io" \
    --env "SUB=$sub" --env "HOST_NQN=$host" --env "HOST_ID=$hostid" ||
    fail "pollux-spdk-rpc guest failed against pollux --spdk-config (log: $POLLUX_LOG)"
stop_pollux || fail "pollux --spdk-config did not stop cleanly on SIGTERM"
log "PASS"
