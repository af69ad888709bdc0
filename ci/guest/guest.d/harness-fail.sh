# shellcheck shell=sh
# Guest side of ci/scenarios/harness.sh: fails on purpose in step
# 'expected-failure', so the scenario can check how failures are reported.
# shellcheck source=ci/guest/guest.d/lib.sh
. /guest/lib.sh
step before-failure
echo "harness: this guest fails on purpose"
step expected-failure
fio_verify /dev/nvme9n9 4k 1M
step never-reached
