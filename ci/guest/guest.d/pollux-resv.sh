# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-resv.sh: two kernel hosts (distinct host NQN and host
# ID) on one pollux namespace, reservations through nvme-cli, a SIGKILL and restart of pollux
# in the middle. Booted with nvme_core.multipath=N: each controller is its own /dev/nvmeXn1.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
# shellcheck source=ci/guest/guest.d/resv-lib.sh
. /guest/resv-lib.sh
sub=${SUB:?}
ida=5e7a0001-1111-4111-8111-00000000000a idb=5e7a0002-2222-4222-8222-00000000000b
ha=nqn.2014-08.org.nvmexpress:uuid:$ida hb=nqn.2014-08.org.nvmexpress:uuid:$idb
[ "$(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null)" = N ] ||
    die "nvme_core.multipath=N did not take: the two hosts would share one block device"

# dev_of HOSTNQN: the block device of this guest's controller connected as HOSTNQN.
dev_of() {
    for b in /sys/block/nvme*n1; do
        [ "$(cat "$b/device/hostnqn" 2>/dev/null)" = "$1" ] && { echo "/dev/${b##*/}"; return 0; }
    done
    return 1
}

step connect-two-hosts
# nvme-cli 2.4 (libnvme 1.3) files every controller under one host, so it takes the second
# host's connect to the same subsystem and address for the first ("already connected",
# even with --duplicate-connect): the kernel gets the options straight.
for h in "$ha $ida" "$hb $idb"; do
    # shellcheck disable=SC2086 # two words: NQN and ID
    set -- $h
    c=$(fabrics_add "transport=tcp,traddr=$HOST_ADDR,trsvcid=4420,nqn=$sub,hostnqn=$1,hostid=$2,nr_io_queues=1,reconnect_delay=1,ctrl_loss_tmo=120") ||
        die "connect as $1 failed"
    echo "connected as $1: $c"
done
n=0
until a=$(dev_of "$ha") && b=$(dev_of "$hb") && [ -b "$a" ] && [ -b "$b" ]; do
    sleep 0.2; n=$((n + 1)); [ $n -lt 100 ] || die "no block devices for both hosts"
done
[ "$a" != "$b" ] || die "both hosts got $a"
echo "host A: $a ($(ctrl_of "$a")), host B: $b ($(ctrl_of "$b"))"
nvme id-ns "$a" -n 1 | grep -E '^rescap' || die "id-ns shows no rescap"
nvme id-ns "$a" -n 1 | grep -Eq '^rescap[[:space:]]*:[[:space:]]*0xff' || die "RESCAP is not 0xff (PTPL on a file namespace)"

step register
resv resv-register "$a" -n 1 --nrkey=0xa1 --rrega=0 --cptpl=3
resv resv-register "$b" -n 1 --nrkey=0xb1 --rrega=0
report "$a"
expect_field regctl 2
expect_field rtype 0
expect_field ptpls 1
out=$(nvme resv-report "$a" -n 1 2>&1) && die "a report without the extended structure succeeded: $out"
echo "without EDS: $out"

step write-exclusive
resv resv-acquire "$a" -n 1 --crkey=0xa1 --rtype=1 --racqa=0
report "$b"
expect_field rtype 1
can_write "$a"
cannot_write "$b"
can_read "$b"
out=$(nvme resv-acquire "$b" -n 1 --crkey=0xb1 --rtype=1 --racqa=0 2>&1) && die "B acquired A's reservation: $out"
echo "B's acquire: $out"
resv resv-release "$a" -n 1 --crkey=0xa1 --rtype=1 --rrela=0
can_write "$b"

step exclusive-access
resv resv-acquire "$b" -n 1 --crkey=0xb1 --rtype=2 --racqa=0
cannot_write "$a"
cannot_read "$a"
can_write "$b"
can_read "$b"

step preempt
resv resv-acquire "$a" -n 1 --crkey=0xa1 --prkey=0xb1 --rtype=1 --racqa=1
report "$a"
expect_field rtype 1
expect_field regctl 1
cannot_write "$b"
can_read "$b"
can_write "$a"
out=$(nvme resv-release "$b" -n 1 --crkey=0xb1 --rtype=1 --rrela=0 2>&1) && die "preempted B released: $out"
gen=$(field gen)

step kill-and-restart
ca=$(ctrl_of "$a") cb=$(ctrl_of "$b")
r=$(echo kill | nc "$HOST_ADDR" 9000) || die "relay kill failed"
[ "$r" = restarted ] || die "relay answered '$r'"
n=0
until [ "$(cat /sys/class/nvme/"$ca"/state)" = live ] && [ "$(cat /sys/class/nvme/"$cb"/state)" = live ]; do
    sleep 0.5; n=$((n + 1)); [ $n -lt 120 ] || die "the hosts did not reconnect ($(cat /sys/class/nvme/"$ca"/state), $(cat /sys/class/nvme/"$cb"/state))"
done
echo "both hosts reconnected after $((n / 2)) s"
report "$b"
expect_field gen "$gen"
expect_field rtype 1
expect_field regctl 1
expect_field ptpls 1
cannot_write "$b"
can_write "$a"

step release
resv resv-release "$a" -n 1 --crkey=0xa1 --rtype=1 --rrela=0
can_write "$b"
resv resv-register "$a" -n 1 --crkey=0xa1 --rrega=1
report "$b"
expect_field regctl 0

step disconnect
timeout 30 nvme disconnect -n "$sub" >&2 || die "disconnect failed"
