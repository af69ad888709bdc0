# shellcheck shell=sh
# Guest side of ci/scenarios/harness.sh: hangs on purpose, so the scenario
# can check that boot.sh kills QEMU at its timeout.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
step expected-hang
sleep 100000
