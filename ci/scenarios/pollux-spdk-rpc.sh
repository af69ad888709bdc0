#!/bin/bash
# Scenario pollux-spdk-rpc (issue 51): a pollux target configured only through SPDK's own RPC
# client (`spdk-rpc`, the spdk package's rpc.py) in the sequence SPDK users run (transport, a
# malloc bdev, a subsystem with ANA reporting, a namespace, a listener, a host), served to
# the guest's Linux NVMe/TCP host, which discovers it, connects and runs fio verify; then
# the target's state saved as an SPDK JSON config (`save_config`) and served by a fresh
# pollux from that file (`pollux --spdk-config`) to the same host, which connects and
# verifies again (a malloc bdev, like SPDK's, starts empty); then Ceph's NVMe-oF gateway's
# sequence for an RBD image, with DH-HMAC-CHAP (below). Steps and checks:
# ci/guest/guest.d/pollux-spdk-rpc.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
# shellcheck source=ci/ceph.sh
. "$CI_REPO/ci/ceph.sh"
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

# Ceph's NVMe-oF gateway's sequence (ceph-nvmeof control/grpc.py over spdk.rpc): a cluster
# registered, an RBD image as a bdev, a subsystem with ANA reporting, a listener, the image
# as a namespace in ANA group 2 visible to no host until added to one, a host with a
# DH-HMAC-CHAP key from SPDK's keyring, the listener's ANA state for the group. The Linux
# host (6.12: DH-HMAC-CHAP) authenticates, sees the group optimized and runs fio verify;
# what it wrote is in the image (rbd export).
log "the RBD gateway sequence"
ceph_ensure_debs
ensure_debs nvme-cli
cdir=$CI_LOG_DIR/ceph
CEPH_IMG_SIZE=64M ceph_start "$cdir"
sub2=nqn.2016-06.io.spdk:rbd1
key=$CI_LOG_DIR/host.key
(umask 077 && nvme gen-dhchap-key --hmac=2 --nqn="$host" > "$key") || fail "nvme gen-dhchap-key failed"
start_pollux "$conf" "$p_ctl"
rpc bdev_rbd_register_cluster rbd_cluster --user admin --config-file "$CEPH_CONF" || fail "bdev_rbd_register_cluster"
rpc bdev_rbd_create -b Ceph0 -c rbd_cluster rbd img0 4096 || fail "bdev_rbd_create"
rpc nvmf_create_subsystem "$sub2" -s CEPH00000000000001 -m 256 -r || fail "nvmf_create_subsystem (rbd)"
rpc nvmf_subsystem_add_listener "$sub2" -t tcp -a 127.0.0.1 -s "$p_io" -f ipv4 || fail "nvmf_subsystem_add_listener (rbd)"
rpc nvmf_subsystem_add_ns "$sub2" Ceph0 -n 1 -a 2 -i || fail "nvmf_subsystem_add_ns (rbd)"
rpc keyring_file_add_key key0 "$key" || fail "keyring_file_add_key"
rpc nvmf_subsystem_add_host "$sub2" "$host" --dhchap-key key0 || fail "nvmf_subsystem_add_host --dhchap-key"
rpc nvmf_ns_add_host "$sub2" 1 "$host" || fail "nvmf_ns_add_host"
rpc nvmf_subsystem_listener_set_ana_state "$sub2" -t tcp -a 127.0.0.1 -s "$p_io" -f ipv4 -n optimized -g 2 ||
    fail "nvmf_subsystem_listener_set_ana_state"
rpc nvmf_get_subsystems | tee "$CI_LOG_DIR/subsystems-rbd.json"
run_guest pollux-spdk-rpc.sh --kernel 6.12 --timeout 600 --guestfwd "4420=$p_io" \
    --env "SUB=$sub2" --env "HOST_NQN=$host" --env "HOST_ID=$hostid" --env "RBD=1" \
    --env "DHCHAP_KEY=$(cat "$key")" ||
    fail "pollux-spdk-rpc guest failed on the RBD sequence (pollux log: $POLLUX_LOG)"
stop_pollux || fail "pollux (rbd) did not stop cleanly on SIGTERM"
# fio verify wrote its pattern from the image's start: the image holds data now.
ceph_rbd "$cdir" export --no-progress rbd/img0 "$CI_LOG_DIR/img0.raw" >/dev/null || fail "rbd export"
[ "$(head -c 1048576 "$CI_LOG_DIR/img0.raw" | tr -d '\0' | wc -c)" -gt 0 ] || fail "rbd export: the image is empty"
ceph_stop "$cdir"
log "PASS"
