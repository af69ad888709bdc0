# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-spdk-rpc.sh: the kernel NVMe/TCP host against a pollux
# configured through SPDK's RPC client (10.0.2.100:4420): SUB, one 64 MiB malloc namespace,
# open to HOST_NQN only; with RBD=1, SUB is Ceph's gateway sequence's (see below).
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
sub=${SUB:?} host=${HOST_NQN:?} hostid=${HOST_ID:?}

if [ -n "${RBD:-}" ]; then
    # Ceph's gateway sequence: namespace 1 an RBD image (64 MiB, 4 KiB blocks) in ANA group
    # 2, optimized here; the host must authenticate (DH-HMAC-CHAP, DHCHAP_KEY).
    step connect-dhchap
    dev=$(host_connect "$sub" 4420 --hostnqn="$host" --hostid="$hostid" --dhchap-secret="${DHCHAP_KEY:?}" \
        --nr-io-queues=2)
    echo "connected: $dev"
    ins=$(nvme id-ns "$dev") || die "id-ns failed"
    echo "$ins" | grep -qE '^nsze +: (0x4000|16384)$' || die "id-ns nsze: not 64 MiB of 4 KiB blocks"
    echo "$ins" | grep -qE '^anagrpid *: *(2|0x2)$' || die "id-ns anagrpid: not 2"
    # The path's ANA state as the kernel's native multipath read it from the ANA log.
    s=$(cat /sys/block/nvme*c*n1/ana_state 2>/dev/null | head -n 1)
    [ "$s" = optimized ] || die "the path's ANA state is ${s:-missing}, not optimized"
    step fio-verify
    fio_verify "$dev" 4k 16M
    step disconnect
    host_disconnect "$sub"
    exit 0
fi

step discover
out=$(timeout 30 nvme discover -t tcp -a "$HOST_ADDR" -s 4420 --hostnqn="$host" --hostid="$hostid") ||
    die "discover failed"
echo "$out"
echo "$out" | grep -q "subnqn: *$sub" || die "discovery does not list $sub"

step connect
dev=$(host_connect "$sub" 4420 --hostnqn="$host" --hostid="$hostid" --nr-io-queues=2)
echo "connected: $dev"
idc=$(nvme id-ctrl "${dev%n*}") || die "id-ctrl failed"
echo "$idc" | grep -qE '^sn +: SPDK00000000000001' || die "id-ctrl serial is not the one nvmf_create_subsystem set"
ins=$(nvme id-ns "$dev") || die "id-ns failed"
echo "$ins" | grep -qE '^nsze +: (0x20000|131072)$' || die "id-ns nsze: not 64 MiB of 512-byte blocks"

step fio-verify
fio_verify "$dev" 4k 16M

step disconnect
host_disconnect "$sub"
