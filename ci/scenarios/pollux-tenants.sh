#!/bin/bash
# Scenario pollux-tenants: host masking per namespace seen by the guest's kernel NVMe/TCP
# host. One guest connects to one subsystem as two hosts (two host NQNs, two controllers
# in one NVMe subsystem); namespace 1 is attached to host A only (its `hosts`), namespace 2
# to both. Host B's controller has no namespace 1 (not in its active list, no path or block
# device of its own, Identify Namespace zero-filled) until `pollux ctl ns-add-host` attaches
# it at run time: B's controller rescans (Namespace Attribute Changed) and gets it, serving
# A's data; `ns-remove-host` detaches it again and it vanishes from B only. Host and guest
# take turns through the read-write share. Guest side: ci/guest/guest.d/pollux-tenants.sh.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "$0")/../lib.sh"
need_pollux

sub=nqn.2026-11.io.pollux.ci:tenants
id_a=5a0e5c1a-2f5b-4d8e-9b44-3a2f1c0d9ea1
id_b=5a0e5c1a-2f5b-4d8e-9b44-3a2f1c0d9eb2
host_a=nqn.2014-08.org.nvmexpress:uuid:$id_a
host_b=nqn.2014-08.org.nvmexpress:uuid:$id_b
p_io=$(free_port)
share=$CI_LOG_DIR/share
mkdir -p "$share"
sock=$CI_LOG_DIR/pollux.sock
conf=$CI_LOG_DIR/pollux.toml
cat > "$conf" <<TOML
[reactors]
cores = [0, 1]
mode = "interrupt"

[control]
socket = "$sock"

[[listener]]
address = "127.0.0.1:$p_io"

[[subsystem]]
nqn = "$sub"
hosts = ["$host_a", "$host_b"]

# Host A's only.
[[subsystem.namespace]]
nsid = 1
hosts = ["$host_a"]
backend = { ram = { size = "64MiB" } }

# Both hosts'.
[[subsystem.namespace]]
nsid = 2
backend = { ram = { size = "16MiB" } }
TOML
ctl() { "$POLLUX_BIN" ctl --socket "$sock" "$@"; }
# ns1_hosts: namespace 1's hosts as `ctl subsystems` reports them, one per line.
ns1_hosts() {
    ctl --json subsystems | python3 -c '
import json, sys
s = [x for x in json.load(sys.stdin) if x["nqn"] == sys.argv[1]][0]
n = [x for x in s["namespaces"] if x["nsid"] == 1][0]
print("\n".join(n.get("hosts") or ["<every host>"]))' "$sub"
}

"$POLLUX_BIN" --check "$conf" || fail "pollux --check rejects the scenario conf"
start_pollux "$conf" "$p_io"
run_guest pollux-tenants.sh --timeout 600 --share "$share" --guestfwd "4420=$p_io" \
    --env "SUB=$sub" --env "HOST_A=$host_a" --env "HOSTID_A=$id_a" \
    --env "HOST_B=$host_b" --env "HOSTID_B=$id_b" &
guest=$!
ci_track "$guest"

wait_guest attach
[ "$(ns1_hosts)" = "$host_a" ] || fail "namespace 1 is not host A's only: $(ns1_hosts)"
# Bad input is refused by name and changes nothing.
if out=$(ctl ns-add-host --nqn "$sub" --nsid 1 --host not-an-nqn 2>&1); then
    fail "ns-add-host took a host that is not an NQN"
fi
log "refused as expected: $out"
if out=$(ctl ns-add-host --nqn "$sub" --nsid 1 --host "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000000" 2>&1); then
    fail "ns-add-host took a host the subsystem does not admit"
fi
log "refused as expected: $out"
[ "$(ns1_hosts)" = "$host_a" ] || fail "a refused ns-add-host changed namespace 1's hosts"
ctl ns-add-host --nqn "$sub" --nsid 1 --host "$host_b" || fail "ctl ns-add-host"
answer attach

wait_guest detach
ctl ns-remove-host --nqn "$sub" --nsid 1 --host "$host_b" || fail "ctl ns-remove-host"
[ "$(ns1_hosts)" = "$host_a" ] || fail "namespace 1's hosts after ns-remove-host: $(ns1_hosts)"
answer detach

wait "$guest" || fail "pollux-tenants guest failed (pollux log: $POLLUX_LOG)"
stop_pollux || fail "pollux did not stop cleanly on SIGTERM"
log "PASS"
