# shellcheck shell=sh
# Guest side of ci/scenarios/pollux-nvme.sh: pollux itself runs in this guest (the binary
# from the /mnt/host share) and serves QEMU's NVMe controller through its userspace driver
# (vfio-pci behind intel-iommu) to the guest's own kernel NVMe/TCP host on 127.0.0.1.
#   1. pollux setup status / bind: the function moves from nvme to vfio-pci
#   2. (before the bind) a fio 4k randread baseline through the kernel nvme driver
#   3. pollux --check, then pollux started on a conf with an nvme namespace (interrupt mode)
#   4. nvme connect; fio crc32c verify at 4k, 64k, 1m; the same randread jobs via pollux
#   5. persistence: a 4 MiB pattern survives disconnect + SIGTERM + restart + reconnect;
#      then the namespace served again through SPDK's bdev_nvme_attach_controller and
#      nvmf_subsystem_add_ns (over the control socket): the pattern reads back
#   6. idle CPU of pollux in interrupt mode with the host connected; reactor modes (ctl)
#   6b. pollux ctl upgrade ten times under fio verify: the device drained, let go of and
#       brought up by the new process each time; no host error, no reconnect
#   7. disconnect, SIGTERM, pollux setup unbind: the kernel nvme driver has it back
#   8. faults on the in-process fake controller: a failed command, then a controller fatal
#      status (CSTS.CFS) under fio verify: pollux resets it, the host retries, data intact
# fio results go to the share as JSON (fio-<kernel|pollux>-qd<N>.json) when it is
# writable; the console gets "BENCH <path> qd<N> iops=<n>" lines either way.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
P=/mnt/host/pollux
[ -x "$P" ] || die "no $P (boot.sh --share DIR with the pollux binary in it)"
share=/mnt/host
touch "$share/.rw" 2>/dev/null || share=""
nqn=nqn.2026-11.io.pollux.ci:nvme
fnqn=nqn.2026-11.io.pollux.ci:fake
sock=/tmp/pollux.sock
port=4420
# The most pollux may spend idle, in % of one CPU (interrupt mode, host connected).
IDLE_MAX_PCT=${IDLE_MAX_PCT:-5}
ncpu=$(grep -c '^processor' /proc/cpuinfo)
cores="[0]"
[ "$ncpu" -lt 2 ] || cores="[0, 1]"
engine=libaio
fio --enghelp 2>/dev/null | grep -qw libaio || engine=io_uring
pid="" plog="" upgraded=""
# The kernel NVMe/TCP host sends the pages of an O_DIRECT write as they are; when it talks
# to a userspace target on the same kernel (loopback) and such a run of pages crosses from
# one transparent huge page into the next, the target's recv() trips Debian 6.1's hardened
# usercopy check ("usercopy: Kernel memory exposure attempt detected from page alloc",
# kernel BUG at mm/usercopy.c:101, in the receiving thread): a guest kernel bug, not
# pollux's (seen with fio bs=1m; SPDK-based Mayastor hits it too: openebs/mayastor#1693).
# No THP for fio's buffers, then.
thp=/sys/kernel/mm/transparent_hugepage/enabled
[ ! -w "$thp" ] || { echo "THP was: $(cat "$thp"); now never"; echo never > "$thp"; }

# alive PID: the process exists and is not a zombie (busybox sh reaps only in wait).
alive() {
    [ -e "/proc/$1/stat" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]
}

# listening PORT: something listens on 127.0.0.1:PORT (or any address).
listening() {
    hex=$(printf '%04X' "$1")
    awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p' /proc/net/tcp | grep -q .
}

# die MSG (lib.sh's, extended): also show the end of the last pollux log and any kernel
# oops, before the FAIL line (all on stderr: it may run inside $(...)).
die() {
    {
        if [ -n "$plog" ] && [ -f "$plog" ]; then
            echo "---- last 30 lines of $plog ----"
            tail -30 "$plog"
        fi
        if dmesg | grep -qE 'kernel BUG|Oops|general protection|usercopy:'; then
            echo "---- kernel oops ----"
            dmesg | grep -A12 -E 'kernel BUG|Oops|general protection|usercopy:' | head -40
        fi
        echo "FAIL: [$CUR_STEP] $*"
    } >&2
    exit 1
}

# pollux_start CONF: start pollux on CONF in the background (log /tmp/pollux-N.log), wait
# until it listens on $port.
pollux_start() {
    n=1
    while [ -e "/tmp/pollux-$n.log" ]; do n=$((n + 1)); done
    plog=/tmp/pollux-$n.log
    "$P" --config "$1" > "$plog" 2>&1 &
    pid=$!
    i=0
    until listening "$port"; do
        alive "$pid" || { rc=0; wait "$pid" || rc=$?; pid=""; die "pollux exited (rc=$rc) before listening"; }
        [ $i -lt 300 ] || die "pollux not listening on 127.0.0.1:$port after 60 s"
        sleep 0.2
        i=$((i + 1))
    done
    echo "pollux: pid $pid listening on 127.0.0.1:$port (log $plog)"
}

# pollux_stop: SIGTERM, and pollux must exit 0 within 30 s (a process an upgrade started is
# not this shell's child: it must be gone within 30 s).
pollux_stop() {
    kill -TERM "$pid"
    if [ -n "$upgraded" ]; then
        i=0
        while alive "$pid"; do
            [ $i -lt 300 ] || die "upgraded pollux $pid still running 30 s after SIGTERM"
            sleep 0.1
            i=$((i + 1))
        done
        echo "pollux: $pid (started by an upgrade) stopped"
        pid="" upgraded=""
        [ -z "$share" ] || cp "$plog" "$share/guest-$(basename "$plog")"
        return 0
    fi
    (sleep 30; kill -KILL "$pid" 2>/dev/null) &
    wd=$!
    rc=0
    wait "$pid" || rc=$?
    kill "$wd" 2>/dev/null || true
    p=$pid
    pid=""
    [ "$rc" != 137 ] || die "pollux $p still running 30 s after SIGTERM: killed"
    [ "$rc" = 0 ] || die "pollux $p exited $rc after SIGTERM (want 0)"
    echo "pollux: $p stopped cleanly"
    [ -z "$share" ] || cp "$plog" "$share/guest-$(basename "$plog")"
}

# pconnect NQN: connect to NQN on the guest's pollux, print the block device. A pollux that
# died fails the I/O after 30 s instead of the host reconnecting for 10 minutes.
pconnect() {
    connect "$1" 127.0.0.1 "$port" --ctrl-loss-tmo=30 --reconnect-delay=2
}

# ctl ARGS...: pollux ctl on our socket.
ctl() {
    "$P" ctl --socket "$sock" "$@"
}

# bench WHO DEV QD: 4k random reads at iodepth QD for 5 s (after 1 s of ramp) over the
# first 64 MiB of DEV; JSON to the share (else the console); prints "BENCH WHO qdQD iops=N".
bench() {
    f=/tmp/fio-$1-qd$3.json
    fio --name="$1-qd$3" --filename="$2" --rw=randread --bs=4k --iodepth="$3" --size=64M \
        --direct=1 --ioengine="$engine" --time_based --runtime=5 --ramp_time=1 \
        --output-format=json --output="$f" > /dev/null 2>&1 || { cat "$f" 2>/dev/null; die "fio randread qd$3 on $2 failed"; }
    # The first "iops" of fio's JSON is jobs[0].read.iops.
    iops=$(grep -m1 '"iops" *:' "$f" | sed 's/.*: *\([0-9.]*\).*/\1/')
    [ -n "$iops" ] || { cat "$f"; die "no iops in fio's output for $1 qd$3"; }
    if [ -n "$share" ]; then cp "$f" "$share/"; else cat "$f"; fi
    echo "BENCH $1 qd$3 iops=$iops ($engine, 4k randread, $2)"
}

# pci_bdev BDF: print the block device (/dev/nvmeXnY) the kernel nvme driver made of BDF.
pci_bdev() {
    for b in /sys/bus/pci/devices/"$1"/nvme/nvme*/nvme*n*; do
        [ -e "$b/dev" ] || continue
        [ -b "/dev/${b##*/}" ] || continue
        echo "/dev/${b##*/}"
        return 0
    done
    return 1
}

# ctrl_transport NQN: print the transport of the controller connected to NQN.
ctrl_transport() {
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$1" ] || continue
        cat "$c/transport"
        return 0
    done
    echo none
}

# status_field BDF COL: column COL of BDF's row of `pollux setup status`.
status_field() {
    "$P" setup status | awk -v b="$1" -v c="$2" '$1 == b { print $c }'
}

step find-nvme
bdf=
for p in /sys/bus/pci/devices/*; do
    [ "$(cat "$p/class")" = 0x010802 ] && { bdf=${p##*/}; break; }
done
[ -n "$bdf" ] || die "no NVMe PCI function (boot.sh --nvme IMG)"
kdev=$(pci_bdev "$bdf") || die "the kernel nvme driver made no block device of $bdf"
echo "NVMe function $bdf, kernel block device $kdev; $ncpu CPUs, reactors on cores $cores; fio $engine"

step setup-status
st=$("$P" setup status) || die "pollux setup status failed"
echo "$st"
[ "$(status_field "$bdf" 3)" = nvme ] || die "setup status: $bdf not on driver nvme"
g=$(status_field "$bdf" 4)
[ "$g" != none ] || die "setup status: $bdf has no IOMMU group (boot.sh --iommu)"
echo "$st" | grep -q '^IOMMU: on' || die "setup status: IOMMU not reported on"
echo "$st" | grep -q '^vfio-pci: loaded' || die "setup status: vfio-pci not reported loaded"
echo "$st" | grep -q '^hugepages 2048kB: [0-9]* reserved' || die "setup status: no hugepages line"

step setup-errors
# Each refusal: exit 1, one line naming the function, nothing changed.
rc=0
e=$("$P" setup bind 0000:00:1f.7 2>&1) || rc=$?
echo "$e"
[ "$rc" = 1 ] || die "bind of a missing function: rc $rc, want 1"
echo "$e" | grep -q '^pollux setup: 0000:00:1f.7: no such PCI function' || die "no 'no such PCI function' error"
other=
for p in /sys/bus/pci/devices/*; do
    [ "$(cat "$p/class")" = 0x010802 ] || { other=${p##*/}; break; }
done
rc=0
e=$("$P" setup bind "$other" 2>&1) || rc=$?
echo "$e"
[ "$rc" = 1 ] || die "bind of non-NVMe $other: rc $rc, want 1"
echo "$e" | grep -q "$other: not an NVMe function" || die "no 'not an NVMe function' error for $other"
e=$("$P" setup unbind "$bdf") || die "unbind of a function on nvme failed"
echo "$e"
echo "$e" | grep -q "not bound to vfio-pci (driver nvme): nothing to do" || die "unbind of $bdf on nvme: $e"
[ "$(status_field "$bdf" 3)" = nvme ] || die "$bdf left driver nvme"

step hugepages
h=$("$P" setup hugepages 16) || die "pollux setup hugepages 16 failed"
echo "$h"
echo "$h" | grep -q 'asked 16, reserved 16' || die "hugepages: $h"

step kernel-baseline
# The device's own composite temperature, as the kernel driver reads it (kelvin).
smart_temp() { nvme smart-log "$1" -o json 2>/dev/null | sed -n 's/.*"temperature" *: *\([0-9][0-9]*\).*/\1/p' | head -1; }
ktemp=$(smart_temp "$kdev")
[ "${ktemp:-0}" -gt 0 ] || die "nvme smart-log $kdev: no temperature"
# Allocate the first 64 MiB of the image, so both paths read the same written blocks.
dd if=/dev/zero of="$kdev" bs=1M count=64 oflag=direct 2>/dev/null || die "dd to $kdev"
bench kernel "$kdev" 1
bench kernel "$kdev" 16

step setup-bind
"$P" setup bind "${bdf#0000:}" || die "pollux setup bind ${bdf#0000:} failed"
[ "$(status_field "$bdf" 3)" = vfio-pci ] || die "setup status: $bdf not on vfio-pci after bind"
[ "$(status_field "$bdf" 5)" = "/dev/vfio/$g" ] || die "setup status: no /dev/vfio/$g after bind"
[ -c "/dev/vfio/$g" ] || die "no /dev/vfio/$g"
i=0
while [ -b "$kdev" ]; do
    [ $i -lt 25 ] || die "$kdev still there 5 s after the bind"
    sleep 0.2
    i=$((i + 1))
done
e=$("$P" setup bind "$bdf") || die "a second bind failed"
echo "$e"
echo "$e" | grep -q "$bdf: already bound to vfio-pci" || die "second bind: $e"
"$P" setup status

# write_conf FILE NQN BACKEND: pollux on the guest's CPUs in interrupt mode, listening on
# 127.0.0.1:$port with the control socket $sock, serving namespace 1 of subsystem NQN.
write_conf() {
    cat > "$1" <<EOF
[reactors]
cores = $cores
mode = "interrupt"

[[listener]]
address = "127.0.0.1:$port"

[control]
socket = "$sock"

[[subsystem]]
nqn = "$2"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = $3
EOF
}

step pollux-start
conf=/tmp/pollux-nvme.toml
write_conf "$conf" "$nqn" "{ nvme = { pci = \"$bdf\", nsid = 1 } }"
"$P" --check "$conf" || die "pollux --check rejects $conf"
pollux_start "$conf"
ctl subsystems

step connect
dev=$(pconnect "$nqn")
t=$(ctrl_transport "$nqn")
[ "$t" = tcp ] || die "$dev: transport $t, want tcp"
echo "connected: $dev (transport $t)"
nvme list
# pollux's SMART / Health page carries the device's own health (issue 21).
ptemp=$(smart_temp "$dev")
[ "$ptemp" = "$ktemp" ] || die "SMART temperature over pollux ${ptemp:-none} K, the device's $ktemp K"
echo "SMART temperature: $ptemp K, the device's own"

step fio-verify
fio_verify "$dev" 4k 32M
fio_verify "$dev" 64k 48M
fio_verify "$dev" 1m 48M

step pollux-bench
bench pollux "$dev" 1
bench pollux "$dev" 16

step persistence
dd if=/dev/urandom of=/tmp/pattern bs=1M count=4 2>/dev/null
pat_md5=$(md5sum < /tmp/pattern | cut -d' ' -f1)
dd if=/tmp/pattern of="$dev" bs=1M seek=8 oflag=direct conv=fsync 2>/dev/null || die "write of the pattern to $dev"
disconnect "$nqn"
pollux_stop
pollux_start "$conf"
dev=$(pconnect "$nqn")
echo 3 > /proc/sys/vm/drop_caches
md5=$(dd if="$dev" bs=1M skip=8 count=4 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
[ "$md5" = "$pat_md5" ] || die "4 MiB at 8 MiB after restart: md5 $md5, want $pat_md5"
echo "persistence: 4 MiB at offset 8 MiB intact across SIGTERM + restart (md5 $md5)"

step spdk-nvme
# SPDK's way to serve a local SSD (bdev_nvme_attach_controller, then nvmf_subsystem_add_ns),
# over the control socket: the conf's namespace removed, the device's namespace attached as
# bdev Nvme0n1 and served in its place; the pattern reads back through it.
disconnect "$nqn"
ctl call remove_namespace "{\"nqn\":\"$nqn\",\"nsid\":1}" >/dev/null || die "remove_namespace 1"
out=$(ctl --json call bdev_nvme_attach_controller "{\"name\":\"Nvme0\",\"trtype\":\"PCIe\",\"traddr\":\"$bdf\"}") ||
    die "bdev_nvme_attach_controller $bdf"
echo "bdev_nvme_attach_controller: $out"
echo "$out" | grep -q '"Nvme0n1"' || die "bdev_nvme_attach_controller made no Nvme0n1: $out"
out=$(ctl --json call bdev_get_bdevs '{"name":"Nvme0n1"}') || die "bdev_get_bdevs Nvme0n1"
echo "$out" | grep -q '"NVMe disk"' || die "bdev_get_bdevs Nvme0n1: $out"
ctl call nvmf_subsystem_add_ns "{\"nqn\":\"$nqn\",\"namespace\":{\"bdev_name\":\"Nvme0n1\",\"nsid\":1}}" >/dev/null ||
    die "nvmf_subsystem_add_ns Nvme0n1"
dev=$(pconnect "$nqn")
echo 3 > /proc/sys/vm/drop_caches
md5=$(dd if="$dev" bs=1M skip=8 count=4 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
[ "$md5" = "$pat_md5" ] || die "4 MiB at 8 MiB through bdev Nvme0n1: md5 $md5, want $pat_md5"
echo "spdk-nvme: the SSD's namespace attached through SPDK's methods serves the same data (md5 $md5)"

step idle-cpu
sleep 2
r=$(ctl reactors) || die "pollux ctl reactors failed"
echo "$r"
modes=$(echo "$r" | awk 'NR > 1 { print $3 }' | sort -u)
[ "$modes" = interrupt ] || die "reactor modes '$modes', want interrupt"
# utime + stime of the whole process and of each thread, in clock ticks (USER_HZ, 100 on
# x86); fields counted after the ") " that ends the command name.
ticks() {
    sed 's/.*) //' "$1" | awk '{ print $12 + $13 }'
}
threads() {
    for t in "/proc/$pid/task/"*; do echo "${t##*/} $(cat "$t/comm") $(ticks "$t/stat")"; done
}
threads > /tmp/threads0
t0=$(ticks "/proc/$pid/stat")
u0=$(cut -d' ' -f1 /proc/uptime)
sleep 5
t1=$(ticks "/proc/$pid/stat")
u1=$(cut -d' ' -f1 /proc/uptime)
threads > /tmp/threads1
echo "threads that ran while idle (ticks in 5 s):"
awk 'NR == FNR { a[$1] = $3; next } $3 - a[$1] > 0 { printf "  %s %s %d\n", $1, $2, $3 - a[$1] }' /tmp/threads0 /tmp/threads1
pct=$(awk -v a="$t0" -v b="$t1" -v s="$u0" -v e="$u1" 'BEGIN { printf "%.2f", (b - a) / (e - s) }')
echo "IDLE pollux CPU over $(awk -v s="$u0" -v e="$u1" 'BEGIN { printf "%.1f", e - s }') s, host connected and idle: $pct % of one CPU ($((t1 - t0)) ticks; limit $IDLE_MAX_PCT %)"
awk -v p="$pct" -v m="$IDLE_MAX_PCT" 'BEGIN { exit !(p <= m) }' ||
    die "pollux idle in interrupt mode used $pct % of a CPU (limit $IDLE_MAX_PCT %)"

step upgrade
# pollux ctl upgrade ten times under fio verify (away from the pattern at 8 MiB): each time
# the old process drains the queues, shuts the device down and closes its VFIO handles, the
# new one brings the device up and takes the connections; the host sees no error and does
# not reconnect.
kmark upgrade
fio --name=upgrade --filename="$dev" --rw=randwrite --bs=4k --offset=16M --size=32M --direct=1 \
    --ioengine=libaio --iodepth=8 --time_based --runtime=40 --verify=crc32c --verify_backlog=64 \
    --verify_fatal=1 --eta=never --output=/tmp/fio-upgrade.out &
fpid=$!
sleep 3
for k in 1 2 3 4 5 6 7 8 9 10; do
    out=$(ctl upgrade) || { tail -20 "$plog"; die "upgrade $k refused: $out"; }
    echo "upgrade $k: $out"
    echo "$out" | grep -q "NVMe devices re-initialized: 1" || die "upgrade $k did not re-initialize the device: $out"
    sleep 2
done
pid=$("$P" ctl --socket "$sock" --json version | sed -n 's/.*"pid": *\([0-9]*\).*/\1/p')
[ -n "$pid" ] || die "no pid from ctl version after the upgrades"
upgraded=1
wait "$fpid" || { cat /tmp/fio-upgrade.out; die "fio verify across the upgrades failed"; }
grep -q 'err= 0' /tmp/fio-upgrade.out || { cat /tmp/fio-upgrade.out; die "fio reported an error across the upgrades"; }
grep -E 'IOPS=|clat \((u|m)sec\)' /tmp/fio-upgrade.out | head -3
if ksince upgrade | grep -iE 'reconnect|I/O error|resetting|timeout'; then
    die "the host's kernel logged the above across the upgrades"
fi
echo "10 upgrades under fio verify: no error, no reconnect (pollux now pid $pid)"

step unbind
disconnect "$nqn"
pollux_stop
"$P" setup unbind "$bdf" || die "pollux setup unbind $bdf failed"
i=0
until kdev=$(pci_bdev "$bdf"); do
    [ $i -lt 100 ] || die "no block device of $bdf 20 s after unbind (driver $(status_field "$bdf" 3))"
    sleep 0.2
    i=$((i + 1))
done
[ "$(status_field "$bdf" 3)" = nvme ] || die "$bdf not back on nvme"
echo "kernel nvme driver has $bdf back: $kdev"
md5=$(dd if="$kdev" bs=1M skip=8 count=4 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
[ "$md5" = "$pat_md5" ] || die "the pattern written through pollux reads back as md5 $md5 through the kernel, want $pat_md5"
echo "the kernel reads pollux's pattern back intact"
"$P" setup status

step fault-start
conf=/tmp/pollux-fake.toml
write_conf "$conf" "$fnqn" '{ nvme = { fake = "fake0", size = "64MiB", nsid = 1 } }'
"$P" --check "$conf" || die "pollux --check rejects $conf"
pollux_start "$conf"
fdev=$(pconnect "$fnqn")
lbs=$(cat "/sys/block/${fdev#/dev/}/queue/logical_block_size")
nlb=$((4096 / lbs - 1))
echo "fake namespace: $fdev, $lbs-byte blocks"

step fault-fail
dd if=/tmp/pattern of="$fdev" bs=4096 count=1 oflag=direct conv=fsync 2>/dev/null || die "write to $fdev"
dd if=/tmp/pattern of=/tmp/block0 bs=4096 count=1 2>/dev/null
ctl call nvme_fault '{"device":"fake0","kind":"fail","count":1}' || die "nvme_fault fail refused"
# nvme read is a passthrough command: the kernel does not retry it.
if nvme read "$fdev" -s 0 -c "$nlb" -z 4096 -d /tmp/r1 > /tmp/nvme-read.out 2>&1; then
    cat /tmp/nvme-read.out
    die "the read after a 'fail' fault succeeded"
fi
cat /tmp/nvme-read.out
echo "the first read failed, as injected"
nvme read "$fdev" -s 0 -c "$nlb" -z 4096 -d /tmp/r2 || die "the read after the failed one failed too"
cmp /tmp/r2 /tmp/block0 || die "block 0 of $fdev reads back wrong after the fault"
echo "the next read succeeds with the right data"

step fault-cfs
(fio_verify "$fdev" 4k 48M) > /tmp/fio-cfs.log 2>&1 &
fpid=$!
sleep 3
alive "$fpid" || { cat /tmp/fio-cfs.log; die "fio finished before the fault was injected"; }
ctl call nvme_fault '{"device":"fake0","kind":"cfs"}' || die "nvme_fault cfs refused"
rc=0
wait "$fpid" || rc=$?
cat /tmp/fio-cfs.log
[ "$rc" = 0 ] || die "fio verify across the controller fatal status failed (rc $rc)"
d=$(ctl call nvme_devices) || die "nvme_devices failed"
echo "$d"
resets=$(echo "$d" | tr -d ' \n' | sed -n 's/.*"resets":\([0-9]*\).*/\1/p')
[ "${resets:-0}" -ge 1 ] || die "nvme_devices shows ${resets:-no} resets after CSTS.CFS, want >= 1"
echo "controller reset $resets time(s); fio verify passed across it"
dmesg | grep -iE 'nvme.*(abort|retry|reset|error)' | tail -5 || true

step fault-end
disconnect "$fnqn"
pollux_stop
step end
