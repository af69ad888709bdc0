# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-file.sh: the kernel NVMe/TCP host against pollux on the
# host serving a file (O_DIRECT, io_uring). Part 1: fio verify at 4k and 1m, discard reads
# zeroes, flush. Part 2, the crash test: while the host kills pollux with SIGKILL at random
# moments and restarts it, write region after region (region g = 64 blocks tagged with g),
# flush after each, and record the last generation whose flush completed. At the end every
# region up to that generation must read back intact. The host says when to stop through
# the 9p share (file "stop"); we report progress there ("connected", "acked").
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
nqn=${NQN:?}
touch /mnt/host/.rw 2>/dev/null || die "the host share is not mounted read-write (boot.sh --share)"

step connect
dev=$(host_connect "$nqn" 4420 --nr-io-queues=2 --reconnect-delay=1 --ctrl-loss-tmo=300)
ctrl=${dev%n*}
nvme id-ctrl "$ctrl" | grep -E '^vwc ' || die "id-ctrl"
nvme id-ctrl "$ctrl" | grep -qE '^vwc +: 0x5' || die "a file namespace must report a volatile write cache"

step fio-verify
fio_verify "$dev" 4k 32M
fio_verify "$dev" 1m 32M

step discard
blkdiscard -o 0 -l $((16 * 1024 * 1024)) "$dev" || die "blkdiscard"
cmp -n $((16 * 1024 * 1024)) "$dev" /dev/zero || die "discarded blocks do not read as zeroes"
nvme flush "$ctrl" -n 1 || die "nvme flush"

step crash-test
blocks=64  # 4 KiB blocks per region
echo connected > /mnt/host/connected
g=0
while [ ! -e /mnt/host/stop ]; do
    g=$((g + 1))
    i=0
    : > /tmp/region
    while [ $i -lt $blocks ]; do
        printf 'pollux crash test gen=%08d blk=%04d\n' "$g" "$i" | dd bs=4096 conv=sync 2>/dev/null >> /tmp/region
        i=$((i + 1))
    done
    # conv=fsync: fsync on the block device sends an NVMe Flush (VWC is set).
    dd if=/tmp/region of="$dev" bs=4096 seek=$((8192 + g * blocks)) oflag=direct conv=fsync 2>/dev/null ||
        die "write of generation $g failed"
    echo "$g" > /mnt/host/acked
    [ $g -lt 900 ] || break
done
acked=$(cat /mnt/host/acked)
echo "crash test: $acked generations written and flushed while pollux was killed"

step crash-verify
g=1
bad=0
while [ $g -le "$acked" ]; do
    want=$(printf 'gen=%08d' "$g")
    got=$(dd if="$dev" bs=4096 skip=$((8192 + g * blocks)) count=$blocks iflag=direct 2>/dev/null |
          strings | grep -c "pollux crash test $want")
    if [ "$got" != "$blocks" ]; then
        echo "generation $g: only $got of $blocks blocks intact"
        bad=$((bad + 1))
    fi
    g=$((g + 1))
done
[ $bad = 0 ] || die "$bad acknowledged and flushed generations lost"
echo "all $acked flushed generations intact"
host_disconnect "$nqn"
step end
