# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-gateway-resv.sh: two kernel hosts (distinct host NQN and
# host ID), host 1 connected to gateway A (4420), host 2 to gateway B (4421), one RBD image
# behind both; reservations through nvme-cli. Booted with nvme_core.multipath=N: each
# controller is its own /dev/nvmeXn1. 10.0.2.100:9000 is a relay that kills A with SIGKILL
# ("kill") or starts it again ("restart") and answers.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
# shellcheck source=ci/guest/guest.d/resv-lib.sh
. /guest/resv-lib.sh
sub=${SUB:?}
id1=6a7e0001-1111-4111-8111-000000000001 id2=6a7e0002-2222-4222-8222-000000000002
h1=nqn.2014-08.org.nvmexpress:uuid:$id1 h2=nqn.2014-08.org.nvmexpress:uuid:$id2
[ "$(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null)" = N ] ||
    die "nvme_core.multipath=N did not take: the hosts' controllers would share one block device"

# dev_of HOSTNQN PORT: the block device of this guest's controller connected as HOSTNQN to PORT.
dev_of() {
    for b in /sys/block/nvme*n1; do
        [ "$(cat "$b/device/hostnqn" 2>/dev/null)" = "$1" ] &&
            grep -q "trsvcid=$2" "$b/device/address" 2>/dev/null && { echo "/dev/${b##*/}"; return 0; }
    done
    return 1
}
# attach HOSTNQN HOSTID PORT: connect as that host to the gateway on PORT; prints the device.
attach() {
    fabrics_add "transport=tcp,traddr=$HOST_ADDR,trsvcid=$3,nqn=$sub,hostnqn=$1,hostid=$2,nr_io_queues=1,reconnect_delay=1,ctrl_loss_tmo=300" >/dev/null ||
        die "connect as $1 to $3 failed"
    n=0
    until d=$(dev_of "$1" "$3") && [ -b "$d" ]; do
        sleep 0.2; n=$((n + 1)); [ $n -lt 100 ] || die "no block device for $1 on $3"
    done
    echo "$d"
}
# hexid UUID: a host identifier as older nvme-cli prints it (each byte in %x, unpadded).
hexid() { for b in $(echo "$1" | tr -d - | sed 's/../& /g'); do printf '%x' "0x$b"; done; }
# holder UUID: the last report's only registrant is that host and holds the reservation.
holder() {
    expect_field regctl 1
    expect_field rcsts 1
    got=$(sed -n 's/^[[:space:]]*hostid[[:space:]]*:[[:space:]]*\([0-9a-f]*\).*/\1/p' /tmp/report | head -1)
    [ "$got" = "$(echo "$1" | tr -d -)" ] || [ "$got" = "$(hexid "$1")" ] ||
        die "the holder's host identifier is $got, not $1"
}
relay() {
    r=$(echo "$1" | nc "$HOST_ADDR" 9000) || die "relay $1 failed"
    [ "$r" = "$2" ] || die "relay $1 answered '$r'"
}

step connect
a1=$(attach "$h1" "$id1" 4420)
b2=$(attach "$h2" "$id2" 4421)
echo "host 1 through A: $a1 ($(ctrl_of "$a1")), host 2 through B: $b2 ($(ctrl_of "$b2"))"
[ "$(nvme id-ns "$a1" -n 1 | sed -n 's/^nguid *: *//p')" = "$(nvme id-ns "$b2" -n 1 | sed -n 's/^nguid *: *//p')" ] ||
    die "the two gateways present different NGUIDs for one image"

step register-through-a
resv resv-register "$a1" -n 1 --nrkey=0x1a --rrega=0
report "$b2"
expect_field regctl 1
expect_field rtype 0

step write-exclusive-through-a
resv resv-acquire "$a1" -n 1 --crkey=0x1a --rtype=1 --racqa=0
can_write "$a1"
cannot_write "$b2"
can_read "$b2"
report "$b2"
expect_field rtype 1
holder "$id1"

step preempt-through-b
resv resv-register "$b2" -n 1 --nrkey=0x2b --rrega=0
resv resv-acquire "$b2" -n 1 --crkey=0x2b --prkey=0x1a --rtype=1 --racqa=1
cannot_write "$a1"
can_write "$b2"
report "$a1"
expect_field rtype 1
holder "$id2"
gen=$(field gen)

step kill-and-restart-a
ca=$(ctrl_of "$a1")
relay kill killed
relay restart restarted
n=0
until [ "$(cat /sys/class/nvme/"$ca"/state)" = live ]; do
    sleep 0.5; n=$((n + 1)); [ $n -lt 120 ] || die "host 1 did not reconnect to A ($(cat /sys/class/nvme/"$ca"/state))"
done
echo "host 1 reconnected to A after $((n / 2)) s"
report "$a1"
expect_field gen "$gen"
expect_field rtype 1
holder "$id2"
cannot_write "$a1"
can_write "$b2"

step release-and-unregister-through-either
a2=$(attach "$h2" "$id2" 4420)
echo "host 2 through A: $a2"
resv resv-release "$a2" -n 1 --crkey=0x2b --rtype=1 --rrela=0
can_write "$a1"
resv resv-register "$b2" -n 1 --crkey=0x2b --rrega=1
resv resv-register "$a1" -n 1 --nrkey=0x1c --rrega=0
report "$b2"
expect_field regctl 1
expect_field rtype 0
resv resv-register "$a1" -n 1 --crkey=0x1c --rrega=1
report "$b2"
expect_field regctl 0
report "$a2"
expect_field regctl 0

step disconnect
timeout 30 nvme disconnect -n "$sub" >&2 || die "disconnect failed"
