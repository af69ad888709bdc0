# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-multipath.sh: native NVMe multipath of the kernel host
# over two listeners of one pollux, while the host side changes their ANA states. Host and
# guest take turns through files in the read-write 9p share (g-<step>, h-<step>).
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
sub=${SUB:?}
S=/mnt/host
touch $S/.rw 2>/dev/null || die "the host share is not mounted read-write (boot.sh --share)"
[ "$(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null)" = Y ] ||
    die "the guest kernel's nvme_core has no native multipath"

# relay STATE: the host sets group 1 of the first listener to STATE now.
relay() {
    r=$(echo "$1" | nc "$HOST_ADDR" 9000) || die "relay $1 failed"
    [ "$r" = set ] || die "relay $1 answered '$r'"
}
# wait_state PATH STATE: until the host shows PATH in STATE (30 s).
wait_state() {
    n=0
    until [ "$(cat "/sys/block/$1/ana_state" 2>/dev/null)" = "$2" ]; do
        sleep 0.02
        n=$((n + 1))
        [ $n -lt 1500 ] || die "$1 never became $2 (is $(cat "/sys/block/$1/ana_state" 2>/dev/null))"
    done
    echo "$1: $2"
}


step connect-both
dev=$(host_connect "$sub" 4420 --nr-io-queues=2)
timeout 60 nvme connect -t tcp -n "$sub" -a "$HOST_ADDR" -s 4421 --nr-io-queues=2 >&2 ||
    die "nvme connect to the second listener failed"
n=0
until p2=$(path 4421); do sleep 0.5; n=$((n + 1)); [ $n -lt 40 ] || die "no second path"; done
p1=$(path 4420) || die "no first path"
nvme list-subsys "$dev" | tee /tmp/subsys
[ "$(grep -c ' live' /tmp/subsys)" -ge 2 ] || die "nvme list-subsys does not show two live paths"
grep -q 'live optimized' /tmp/subsys || die "no optimized path in nvme list-subsys"
grep -q 'live non-optimized' /tmp/subsys || die "no non-optimized path in nvme list-subsys"
wait_state "$p1" optimized
wait_state "$p2" non-optimized
[ "$(nvme_bdev "$sub")" = "$dev" ] || die "the two paths are not one namespace"

step fio-while-failing-over
fio --name=mp --filename="$dev" --rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=8 \
    --size=32M --time_based --runtime=40 --verify=crc32c --verify_backlog=64 --verify_fatal=1 \
    --eta=never --output=/tmp/fio.out &
fio_pid=$!
sleep 5
a1=$(ios "$p1") a2=$(ios "$p2")
echo "before: $p1 $a1 I/Os, $p2 $a2 I/Os"
t0=$(ms)
relay inaccessible
wait_state "$p1" inaccessible
t1=$(ms)
until [ "$(ios "$p2")" -gt "$a2" ]; do
    [ $(($(ms) - t0)) -lt 30000 ] || die "no I/O through $p2 within 30 s"
    sleep 0.02
done
t2=$(ms)
echo "ANA: the host showed the optimized path inaccessible $((t1 - t0)) ms after set-ana-state" | tee -a $S/ana-change.txt
echo "ANA: first I/O through the other path $((t2 - t0)) ms after it" | tee -a $S/ana-change.txt
turn inaccessible
sleep 5
b1=$(ios "$p1") b2=$(ios "$p2")
echo "inaccessible: $p1 $b1 I/Os, $p2 $b2 I/Os"
[ "$b2" -gt "$a2" ] || die "no I/O moved to $p2 while $p1 was inaccessible"
sleep 3
c1=$(ios "$p1") c2=$(ios "$p2")
[ "$c1" -eq "$b1" ] || echo "note: $((c1 - b1)) I/Os counted on the inaccessible path (retried elsewhere)"
[ "$c2" -gt "$b2" ] || die "I/O stopped on $p2"
t0=$(ms)
relay optimized
wait_state "$p1" optimized
echo "ANA: the host showed it optimized again $(($(ms) - t0)) ms after set-ana-state" | tee -a $S/ana-change.txt
sleep 5
d1=$(ios "$p1")
echo "optimized again: $p1 $d1 I/Os"
[ "$d1" -gt "$c1" ] || die "I/O did not come back to $p1"
wait $fio_pid || { cat /tmp/fio.out; die "fio verify failed across the ANA changes"; }
grep -q 'err= 0' /tmp/fio.out || { cat /tmp/fio.out; die "fio reported an error"; }
grep -E 'write:|verify' /tmp/fio.out | head -5
disconnect "$sub"
step end
