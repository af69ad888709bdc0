# shellcheck shell=sh
# Guest side of ci/scenarios/harness.sh: the guest kernel crashes on purpose
# before the script's first step (a sysrq-triggered panic), so the scenario
# can check that run_guest boots such a guest again, three boots in all, and
# then fails.
echo "harness: crashing the guest kernel on purpose"
echo 1 > /proc/sys/kernel/sysrq
echo c > /proc/sysrq-trigger
sleep 60
