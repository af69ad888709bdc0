# shellcheck shell=sh
# Helpers sourced by the guest scripts (busybox sh; scripts run under sh -e).
# Failures go through die, which names the current step; run_guest on the
# host reports the last "STEP: <name>" line of the console.
# Call helpers as plain commands or in $(...), not as `if helper` or
# `helper || ...`: sh -e is off inside those, and a failing check would pass.
# In the 6.12 guest, tnvme (nvme-cli 2.13), tlshd and keyctl are Debian 13's,
# run chrooted in /trixie (build-initramfs.sh); `nvme` is Debian 12's 2.4.

# The host, as slirp shows it to the guest (boot.sh --guestfwd GPORT=HPORT).
HOST_ADDR=10.0.2.100
CUR_STEP=start

# step NAME: mark the start of a step on the console.
step() {
    CUR_STEP=$1
    echo "STEP: $1 uptime=$(cut -d' ' -f1 /proc/uptime)"
}

# die MSG: fail the script, naming the step.
die() {
    echo "FAIL: [$CUR_STEP] $*" >&2
    exit 1
}

# tcp_established PORT: count this guest's ESTABLISHED TCP connections whose
# remote port is PORT (read from /proc/net/tcp{,6}: st 01, port in hex).
tcp_established() {
    hex=$(printf '%04X' "$1")
    cat /proc/net/tcp /proc/net/tcp6 2>/dev/null |
        awk -v p=":$hex" '$4 == "01" && substr($3, length($3) - 4) == p' | wc -l
}

# nvme_bdev NQN: print /dev/nvmeXnY of the connected subsystem NQN.
nvme_bdev() {
    for b in /sys/block/nvme*n*; do
        [ -e "$b" ] || continue
        case ${b##*/} in nvme*c*) continue ;; esac   # hidden multipath path
        [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$1" ] || continue
        echo "/dev/${b##*/}"
        return 0
    done
    return 1
}

# wait_bdev NQN [SECS]: wait until NQN's namespace has a block device node,
# print it.
wait_bdev() {
    n=0
    while [ "$n" -lt "$((${2:-20} * 5))" ]; do
        d=$(nvme_bdev "$1") && [ -b "$d" ] && { echo "$d"; return 0; }
        sleep 0.2
        n=$((n + 1))
    done
    die "no block device for $1 after ${2:-20}s"
}

# discover ADDR PORT: nvme discover over TCP; the log page must be non-empty.
discover() {
    out=$(timeout 30 nvme discover -t tcp -a "$1" -s "$2") ||
        die "nvme discover -t tcp -a $1 -s $2 failed"
    echo "$out"
    echo "$out" | grep -q 'subnqn:' || die "discovery log from $1:$2 lists no subsystem"
}

# connect NQN ADDR PORT [nvme-cli args]: connect and print the block device.
connect() {
    nqn=$1 addr=$2 port=$3
    shift 3
    timeout 60 nvme connect -t tcp -n "$nqn" -a "$addr" -s "$port" "$@" >&2 ||
        die "nvme connect -t tcp -n $nqn -a $addr -s $port $* failed"
    wait_bdev "$nqn"
}

# host_discover PORT: discover the target at host port PORT (via guestfwd).
host_discover() {
    discover "$HOST_ADDR" "$1"
}

# host_connect NQN PORT [nvme-cli args]: connect to NQN on the host target
# at port PORT, wait for its block device and print it (/dev/nvmeXnY).
#   dev=$(host_connect "$nqn" 4420 --nr-io-queues=2)
host_connect() {
    h_nqn=$1 h_port=$2
    shift 2
    connect "$h_nqn" "$HOST_ADDR" "$h_port" "$@"
}

# disconnect NQN: nvme disconnect; it must report a controller and leave no
# block device behind.
disconnect() {
    out=$(timeout 30 nvme disconnect -n "$1") || die "nvme disconnect -n $1 failed"
    echo "$out"
    echo "$out" | grep -q 'disconnected [1-9]' || die "nvme disconnect -n $1: no controller ($out)"
    sleep 0.2
    d=$(nvme_bdev "$1") && die "$d of $1 still present after disconnect"
    return 0
}

# host_disconnect NQN: disconnect from NQN (same as disconnect, named for
# symmetry with host_connect).
host_disconnect() {
    disconnect "$1"
}

# kib SIZE: SIZE (N, NK, NM, NG) in KiB.
kib() {
    case $1 in
        *[kK]) echo $((${1%?})) ;;
        *[mM]) echo $((${1%?} * 1024)) ;;
        *[gG]) echo $((${1%?} * 1024 * 1024)) ;;
        *) echo $(($1 / 1024)) ;;
    esac
}

# fio_verify DEV BS [SIZE]: random writes of BS over the first SIZE (32M) of
# DEV at iodepth 16 (libaio, O_DIRECT), each block with a crc32c header, then
# read everything back and check it. Asserts that fio exits 0, reports no
# error, and that both the write and the verify pass moved all SIZE bytes:
# a verify phase that read nothing would otherwise pass silently.
fio_verify() {
    dev=$1 bs=$2 size=${3:-32M}
    want=$(kib "$size")
    echo "fio: randwrite bs=$bs size=$size iodepth=16 crc32c verify on $dev"
    out=$(fio --name=verify --filename="$dev" --rw=randwrite --bs="$bs" --size="$size" \
              --direct=1 --ioengine=libaio --iodepth=16 --verify=crc32c --do_verify=1 \
              --verify_fatal=1 --output-format=terse,normal --terse-version=3 2>&1) ||
        { echo "$out" | grep -v "^3;"; die "fio on $dev failed"; }
    echo "$out" | grep -E 'IOPS=|err=|READ:|WRITE:'
    # terse v3: 5 error, 6 read KiB, 47 write KiB
    t=$(echo "$out" | grep '^3;')
    err=$(echo "$t" | cut -d';' -f5)
    rkb=$(echo "$t" | cut -d';' -f6)
    wkb=$(echo "$t" | cut -d';' -f47)
    [ "$err" = 0 ] || die "fio error $err on $dev"
    [ "$wkb" = "$want" ] || die "fio wrote ${wkb:-?} KiB, wanted $want"
    [ "$rkb" = "$want" ] || die "fio verified ${rkb:-?} KiB, wanted $want"
    echo "fio: $dev wrote $wkb KiB, verified $rkb KiB, no error"
}

# nvmet_setup ADDR PORT NQN [MiB]: kernel NVMe/TCP target (nvmet) on
# ADDR:PORT exporting a brd ramdisk (/dev/ram0, 64 MiB) as namespace 1 of
# NQN, any host allowed.
nvmet_setup() {
    addr=$1 port=$2 nqn=$3 mib=${4:-64}
    modprobe brd rd_nr=1 rd_size=$((mib * 1024)) || die "modprobe brd"
    [ -b /dev/ram0 ] || die "no /dev/ram0"
    modprobe nvmet-tcp || die "modprobe nvmet-tcp"
    c=/sys/kernel/config/nvmet
    [ -d $c ] || die "no $c (configfs or nvmet missing)"
    mkdir "$c/subsystems/$nqn"
    echo 1 > "$c/subsystems/$nqn/attr_allow_any_host"
    mkdir "$c/subsystems/$nqn/namespaces/1"
    printf /dev/ram0 > "$c/subsystems/$nqn/namespaces/1/device_path"
    echo 1 > "$c/subsystems/$nqn/namespaces/1/enable"
    mkdir $c/ports/1
    echo tcp > $c/ports/1/addr_trtype
    echo ipv4 > $c/ports/1/addr_adrfam
    echo "$addr" > $c/ports/1/addr_traddr
    echo "$port" > $c/ports/1/addr_trsvcid
    ln -s "$c/subsystems/$nqn" "$c/ports/1/subsystems/$nqn"
    echo "nvmet: $nqn on tcp $addr:$port (/dev/ram0, $mib MiB)"
}

# vfio_bind_nvme: hand the first NVMe PCI function (class 0x010802, QEMU's
# boot.sh --nvme device) from its driver to vfio-pci and print "BDF GROUP"
# (/dev/vfio/GROUP). Needs boot.sh --iommu: Debian kernels have no VFIO
# no-IOMMU mode.
vfio_bind_nvme() {
    d=
    for p in /sys/bus/pci/devices/*; do
        [ "$(cat "$p/class")" = 0x010802 ] && { d=$p; break; }
    done
    [ -n "$d" ] || die "no NVMe PCI function (boot.sh --nvme IMG)"
    [ -e "$d/iommu_group" ] || die "${d##*/} has no IOMMU group (boot.sh --iommu)"
    g=$(basename "$(readlink "$d/iommu_group")")
    echo vfio-pci > "$d/driver_override"
    [ -e "$d/driver" ] && echo "${d##*/}" > "$d/driver/unbind"
    echo "${d##*/}" > /sys/bus/pci/drivers_probe
    [ "$(basename "$(readlink "$d/driver")")" = vfio-pci ] || die "${d##*/} did not bind to vfio-pci"
    [ -c "/dev/vfio/$g" ] || die "no /dev/vfio/$g"
    echo "${d##*/} $g"
}

# ---- helpers of the authentication scenarios (nvmet-auth-loop, pollux-auth)

# now: the guest's uptime, s; since T0: seconds since uptime T0, 2 decimals.
now() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# kmark NAME: a marker line in the kernel log; ksince NAME: the log after it.
kmark() { echo "guest: mark $1" > /dev/kmsg; }
ksince() { dmesg | awk -v m="guest: mark $1" 'f; index($0, m) { f = 1 }'; }

# kwait NAME ERE [SECS]: wait until the kernel log after mark NAME has a line
# matching ERE.
kwait() {
    n=0
    while [ "$n" -lt "$((${3:-20} * 5))" ]; do
        if ksince "$1" | grep -qE "$2"; then return 0; fi
        sleep 0.2
        n=$((n + 1))
    done
    ksince "$1"
    die "no kernel log line /$2/ after mark $1 in ${3:-20}s"
}

# ctrl_of DEV: /sys/class/nvme/nvmeX of block device /dev/nvmeXnY.
ctrl_of() { d=${1#/dev/}; echo "/sys/class/nvme/${d%n*}"; }

# nothing_connected PORT [NQN]: no fabrics controller, no block device of NQN,
# no TCP connection to PORT (closing sockets get 5 s).
nothing_connected() {
    n=0
    while [ "$(tcp_established "$1")" != 0 ] && [ "$n" -lt 25 ]; do sleep 0.2; n=$((n + 1)); done
    [ "$(tcp_established "$1")" = 0 ] || die "TCP connections to :$1 left: $(tcp_established "$1")"
    for x in /sys/class/nvme/nvme*; do
        if [ -e "$x" ]; then die "controller ${x##*/} left ($(cat "$x/state"))"; fi
    done
    if [ -n "${2:-}" ] && d=$(nvme_bdev "$2"); then die "$d left"; fi
    return 0
}

# roundtrip DEV: 1 MiB of random data written (O_DIRECT) and read back.
roundtrip() {
    head -c 1048576 /dev/urandom > /tmp/pat
    want=$(md5sum < /tmp/pat | cut -d' ' -f1)
    dd if=/tmp/pat of="$1" bs=64k oflag=direct 2>/dev/null || die "dd write to $1"
    got=$(dd if="$1" bs=64k count=16 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
    [ "$got" = "$want" ] || die "1 MiB read back from $1 differs"
    echo "dd: 1 MiB round trip on $1 ok"
}

# turn STEP: with the host's wait_guest/answer (ci/lib.sh), through the read-write share:
# tell the host we reached STEP, wait until it has done its part.
turn() {
    : > "/mnt/host/g-$1"
    n=0
    while [ ! -e "/mnt/host/h-$1" ]; do
        sleep 0.5
        n=$((n + 1))
        [ $n -lt 240 ] || die "the host never answered step $1"
    done
}

# fabrics_add OPTS: create a controller from a kernel option string (written straight to
# /dev/nvme-fabrics, bypassing what nvme-cli would add or refuse); print its nvmeN.
fabrics_add() {
    exec 3<>/dev/nvme-fabrics
    echo "$1" >&3 || { exec 3>&-; return 1; }
    read -r got <&3 || got=""
    exec 3>&-
    inst=${got#instance=}
    inst=${inst%%,*}
    [ -n "$inst" ] || return 1
    echo "nvme$inst"
}

# ms: the guest's uptime in milliseconds (a clock for durations).
ms() { awk '{printf "%d", $1 * 1000}' /proc/uptime; }

# ctrl_on PORT: the controller (nvmeN) connected to the host's port PORT.
ctrl_on() {
    for c in /sys/class/nvme/nvme*; do
        grep -q "trsvcid=$1" "$c/address" 2>/dev/null && { echo "${c##*/}"; return 0; }
    done
    return 1
}

# path PORT: the hidden multipath path device (nvmeXcYn1) of the controller on PORT.
path() {
    c=$(ctrl_on "$1") || return 1
    for p in /sys/block/nvme*c"${c#nvme}"n1; do
        [ -e "$p" ] && { echo "${p##*/}"; return 0; }
    done
    return 1
}

# ios PATH: reads and writes completed through block device PATH so far.
ios() { awk '{print $1 + $5}' "/sys/block/$1/stat"; }


# tlshd_up: start tlshd (6.12 guest, Debian 13's) for the kernel's TLS handshakes, with the
# image's tlshd.conf at loglevel 7 so that it says it linked the .nvme keyring (keyrings=
# .nvme), logging to /tmp/tlshd.log (-s: stderr; no syslog here; /tmp is shared with the
# chroot). Fails unless it is up after 1 s and linked .nvme. Sets TLSHD_PID.
tlshd_up() {
    sed 's/^loglevel=.*/loglevel=7/' /trixie/etc/tlshd.conf > /tmp/tlshd.conf
    tlshd -s -c /tmp/tlshd.conf > /tmp/tlshd.log 2>&1 &
    TLSHD_PID=$!
    sleep 1
    kill -0 "$TLSHD_PID" 2>/dev/null ||
        { cat /tmp/tlshd.log; die "tlshd exited (CONFIG_NET_HANDSHAKE? the .nvme keyring?)"; }
    grep -q "Keyring '.nvme' linked into our session keyring" /tmp/tlshd.log ||
        { cat /tmp/tlshd.log; die "tlshd did not link the .nvme keyring"; }
}

# refused_connect CASE PORT NVME [connect args]: `NVME connect` (nvme or tnvme) to the
# host's PORT fails, and leaves no controller, block device or TCP connection behind.
refused_connect() {
    rc_case=$1 rc_port=$2 rc_nvme=$3
    shift 3
    kmark "$rc_case"
    t0=$(now)
    if timeout 60 "$rc_nvme" connect -t tcp -a "$HOST_ADDR" -s "$rc_port" "$@" > /tmp/out 2>&1; then
        cat /tmp/out
        die "$rc_case: $rc_nvme connect $* succeeded"
    fi
    echo "TIME: $rc_case refused $(since "$t0")s"
    echo "$rc_nvme connect (refused, as it must be): $(cat /tmp/out)"
    ksince "$rc_case" | grep -E 'nvme|tls|handshake' || true
    nothing_connected "$rc_port"
}
