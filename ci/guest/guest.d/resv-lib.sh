# shellcheck shell=sh
# Reservation helpers for the guest scenarios of two kernel hosts sharing a namespace
# (pollux-resv.sh, pollux-gateway-resv.sh): nvme-cli's extended Reservation Report and
# direct I/O that a reservation allows or refuses. Source after /guest/lib.sh.

# ctrl_of DEV: its controller (nvmeN).
ctrl_of() { basename "$(readlink -f "/sys/block/${1#/dev/}/device")"; }
if nvme resv-report --help 2>&1 | grep -q -- '--eds'; then eds=--eds; else eds=--cdw11=1; fi
# report DEV: the extended Reservation Report, printed (without host identifiers); kept in
# /tmp/report.
report() {
    nvme resv-report "$1" -n 1 "$eds" > /tmp/report 2>&1 || { cat /tmp/report; die "resv-report $1 failed"; }
    grep -v hostid /tmp/report
}
# field NAME: its first value in the last report (gen, rtype, regctl, ptpls; rcsts, rkey of
# the first registrant).
field() { sed -n "s/^[[:space:]]*$1[[:space:]]*:[[:space:]]*\([0-9a-fx]*\).*/\1/p" /tmp/report | head -1; }
# expect_field NAME VALUE
expect_field() { [ "$(field "$1")" = "$2" ] || die "report: $1 is '$(field "$1")', not $2"; }
# can_write DEV / cannot_write DEV, can_read DEV / cannot_read DEV: direct I/O at LBA 0.
blk=/tmp/blk
dd if=/dev/urandom of=$blk bs=4096 count=1 2>/dev/null
can_write() { dd if=$blk of="$1" bs=4096 count=1 oflag=direct conv=notrunc 2>/dev/null || die "$1 cannot write"; }
cannot_write() {
    dd if=$blk of="$1" bs=4096 count=1 oflag=direct conv=notrunc 2>/dev/null && die "$1 wrote through a reservation"
    out=$(nvme write "$1" -s 0 -c 7 -z 4096 -d $blk 2>&1) && die "nvme write on $1 succeeded: $out"
    echo "$out" | grep -qi 'reservation conflict' || die "nvme write on $1: '$out', not Reservation Conflict"
    echo "$1: write refused: $out"
}
can_read() { dd if="$1" of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null || die "$1 cannot read"; }
cannot_read() {
    dd if="$1" of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null && die "$1 read through a reservation"
    echo "$1: read refused"
}
# resv ARGS...: nvme ARGS, which must succeed; its output printed.
resv() { out=$(nvme "$@" 2>&1) || die "nvme $*: $out"; echo "nvme $*: $out"; }
