# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-ram.sh: the kernel NVMe/TCP host against pollux running
# on the host (10.0.2.100 ports 4420 and 8009 via slirp guestfwd). Two subsystems: SUB1 (any
# host, namespaces 1 and 2), SUB2 (only ALLOWED_HOST).
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
sub1=${SUB1:?} sub2=${SUB2:?} allowed=${ALLOWED_HOST:?}
allowed_id=${ALLOWED_HOSTID:?}

step discover-8009
out=$(host_discover 8009)
echo "$out" | grep -q "subnqn: *$sub1" || die "discovery on 8009 does not list $sub1"
echo "$out" | grep -q "subnqn: *$sub2" && die "discovery shows $sub2 to a host it does not allow"

step discover-4420
out=$(host_discover 4420)
echo "$out" | grep -q "subnqn: *$sub1" || die "discovery on 4420 does not list $sub1"

step discover-allowed-host
out=$(timeout 30 nvme discover -t tcp -a "$HOST_ADDR" -s 8009 --hostnqn="$allowed" --hostid="$allowed_id") ||
    die "discover as the allowed host failed"
echo "$out" | grep -q "subnqn: *$sub2" || die "discovery hides $sub2 from its allowed host"

step connect
dev=$(host_connect "$sub1" 4420 --nr-io-queues=2 --queue-size=128)
echo "connected: $dev"
n=$(tcp_established 4420)
[ "$n" = 3 ] || die "expected 3 TCP connections (admin + 2 I/O queues), found $n"
ctrl=${dev%n*}
nvme list

step id-ctrl
idc=$(nvme id-ctrl "$ctrl") || die "id-ctrl failed"
echo "$idc" | grep -E '^(sn|mn|fr|cntlid|mdts|kas|ioccsz|iorcsz|maxcmd|nn|subnqn|sgls|oncs) '
echo "$idc" | grep -q "^subnqn *: $sub1" || die "id-ctrl subnqn"
echo "$idc" | grep -qE '^kas +: (0x)?[1-9a-f]' || die "id-ctrl kas is 0"
echo "$idc" | grep -qE '^mn +: pollux' || die "id-ctrl model"

step id-ns
ins=$(nvme id-ns "$dev") || die "id-ns failed"
echo "$ins" | grep -E '^(nsze|ncap|nuse|nmic|dlfeat|nguid|eui64)|in use'
# 64 MiB of 512-byte blocks
echo "$ins" | grep -qE '^nsze +: (0x20000|131072)$' || die "id-ns nsze"

step list-ns
lns=$(nvme list-ns "$ctrl") || die "list-ns failed"
echo "$lns"
echo "$lns" | grep -qE '\]:0x1$' || die "list-ns lacks nsid 1"
echo "$lns" | grep -qE '\]:0x2$' || die "list-ns lacks nsid 2"

step logs-and-features
nvme smart-log "$ctrl" || die "smart-log failed"
nvme error-log "$ctrl" -e 4 >/dev/null || die "error-log failed"
gf=$(nvme get-feature "$ctrl" -f 7) || die "get-feature -f 7 failed"
echo "$gf"
echo "$gf" | grep -qi 'current value' || die "get-feature -f 7 printed no value"
nvme get-feature "$ctrl" -f 0x0f || die "get-feature kato failed"

step fio-verify
fio_verify "$dev" 4k 16M
fio_verify "$dev" 64k 16M
fio_verify "$dev" 1m 16M

step write-read-64m
head -c $((64 * 1024 * 1024)) /dev/urandom > /tmp/pattern
sum=$(md5sum < /tmp/pattern | cut -d' ' -f1)
dd if=/tmp/pattern of="$dev" bs=1M oflag=direct 2>/dev/null || die "dd write"
got=$(dd if="$dev" bs=1M iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
[ "$got" = "$sum" ] || die "64 MiB read back differs ($got != $sum)"
echo "64 MiB round trip ok: $sum"

step reconnect
host_disconnect "$sub1"
dev=$(host_connect "$sub1" 4420 --nr-io-queues=2)
got=$(dd if="$dev" bs=1M iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
[ "$got" = "$sum" ] || die "data differs after reconnect"
echo "same data after reconnect"

step smart-counters
sl=$(nvme smart-log "${dev%n*}")
echo "$sl" | grep -iE 'data_units|host_(read|write)'
echo "$sl" | grep -iE '^host_write_commands[[:space:]]*:[[:space:]]*[1-9]' >/dev/null || die "SMART host write commands not counted"

step compare-verify
# nvme-cli's compare and verify go through the kernel host's passthrough: Compare (05h)
# with the data, Verify (0Ch) without (NVM Command Set 1.0 §3.2.1, §3.2.4).
head -c 4096 /dev/urandom > /tmp/blk
dd if=/tmp/blk of="$dev" bs=4096 seek=10 oflag=direct 2>/dev/null || die "dd to block 80"
nvme compare "$dev" --start-block=80 --block-count=7 --data-size=4096 --data=/tmp/blk ||
    die "nvme compare of equal data failed"
printf 'X' | dd of=/tmp/blk bs=1 seek=100 conv=notrunc 2>/dev/null
if out=$(nvme compare "$dev" --start-block=80 --block-count=7 --data-size=4096 --data=/tmp/blk 2>&1); then
    die "nvme compare of different data succeeded: $out"
fi
echo "$out" | grep -qi 'compare' || die "the miscompare is not reported as a compare failure: $out"
echo "miscompare reported: $out"
nvme verify "$dev" --start-block=0 --block-count=127 || die "nvme verify failed"

step copy
# Copy (19h, NVM Command Set 1.0 §3.2.2): blocks 1024..1039 as two source ranges of 4 and 12
# blocks (nvme-cli passes --blocks through as each format-0 range's 0-based NLB) to block
# 4096, read back with dd and compared with what was written to the sources.
head -c 8192 /dev/urandom > /tmp/src
dd if=/tmp/src of="$dev" bs=4096 seek=128 oflag=direct 2>/dev/null || die "dd of the copy sources"
nvme copy "$dev" --sdlba=4096 --slbs=1024,1028 --blocks=3,11 || die "nvme copy failed"
dd if="$dev" of=/tmp/dst bs=512 skip=4096 count=16 iflag=direct 2>/dev/null || die "dd of the copy"
cmp /tmp/dst /tmp/src || die "the copied blocks differ from their sources"
echo "copied blocks read back equal"
# A larger one checked by fio: 1 MiB at 4 MiB written with a verify pattern, copied in 4
# ranges of 512 blocks to 8 MiB, and fio verifies the copy (a pattern verify: fio's
# headers would name the source offsets).
fio --name=src --filename="$dev" --rw=write --bs=64k --offset=4M --size=1M --direct=1 \
    --verify=pattern --verify_pattern=0x5ca1ab1e --do_verify=0 --eta=never >/dev/null ||
    die "fio write of the copy sources failed"
nvme copy "$dev" --sdlba=16384 --slbs=8192,8704,9216,9728 --blocks=511,511,511,511 ||
    die "nvme copy of 4 ranges failed"
fio --name=dst --filename="$dev" --rw=write --verify_only=1 --bs=64k --offset=8M --size=1M --direct=1 \
    --verify=pattern --verify_pattern=0x5ca1ab1e --verify_fatal=1 --eta=never >/tmp/fio-copy.out ||
    { cat /tmp/fio-copy.out; die "fio verify of the copy failed"; }
echo "fio verified the 1 MiB copy"

step discard
blkdiscard "$dev" || die "blkdiscard failed"
cmp -n $((64 * 1024 * 1024)) "$dev" /dev/zero || die "blocks read non-zero after discard"
echo "discarded blocks read as zeroes"
host_disconnect "$sub1"

step digests
dev=$(host_connect "$sub1" 4420 --nr-io-queues=2 --hdr-digest --data-digest)
fio_verify "$dev" 4k 8M
fio_verify "$dev" 1m 8M
host_disconnect "$sub1"

step host-not-allowed
if timeout 60 nvme connect -t tcp -n "$sub2" -a "$HOST_ADDR" -s 4420 2>/tmp/err; then
    die "connect to $sub2 succeeded for a host not in its hosts list"
fi
cat /tmp/err

step allowed-host
dev=$(host_connect "$sub2" 4420 --hostnqn="$allowed" --hostid="$allowed_id" --nr-io-queues=1)
fio_verify "$dev" 4k 4M
host_disconnect "$sub2"

step wrong-nqn
if timeout 60 nvme connect -t tcp -n nqn.2026-11.io.pollux:nope -a "$HOST_ADDR" -s 4420 2>/tmp/err; then
    die "connect to an unknown subsystem succeeded"
fi
cat /tmp/err
[ "$(tcp_established 4420)" = 0 ] || die "connections left after the refused connects"

step end
