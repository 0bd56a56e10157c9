# The dom0 half of bench/xen_arm64_bench.py, run (busybox sh) in the nested Xen on ARM64 of
# guests/xen-arm64. The domU is guests/aarch64's unikernel (uk-xen-nofp, 2 vCPUs, both on
# pCPU 1; dom0's one vCPU alone on pCPU 0 with credit weight 4096). With guest vCPU 1
# beside dom0 (the test's placement, for the guest's own split), the unpause woke it with
# a boost onto dom0's pCPU: glass's stop p50 read 17-54 ms around a 0.3-0.4 ms multicall,
# and the time dom0 lost inside the hypercall counted as glass's system time.
# Per round and rate: a window of the guest alone, then glass record --xen at that rate for
# the same time, glass's CPU time in dom0 taken by busybox time. Leaves in $GLASS_OUT:
#   alone.R.F.console / glass.R.F.console   the guest's vUART lines stamped with dom0's clock
#   glass.R.F.err, glass.R.F.time            glass's summary; "user sys elapsed" seconds
# $GLASS_OUT/env gives GLASS, SECONDS_PER_WINDOW, ROUNDS, RATES.
. "$GLASS_OUT/env"
OUT="$GLASS_OUT"
export GLASS_STOP_BOUND_MS=5000
LOG=/var/log/xen/console/guest-uk-vuart0.log
domid=$(sh "$GLASS_KIT/demo-domu.sh" -f nofp -n 1 -t 180 uk) || { echo "the domU did not start"; exit 1; }
xl vcpu-pin uk all 1 >/dev/null 2>&1
# Xen 4.17 schedules with credit2 by default, where `xl sched-credit` fails (it did,
# silently, until 2026-11-28: dom0 ran at the default weight, 256).
xl sched-credit2 -d 0 -w 4096 >/dev/null 2>&1 || xl sched-credit -d 0 -w 4096 >/dev/null 2>&1 || true
sleep 5
# stamp FROM TO: the vUART lines that arrived while the window ran, each with dom0's
# uptime when seen (polled every 0.2 s).
window() {
    name=$1
    shift
    seen=$(wc -l <"$LOG")
    : >"$OUT/$name.console"
    "$@" &
    pid=$!
    while kill -0 $pid 2>/dev/null; do
        now=$(cut -d' ' -f1 /proc/uptime)
        total=$(wc -l <"$LOG")
        if [ "$total" -gt "$seen" ]; then
            tail -n $((total - seen)) "$LOG" | tr -d '\r' | sed "s/^/$now /" >>"$OUT/$name.console"
            seen=$total
        fi
        sleep 0.2
    done
    wait $pid
}
for round in $(seq 1 "$ROUNDS"); do
    for rate in $RATES; do
        echo "== round $round, $rate Hz"
        window "alone.$round.$rate" sleep "$SECONDS_PER_WINDOW"
        window "glass.$round.$rate" busybox time -f "%U %S %e" -o "$OUT/glass.$round.$rate.time" \
            "$GLASS" record --xen uk -F "$rate" -d "$SECONDS_PER_WINDOW" \
            --symbols "$GLASS_KIT/uk-xen-nofp.elf" -o "/tmp/glass.$round.$rate.glass" 2>"$OUT/glass.$round.$rate.err"
        cat "$OUT/glass.$round.$rate.err" "$OUT/glass.$round.$rate.time"
    done
done
xl destroy uk
exit 0
