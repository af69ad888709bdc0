#!/bin/bash
# Scenario pollux-group: a gateway group configured in the cluster, with the Linux 6.12
# host as the client. A one-node Ceph cluster (ci/ceph.sh) holds image img0; three pollux
# gateways, A, B and C, run confs that name only themselves (the group, the cluster, the
# group key: no listener, no subsystem). Everything else is one `pollux ctl` command on A:
# each gateway's listener, the subsystem, its rbd namespace, the host with its DH-HMAC-CHAP
# key (from a key file on A's side), a QoS limit; B and C serve them as A answers (every
# gateway acknowledged). The guest (ci/guest/guest.d/pollux-group.sh) connects through C
# with the key given to A, runs fio verify, disconnects. Then the host is removed through B
# (every gateway's `ctl group` shows the same version and document), no object the
# gateways wrote holds a key in clear (`rados get`), and the data is in Ceph (`rbd export`
# matches what the guest read).
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
# shellcheck source=ci/ceph.sh
. "$CI_REPO/ci/ceph.sh"
need_pollux
ceph_ensure_debs
ensure_debs nvme-cli busybox-static

sub=nqn.2026-12.io.pollux.ci:group
host=nqn.2014-08.org.nvmexpress:uuid:7a3e5c1d-2b4f-4e6a-8c9d-0e1f2a3b4c53
pa=$(free_port) pb=$(free_port) pc=$(free_port)
share=$CI_LOG_DIR/share
rm -rf "$share"
mkdir -p "$share"
cdir=$CI_LOG_DIR/ceph
CEPH_IMG_SIZE=64M ceph_start "$cdir"
keys=$CI_LOG_DIR/keys
rm -rf "$keys"
mkdir -p "$keys"
chmod 700 "$keys"
(umask 077 && head -c 32 /dev/urandom > "$keys/group.key")
(umask 077 && nvme gen-dhchap-key --hmac=1 --nqn="$host" > "$keys/host.key") || fail "nvme gen-dhchap-key failed"
key=$(cat "$keys/host.key")

ctl() {
    local gw=$1
    shift
    "$POLLUX_BIN" ctl --socket "$CI_LOG_DIR/$gw.sock" "$@"
}

# gateway NAME: start gateway NAME, whose conf names only itself, and wait for its control
# socket.
pids=()
gateway() {
    cat > "$CI_LOG_DIR/$1.toml" <<TOML
[reactors]
cores = [0]

[control]
socket = "$CI_LOG_DIR/$1.sock"

[gateway]
group = "ci"
name = "$1"
pool = "rbd"
ceph_conf = "$CEPH_CONF"
key_file = "$keys/group.key"
TOML
    "$POLLUX_BIN" --check "$CI_LOG_DIR/$1.toml" >/dev/null || fail "conf $1 is invalid"
    NO_COLOR=1 setsid "$POLLUX_BIN" --config "$CI_LOG_DIR/$1.toml" >>"$CI_LOG_DIR/pollux-$1.log" 2>&1 </dev/null &
    pids+=($!)
    ci_track $!
    local n=0
    until ctl "$1" version >/dev/null 2>&1; do
        sleep 0.1; n=$((n + 1)); [ $n -lt 300 ] || fail "gateway $1 did not open its control socket within 30 s"
    done
}
stop_gateways() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap 'stop_gateways; ci_cleanup' EXIT
gateway a
gateway b
gateway c
# Each has its slot in the group's configuration.
for _ in $(seq 100); do
    [ "$(ctl a --json group | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["gateways"]))')" = 3 ] && break
    sleep 0.1
done

# Every later change is one command on A.
ctl a add-listener --address "127.0.0.1:$pa" >/dev/null || fail "add-listener a failed"
ctl a add-listener --address "127.0.0.1:$pb" --gateway b >/dev/null || fail "add-listener b failed"
ctl a add-listener --address "127.0.0.1:$pc" --gateway c >/dev/null || fail "add-listener c failed"
ctl a call add_subsystem "{\"nqn\": \"$sub\", \"hosts\": []}" >/dev/null || fail "add-subsystem failed"
ctl a add-namespace --nqn "$sub" --nsid 1 --rbd rbd/img0 >/dev/null || fail "add-namespace failed"
out=$(ctl a --json add-host --nqn "$sub" --host "$host" --dhchap-key-file "$keys/host.key") ||
    fail "add-host failed: $out"
python3 -c 'import json, sys; g = json.load(sys.stdin)["group"]; sys.exit(0 if g["acknowledged"] == 3 else 1)' <<<"$out" ||
    fail "not every gateway acknowledged the change: $out"
ctl a set-qos --nqn "$sub" --nsid 1 --iops 100000 >/dev/null || fail "set-qos failed"
for gw in b c; do
    ctl "$gw" subsystems | grep -q "namespace 1 rbd rbd/img0" || fail "gateway $gw does not serve the namespace"
done
ctl c group | tee "$CI_LOG_DIR/group-c.txt"

run_guest pollux-group.sh --kernel 6.12 --timeout 300 --share "$share" --guestfwd "4420=$pc" \
    --env "SUB=$sub" --env "HOSTNQN=$host" --env "KEY=$key" ||
    { ceph_ops "$cdir"; fail "pollux-group guest failed (console $CI_LOG_DIR/guest-pollux-group.log)"; }

# Removed through B: gone from every gateway, one document everywhere.
ctl b remove-host --nqn "$sub" --host "$host" >/dev/null || fail "remove-host through B failed"
docs=()
for gw in a b c; do
    docs+=("$(ctl "$gw" --json group | python3 -c '
import json, sys
g = json.load(sys.stdin)
assert g["running"] == g["version"], g
print(g["version"], json.dumps(g["conf"]))')")
done
if [ "${docs[0]}" != "${docs[1]}" ] || [ "${docs[1]}" != "${docs[2]}" ]; then
    fail "the gateways differ: ${docs[*]}"
fi
grep -q "$host" <<<"${docs[0]}" && fail "the host is still in the group's configuration"

# No key in clear in any object of the pool.
b64=${key#DHHC-1:0?:}
for o in $(rados -c "$CEPH_CONF" -p rbd ls); do
    rados -c "$CEPH_CONF" -p rbd get "$o" "$CI_LOG_DIR/obj" || fail "rados get $o failed"
    if grep -qF -e "DHHC-1" -e "${b64:0:24}" "$CI_LOG_DIR/obj"; then fail "object $o holds a key in clear"; fi
done
rm -f "$CI_LOG_DIR/obj"

# The data is in Ceph: what the guest read back is what `rbd export` has.
want=$(cat "$share/md5") || fail "the guest wrote no checksum"
ceph_rbd "$cdir" export --no-progress rbd/img0 "$CI_LOG_DIR/img0.raw" || fail "rbd export failed"
got=$(head -c $((16 << 20)) "$CI_LOG_DIR/img0.raw" | md5sum | cut -d' ' -f1)
rm -f "$CI_LOG_DIR/img0.raw"
[ "$got" = "$want" ] || fail "rbd export of img0 ($got) differs from what the guest read ($want)"
for f in "$CI_LOG_DIR"/pollux-?.log; do
    if grep -qF -e "${b64:0:24}" "$f"; then fail "$f holds the key"; fi
    if grep -q "panicked" "$f"; then fail "$f: a panic"; fi
done
log "PASS"
