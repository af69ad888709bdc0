# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-failover.sh: the kernel host's native multipath across
# two pollux targets in front of one file, through a SIGKILL of the target with the
# optimized path and its restart. 10.0.2.100:9000 is a relay that kills ("kill") or
# restarts ("restart") target A at once and answers.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
sub=${SUB:?} only_b=${ONLY_B:?}
S=/mnt/host
touch $S/.rw 2>/dev/null || die "the host share is not mounted read-write (boot.sh --share)"
out=$S/failover.txt

relay() {
    r=$(echo "$1" | nc "$HOST_ADDR" 9000) || die "relay $1 failed"
    [ "$r" = "$2" ] || die "relay $1 answered '$r'"
}

step referral
d=$(timeout 30 nvme discover -t tcp -a "$HOST_ADDR" -s 4420) || die "nvme discover of target A"
echo "$d"
echo "$d" | grep -q "subtype: .*referral" || die "A's discovery log has no referral entry"
echo "$d" | grep -A8 "subtype: .*referral" | grep -q "trsvcid: *4421" || die "the referral does not name B (4421)"
d=$(timeout 30 nvme discover -t tcp -a "$HOST_ADDR" -s 4421) || die "nvme discover of target B (the referral)"
echo "$d" | grep -q "subnqn: *$only_b" || die "B's discovery log lacks $only_b"

step connect-both
dev=$(host_connect "$sub" 4420 --nr-io-queues=2 --reconnect-delay=1 --ctrl-loss-tmo=120)
timeout 60 nvme connect -t tcp -n "$sub" -a "$HOST_ADDR" -s 4421 --nr-io-queues=2 --reconnect-delay=1 \
    --ctrl-loss-tmo=120 >&2 || die "nvme connect to target B failed"
n=0
until pb=$(path 4421); do sleep 0.5; n=$((n + 1)); [ $n -lt 40 ] || die "no path through B"; done
pa=$(path 4420) || die "no path through A"
ca=$(ctrl_on 4420)
nvme list-subsys "$dev" | tee /tmp/subsys
[ "$(grep -c ' live' /tmp/subsys)" -ge 2 ] || die "nvme list-subsys does not show two live paths"
echo "cntlids: A $(cat /sys/class/nvme/"$ca"/cntlid), B $(cat /sys/class/nvme/"$(ctrl_on 4421)"/cntlid)"
[ "$(nvme_bdev "$sub")" = "$dev" ] || die "the two targets are not one namespace to the host"

step fio-through-a-kill
fio --name=fo --filename="$dev" --rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=8 \
    --size=32M --time_based --runtime=60 --verify=crc32c --verify_backlog=64 --verify_fatal=1 \
    --eta=never --output=/tmp/fio.out &
fio_pid=$!
sleep 8
b0=$(ios "$pb")
echo "before the kill: $pa $(ios "$pa") I/Os, $pb $b0 I/Os"
t0=$(ms)
relay kill killed
until [ "$(ios "$pb")" -gt "$b0" ]; do
    [ $(($(ms) - t0)) -lt 60000 ] || die "no I/O through B within 60 s of the kill"
    sleep 0.02
done
t1=$(ms)
echo "FAILOVER: first I/O completed through B $((t1 - t0)) ms after SIGKILL of A" | tee -a "$out"
sleep 5
[ "$(ios "$pb")" -gt "$b0" ] || die "I/O stopped"
step restart-a
t2=$(ms)
relay restart restarted
n=0
until [ "$(cat /sys/class/nvme/"$ca"/state 2>/dev/null)" = live ]; do
    sleep 0.1; n=$((n + 1)); [ $n -lt 600 ] || die "the host never reconnected to A ($(cat /sys/class/nvme/"$ca"/state))"
done
t3=$(ms)
echo "FAILOVER: the host reconnected A's path by itself $((t3 - t2)) ms after A restarted" | tee -a "$out"
a1=$(ios "$pa")
sleep 5
[ "$(ios "$pa")" -gt "$a1" ] || die "I/O did not come back to A's (optimized) path"
wait $fio_pid || { cat /tmp/fio.out; die "fio verify failed across the failover"; }
grep -q 'err= 0' /tmp/fio.out || { cat /tmp/fio.out; die "fio reported an error"; }
lat=$(grep -E '^ +clat \((u|m)sec\)' /tmp/fio.out | head -1)
echo "FAILOVER: fio write completion latency across it: $lat" | tee -a "$out"
grep -E 'write:' /tmp/fio.out | head -2 | tee -a "$out"
disconnect "$sub"
step end
