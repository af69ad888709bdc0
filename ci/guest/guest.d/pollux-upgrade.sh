# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-upgrade.sh: fio verify on a RAM namespace (4 I/O
# queues) and on a file namespace over two paths while pollux is upgraded 10 times;
# 10.0.2.100:9000 is a relay that upgrades pollux and answers "upgraded PID".
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
ram=${RAM:?} file=${FILE:?}
S=/mnt/host
touch $S/.rw 2>/dev/null || die "the host share is not mounted read-write (boot.sh --share)"

upgrade() {
    r=$(echo upgrade | nc "$HOST_ADDR" 9000) || die "relay: upgrade failed"
    case $r in
        upgraded\ [0-9]*) echo "$r" ;;
        *) die "upgrade refused: $r" ;;
    esac
}

step connect
rdev=$(host_connect "$ram" 4420 --nr-io-queues=4)
fdev=$(host_connect "$file" 4420 --nr-io-queues=2)
timeout 60 nvme connect -t tcp -n "$file" -a "$HOST_ADDR" -s 4421 --nr-io-queues=2 >&2 ||
    die "nvme connect to the second path failed"
n=0
until path 4421 >/dev/null; do sleep 0.5; n=$((n + 1)); [ $n -lt 40 ] || die "no second path"; done
nvme list-subsys "$fdev" | tee /tmp/subsys
[ "$(grep -c ' live' /tmp/subsys)" -ge 2 ] || die "nvme list-subsys does not show two live paths"
rc=$(ctrl_of "$rdev")
rc=${rc##*/}
dmesg | grep "nvme $rc: creating" || true
dmesg | grep -q "nvme $rc: creating 4 I/O queues" || die "the RAM controller $rc does not have 4 I/O queues"
# Its path device (the multipath head of a 6.1 kernel counts no I/O).
rp=
for p in /sys/block/nvme*c"${rc#nvme}"n1; do [ -e "$p" ] && rp=${p##*/}; done
[ -n "$rp" ] || die "no path device of $rc"
kmark upgrades

step fio-through-upgrades
for d in "$rdev" "$fdev"; do
    fio --name=up --filename="$d" --rw=randwrite --bs=4k --direct=1 --ioengine=libaio --iodepth=16 \
        --size=32M --time_based --runtime=75 --verify=crc32c --verify_backlog=64 --verify_fatal=1 \
        --numjobs=1 --eta=never --output="/tmp/fio.${d##*/}" &
    pids="${pids:-} $!"
done
sleep 5
i=0
while [ $i -lt 10 ]; do
    i=$((i + 1))
    b=$(ios "$rp")
    echo "upgrade $i: $(upgrade)"
    # I/O goes on through the new process before the next.
    n=0
    until [ "$(ios "$rp")" -gt "$b" ]; do
        sleep 0.1; n=$((n + 1)); [ $n -lt 300 ] || die "no I/O completed within 30 s of upgrade $i"
    done
    sleep 2
done
for p in $pids; do wait "$p" || fail=1; done
for f in /tmp/fio.nvme*; do
    grep -q 'err= 0' "$f" || { cat "$f"; die "fio reported an error ($f)"; }
    grep -E 'write:|clat \(' "$f" | head -2
done
[ -z "${fail:-}" ] || die "fio verify failed across the upgrades"

step kernel-log
ksince upgrades > /tmp/klog
cat /tmp/klog
if grep -iE 'reconnect|resetting|I/O error|timeout|Buffer I/O|blk_update_request' /tmp/klog; then
    die "the host noticed the upgrades"
fi
nvme list-subsys "$fdev" | tee /tmp/subsys
[ "$(grep -c ' live' /tmp/subsys)" -ge 2 ] || die "a path is no longer live"

step verify-after
fio_verify "$rdev" 4k 16M
disconnect "$file"
disconnect "$ram"
step end
