# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-control.sh: the kernel NVMe/TCP host while the host
# side changes pollux at run time through its control socket. Host and guest take turns
# through files in the read-write 9p share: the guest writes "g-<step>", the host answers
# "h-<step>" once it has made the change.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
sub1=${SUB1:?} sub2=${SUB2:?} allowed=${ALLOWED_HOST:?} allowed_id=${ALLOWED_HOSTID:?} p2=${PORT2:?}
S=/mnt/host
touch $S/.rw 2>/dev/null || die "the host share is not mounted read-write (boot.sh --share)"


# wait_ns CTRL NSID: wait up to 30 s until CTRL lists NSID.
wait_ns() {
    n=0
    until nvme list-ns "$1" 2>/dev/null | grep -qE "\]:0x$2\$"; do
        sleep 0.5
        n=$((n + 1))
        [ $n -lt 60 ] || die "namespace $2 never appeared on $1"
    done
}

step connect
dev=$(host_connect "$sub1" 4420 --nr-io-queues=1)
ctrl=${dev%n*}
nvme list-ns "$ctrl"

step add-namespace-during-fio
fio --name=bg --filename="$dev" --rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=8 \
    --size=16M --verify=crc32c --do_verify=1 --verify_fatal=1 --eta=never --output=/tmp/fio.out &
fio_pid=$!
turn add-ns
wait_ns "$ctrl" 2
echo "namespace 2 appeared without reconnecting"
wait $fio_pid || { cat /tmp/fio.out; die "fio verify on namespace 1 failed while namespace 2 was added"; }
grep -q 'err= 0' /tmp/fio.out || { cat /tmp/fio.out; die "fio reported an error"; }
i=0
until [ -b "${ctrl}n2" ]; do sleep 0.5; i=$((i + 1)); [ $i -lt 40 ] || die "no block device ${ctrl}n2"; done
dd if=/dev/urandom of=/tmp/p bs=4096 count=16 2>/dev/null
dd if=/tmp/p of="${ctrl}n2" bs=4096 oflag=direct 2>/dev/null || die "write to the new namespace"
cmp -n 65536 /tmp/p "${ctrl}n2" || die "the new namespace does not read back"

step add-listener
turn add-listener
out=$(host_discover 4420)
echo "$out"
echo "$out" | grep -qE "trsvcid: *$p2\$" || die "the discovery log does not list the new listener $p2"
out=$(host_discover 4421)   # served by the new listener itself
echo "$out" | grep -q "subnqn: *$sub1" || die "discovery through the new listener"

step remove-host
dev2=$(host_connect "$sub2" 4420 --hostnqn="$allowed" --hostid="$allowed_id" --nr-io-queues=1 \
       --ctrl-loss-tmo=3 --reconnect-delay=1)
dd if=/tmp/p of="$dev2" bs=4096 oflag=direct 2>/dev/null || die "write to $sub2"
turn remove-host
n=0
while nvme_bdev "$sub2" >/dev/null; do
    sleep 0.5; n=$((n + 1)); [ $n -lt 60 ] || die "the removed host's controller is still there"
done
echo "the removed host's controller is gone"
if timeout 60 nvme connect -t tcp -n "$sub2" -a "$HOST_ADDR" -s 4420 --hostnqn="$allowed" --hostid="$allowed_id" 2>/tmp/err; then
    die "a removed host could connect again"
fi
cat /tmp/err

step reload
turn reload
wait_ns "$ctrl" 3
echo "namespace 3 from the reloaded conf file appeared"

step discover-before-restart
host_discover 8009 | grep -E 'subnqn|trsvcid|traddr' | sort > $S/discover-before
host_disconnect "$sub1"
turn restart
host_discover 8009 | grep -E 'subnqn|trsvcid|traddr' | sort > $S/discover-after
cmp $S/discover-before $S/discover-after || die "discovery differs after restarting from the saved conf"
echo "same discovery log after ctl save and a restart from the saved file"
step end
