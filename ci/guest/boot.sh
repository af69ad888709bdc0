#!/bin/bash
# shellcheck disable=SC2054  # commas inside QEMU option values are QEMU's
# shellcheck disable=SC2317  # cleanup and its helpers run from a trap
# Boot the test guest under QEMU TCG; its serial console goes to a log file
# (and to stdout unless --quiet).
#   usage: boot.sh [options] [-- extra qemu args]
#     --kernel SERIES      the guest kernel (ci/guest/kernels.sh): 6.1, the
#                          default (Debian 12's), 6.12 (bookworm's 6.12,
#                          whose NVMe host and nvmet have DH-HMAC-CHAP
#                          in-band auth and NVMe/TCP TLS), 6.18
#                          (trixie-backports', which adds secure channel
#                          concatenation) or 7.3 (trixie-backports' newest;
#                          only after setup.sh 7.3); each has its own
#                          vmlinux and initramfs (6.1 in $GUEST_WORK, the
#                          others in $GUEST_WORK/k-SERIES), made by setup.sh
#     --script NAME        run /guest/NAME (from guest.d/) and power off
#     --cmd 'SHELL'        run this snippet (base64 on the kernel command
#                          line, so ~1.4 KB at most) and power off
#                          (neither: interactive shell, Ctrl-A x quits)
#     --env KEY=VALUE      exported to the guest script (repeatable)
#     --guestfwd G=H       guest 10.0.2.100:G -> host 127.0.0.1:H (repeatable).
#                          slirp runs 'busybox nc 127.0.0.1 H' for EVERY guest
#                          connection: NVMe/TCP opens one per queue, and the
#                          plain tcp: form would funnel all into one.
#     --hostfwd H=G        host 127.0.0.1:H -> guest 10.0.2.15:G (repeatable)
#     --nvme IMG           emulated PCIe NVMe controller on raw file IMG
#                          (repeatable)
#     --iommu              intel-iommu vIOMMU (+ intel_iommu=on iommu=pt), so
#                          the guest can bind the NVMe controller to vfio-pci
#     --share-ro DIR       host DIR read-only over 9p; the guest's /init
#                          mounts it at /mnt/host
#     --share DIR          the same, read-write (a channel between a guest
#                          script and the host scenario driving it)
#     --timeout SECS       kill QEMU (by PID) after SECS; exit 124 (300)
#     --pidfile FILE       QEMU's PID is written here while it runs
#     --log FILE           console log ($GUEST_WORK/logs/console-PID.log)
#     --quiet              do not copy the console to stdout
#     --initrd FILE        another initramfs (build-initramfs.sh --kernel
#                          SERIES OUT, for the same SERIES)
#     --mem MB (1024)  --smp N (2)  --append 'kernel args'
# Networking is QEMU user mode (slirp) with restrict=on: the guest reaches
# nothing but the forwards given here, all on the host's 127.0.0.1.
# KVM is not used: /dev/kvm on these machines is PVM, where stock kernels
# hang or die; TCG is slow but works.
# Exit status: the guest's (its "GUEST-RC=n" line); 124 on timeout; 125 if
# QEMU ended without one. QEMU and its relays never outlive this script.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${GUEST_WORK:-$(cd "$HERE/../.." && pwd)/build/guest}

die() { echo "boot.sh: $*" >&2; exit 2; }
port_ok() { [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le 65535 ]; }

# shellcheck source=ci/guest/kernels.sh
. "$HERE/kernels.sh"
series=$GUEST_KERNEL_DEFAULT
mem=1024 smp=2 timeout=300 append="" log="" quiet="" pidfile="" initrd=""
machine=q35 iommu=() gscript="" gcmd="" genv="" net="user,id=n0,restrict=on" extra=()
nvme_n=0
while [ $# -gt 0 ]; do
    case $1 in
        --kernel) guest_kernel_ok "${2:-}" || die "--kernel wants one of: $GUEST_KERNELS (got '${2:-}')"
                  series=$2; shift ;;
        --script) gscript=$2; shift ;;
        --cmd) gcmd=$(printf '%s\n' "$2" | base64 -w0); shift ;;
        --env) [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env wants KEY=VALUE, got '$2'"
               v=${2#*=} q="'\\''"
               genv+="${2%%=*}='${v//\'/$q}'"$'\n'; shift ;;
        --guestfwd)
            g=${2%%=*} h=${2#*=}
            { port_ok "$g" && port_ok "$h"; } || die "--guestfwd wants GPORT=HOSTPORT, got '$2'"
            net+=",guestfwd=tcp:10.0.2.100:$g-cmd:busybox nc 127.0.0.1 $h"; shift ;;
        --hostfwd)
            h=${2%%=*} g=${2#*=}
            { port_ok "$g" && port_ok "$h"; } || die "--hostfwd wants HOSTPORT=GPORT, got '$2'"
            net+=",hostfwd=tcp:127.0.0.1:$h-10.0.2.15:$g"; shift ;;
        --nvme) [ -f "$2" ] || die "--nvme: no file $2"
                extra+=(-drive "file=$2,if=none,id=nvm$nvme_n,format=raw"
                        -device "nvme,serial=pollux$nvme_n,drive=nvm$nvme_n")
                nvme_n=$((nvme_n + 1)); shift ;;
        --iommu) machine=q35,kernel-irqchip=split
                 iommu=(-device intel-iommu,intremap=on,caching-mode=on)
                 append+=" intel_iommu=on iommu=pt" ;;
        --share-ro) [ -d "$2" ] || die "--share-ro: no directory $2"
                    extra+=(-virtfs "local,path=$2,mount_tag=host0,security_model=none,readonly=on,id=host0"); shift ;;
        --share) [ -d "$2" ] || die "--share: no directory $2"
                 extra+=(-virtfs "local,path=$2,mount_tag=host0,security_model=none,id=host0")
                 append+=" gshare=rw"; shift ;;
        --pidfile) pidfile=$2; shift ;;
        --timeout) [[ $2 =~ ^[0-9]+$ ]] || die "--timeout wants seconds"; timeout=$2; shift ;;
        --log) log=$2; shift ;;
        --quiet) quiet=1 ;;
        --initrd) initrd=$2; shift ;;
        --mem) mem=$2; shift ;;
        --smp) smp=$2; shift ;;
        --append) append+=" $2"; shift ;;
        --) shift; extra+=("$@"); break ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | grep -v '^# shellcheck' | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (--help)" ;;
    esac
    shift
done
KW=$(guest_kdir "$series")
[ -s "$KW/kver" ] || die "no $series kernel in $KW: run ci/guest/setup.sh $series first"
KVER=$(cat "$KW/kver")
initrd=${initrd:-$KW/initramfs.img}
[ -s "$initrd" ] || die "no initramfs $initrd: run ci/guest/setup.sh $series first"
[ -n "$genv" ] && append+=" genv=$(printf '%s' "$genv" | base64 -w0)"
[ -n "$gcmd" ] && append+=" gcmd=$gcmd"
[ -n "$gscript" ] && append+=" gscript=$gscript"
# no_timer_check: under TCG on a loaded host the kernel's early check that the timer
# interrupt arrives through the (interrupt-remapped) IO-APIC can time out and panic
# ("timer doesn't work through Interrupt-remapped IO-APIC"); the timer works, the check
# is only too impatient for an emulated CPU.
cmdline="console=ttyS0 panic=-1 quiet loglevel=4 no_timer_check$append"
# The x86 kernel truncates its command line at 2048 bytes: refuse instead.
[ ${#cmdline} -lt 2048 ] || die "kernel command line is ${#cmdline} bytes (max 2047)"

kernel=$KW/vmlinux   # uncompressed ELF: PVH entry, ~5 s faster under TCG
[ -s "$kernel" ] || kernel=$KW/kroot/boot/vmlinuz-$KVER
qemu=(qemu-system-x86_64 -accel tcg -cpu max -machine "$machine" -m "$mem" -smp "$smp"
      -nodefaults -no-reboot -kernel "$kernel" -initrd "$initrd" -append "$cmdline"
      "${iommu[@]}" -netdev "$net" -device virtio-net-pci,netdev=n0,romfile=
      "${extra[@]}")

if [ -z "$gcmd$gscript" ]; then   # interactive: the terminal is the console
    [ -n "$pidfile" ] && echo $$ > "$pidfile"   # exec keeps this PID
    exec "${qemu[@]}" -display none -serial mon:stdio
fi

mkdir -p "$W/logs"
log=${log:-$W/logs/console-$$.log}
mkdir -p "$(dirname "$log")"
# Every process QEMU spawns (the per-connection nc relays; slirp puts each
# in its own session, so no process group reaches them) inherits this tag:
# cleanup finds them by it, and kills them by PID.
tag="boot-$$-$(date +%s%N)"
qpid="" tpid=""
relays() {
    local f
    for f in /proc/[0-9]*/environ; do
        grep -qzx "CI_GUEST_TAG=$tag" "$f" 2>/dev/null || continue
        f=${f#/proc/}
        echo "${f%/environ}"
    done
}
kill_pid() {   # kill_pid PID: TERM, up to 5 s, then KILL
    kill -TERM "$1" 2>/dev/null || return 0
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
}
cleanup() {
    local p
    [ -n "$qpid" ] && kill_pid "$qpid"
    for p in $(relays); do kill -KILL "$p" 2>/dev/null || true; done
    [ -n "$tpid" ] && { kill "$tpid" 2>/dev/null || true; }
    [ -n "$pidfile" ] && rm -f "$pidfile"
    return 0
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

CI_GUEST_TAG=$tag "${qemu[@]}" -display none -monitor none -serial stdio \
    </dev/null >"$log" 2>&1 &
qpid=$!
[ -n "$pidfile" ] && echo "$qpid" > "$pidfile"
if [ -z "$quiet" ]; then
    tail -n +1 -f --pid="$qpid" "$log" &
    tpid=$!
fi

deadline=$((SECONDS + timeout)) timed_out=""
while kill -0 "$qpid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then timed_out=1; break; fi
    sleep 0.2
done
if [ -n "$timed_out" ]; then
    kill_pid "$qpid"
fi
qrc=0
wait "$qpid" || qrc=$?
qpid=""
if [ -n "$tpid" ]; then wait "$tpid" 2>/dev/null || true; tpid=""; fi

if [ -n "$timed_out" ]; then
    echo "boot.sh: guest timed out after ${timeout}s; QEMU killed (console: $log)" >&2
    exit 124
fi
rc=$(tr -d '\r' < "$log" | sed -n 's/^GUEST-RC=\([0-9]*\).*/\1/p' | tail -1)
if [ -z "$rc" ]; then
    echo "boot.sh: QEMU exited ($qrc) without a GUEST-RC line (console: $log)" >&2
    exit 125
fi
exit "$rc"
