#!/bin/bash
# The dom0 half of bench/xen_bench.py, run inside the nested Xen of guests/xen (run.sh
# boots Xen + dom0 under QEMU TCG and runs this script in dom0). It only measures and
# stamps; the host parses everything it leaves in $GLASS_OUT:
#   events.log        "EPOCHREALTIME what ..." lines: idle windows, floor runs, xenctx runs
#   console.stamped   the guest's console log, each line with its arrival time in dom0
#   glass.HZ.R.err    glass record's stderr, each line with its arrival time
#   floor.MODE.HZ.R   bench/xen_floor's result line
#   xenctx.vV.txt     the last xenctx output per vCPU
#   tsc.txt           Xen's "Detected N MHz processor" line (the guest's TSC rate)
#   glass.alone.B.R.err, floor.alone.997.R
#                     glass at 997 Hz with --max-stopped B (25, 100) and the floor, with dom0
#                     alone on its pCPU (guest vCPU 1 moved to pCPU 1), after the PV rounds
#   glass.pvh.HZ.R.err, floor.pvh.ctx.HZ.R
#                     the same for the unikernel's PVH build, after the PV rounds
# The host writes $GLASS_OUT/env first: GLASS, PV_ELF, HVM_ELF, FLOOR, SYMS, ROUNDS, IDLE (seconds
# per window without any tool), GLASS_SECONDS, XENCTX (runs per vCPU per round),
# FLOOR_SECONDS (per floor run, at most FLOOR_N samples).
# A round (odd rounds take the rates and the blocks the other way round):
#   floor bare 101 and 997 Hz, xenctx loop, [idle], floor ctx 101, glass 101, [idle],
#   floor ctx 997, glass 997, glass 997 --max-stopped 100, [idle]
# Placement as crates/glass/tests/xen_dom0.sh: dom0's one vCPU pinned to pCPU 0 with
# weight 4096; guest vCPU 0 alone on pCPU 1, guest vCPU 1 on pCPU 0.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/xen_dom0_common.sh"

cat >/run/uk.cfg <<EOF
name = "uk"
type = "pv"
kernel = "$PV_ELF"
memory = 32
vcpus = 2
cpus = ["1", "0"]
on_poweroff = "destroy"
on_crash = "preserve"
EOF
create_uk
echo "uk is domain $DOMID; $(rates) rate lines"
# From here every console line is stamped as dom0 sees it arrive (tail -F polls at 50 ms
# where inotify is missing).
tail -s 0.05 -n +1 -F "$LOG" 2>/dev/null | stamp >"$OUT/console.stamped" 2>/dev/null &
stamper=$!
sleep 1

idle() {
    event idle-start "$1"
    sleep "$IDLE"
    event idle-end "$1"
}

floor() { # MODE HZ ROUND
    event floor-start "$1" "$2" "$3"
    "$FLOOR" "$DOMID" "$1" "$FLOOR_N" "$2" "$FLOOR_SECONDS" >"$OUT/floor.$1.$2.$3" 2>&1
    event floor-end "$1" "$2" "$3" "rc=$?"
    cat "$OUT/floor.$1.$2.$3"
}

# xenctx, the naive tool: one process per stack trace (it pauses the domain itself).
xenctx_loop() { # ROUND
    local v i t0 rc
    event xenctx-start "$1"
    for v in 0 1; do
        for i in $(seq 1 "$XENCTX"); do
            t0=$EPOCHREALTIME
            xenctx -f -s "$SYMS" "$DOMID" "$v" >"$OUT/xenctx.v$v.txt" 2>&1
            rc=$?
            event xenctx "$v" "$i" "$t0" "rc=$rc"
        done
    done
    event xenctx-end "$1"
    echo "xenctx: $((2 * XENCTX)) runs; the last on vcpu0:"
    cat "$OUT/xenctx.v0.txt"
}

glass() { # HZ ROUND
    event glass-start "$1" "$2"
    "$GLASS" record --xen uk -F "$1" -d "$GLASS_SECONDS" --symbols "$PV_ELF" -o "/tmp/bench.$1.glass" 2>&1 \
        >/dev/null | stamp >"$OUT/glass.$1.$2.err"
    event glass-end "$1" "$2" "rc=${PIPESTATUS[0]}"
    cut -d' ' -f2- "$OUT/glass.$1.$2.err"
}

# glass at 997 Hz with no budget on the domain's stopped time (--max-stopped 100: every
# late tick taken at once), to show what the default budget (25%) trades for accuracy.
glass_unbudgeted() { # ROUND
    event glass-start 997max "$1"
    "$GLASS" record --xen uk -F 997 --max-stopped 100 -d "$GLASS_SECONDS" --symbols "$PV_ELF" \
        -o /tmp/bench.997max.glass 2>&1 >/dev/null | stamp >"$OUT/glass.997max.$1.err"
    event glass-end 997max "$1" "rc=${PIPESTATUS[0]}"
    cut -d' ' -f2- "$OUT/glass.997max.$1.err"
}

for round in $(seq 0 $((ROUNDS - 1))); do
    echo "== round $round"
    if [ $((round % 2)) = 0 ]; then
        floor bare 101 "$round"
        floor bare 997 "$round"
        xenctx_loop "$round"
        idle "$round.a"
        floor ctx 101 "$round"
        glass 101 "$round"
        idle "$round.b"
        floor ctx 997 "$round"
        glass 997 "$round"
        glass_unbudgeted "$round"
        idle "$round.c"
    else
        xenctx_loop "$round"
        floor bare 997 "$round"
        floor bare 101 "$round"
        idle "$round.a"
        floor ctx 997 "$round"
        glass 997 "$round"
        glass_unbudgeted "$round"
        idle "$round.b"
        floor ctx 101 "$round"
        glass 101 "$round"
        idle "$round.c"
    fi
done
# dom0 alone on its pCPU: guest vCPU 1 moved beside vCPU 0 on pCPU 1, so that no guest vCPU
# holds dom0's pCPU when its timer falls due (Xen's credit2 lets a running vCPU finish its
# rate limit, 1 ms, before a waking dom0 gets the pCPU back). The floor and glass at 997 Hz,
# with the default budget and with none.
xl vcpu-pin uk 1 1 >/dev/null 2>&1
for round in $(seq 0 $((ROUNDS - 1))); do
    event floor-start alone 997 "$round"
    "$FLOOR" "$DOMID" ctx "$FLOOR_N" 997 "$FLOOR_SECONDS" >"$OUT/floor.alone.997.$round" 2>&1
    event floor-end alone 997 "$round"
    cat "$OUT/floor.alone.997.$round"
    for budget in 25 100; do
        event glass-start alone "$budget" "$round"
        "$GLASS" record --xen uk -F 997 --max-stopped "$budget" -d "$GLASS_SECONDS" --symbols "$PV_ELF" \
            -o /tmp/bench.alone.glass 2>&1 >/dev/null | stamp >"$OUT/glass.alone.$budget.$round.err"
        event glass-end alone "$budget" "$round"
        cut -d' ' -f2- "$OUT/glass.alone.$budget.$round.err"
    done
done
sleep 0.5
kill "$stamper" 2>/dev/null
echo "rate lines: $(rates); guest state: $(xl list uk | awk 'NR == 2 { print $5 }')"
xl destroy uk

# The unikernel's PVH build, placed alike: the floor (xc_vcpu_getcontext serves PVH too)
# and glass at each rate, in every round.
cat >/run/pvh.cfg <<EOF
name = "pvh"
type = "pvh"
kernel = "$HVM_ELF"
memory = 32
vcpus = 2
cpus = ["1", "0"]
tsc_mode = "native"
on_poweroff = "destroy"
on_crash = "preserve"
EOF
xl create -q /run/pvh.cfg || { echo "xl create pvh failed"; exit 1; }
DOMID="$(xl domid pvh)"
PVH_LOG=/var/log/xen/console/guest-pvh.log
limit=$(($(date +%s) + 120))
while [ "$(tr -d '\r' <"$PVH_LOG" 2>/dev/null | grep -c '^rate ')" -lt 1 ]; do
    [ "$(date +%s)" -lt "$limit" ] || { echo "the PVH unikernel printed no rate line"; cat "$PVH_LOG"; exit 1; }
    sleep 0.2
done
echo "pvh is domain $DOMID"
for round in $(seq 0 $((ROUNDS - 1))); do
    for hz in 101 997; do
        event floor-start pvh "$hz" "$round"
        "$FLOOR" "$DOMID" ctx "$FLOOR_N" "$hz" "$FLOOR_SECONDS" >"$OUT/floor.pvh.ctx.$hz.$round" 2>&1
        event floor-end pvh "$hz" "$round"
        cat "$OUT/floor.pvh.ctx.$hz.$round"
        event glass-start pvh "$hz" "$round"
        "$GLASS" record --xen pvh -F "$hz" -d "$GLASS_SECONDS" --symbols "$HVM_ELF" -o "/tmp/bench.pvh.glass" 2>&1 \
            >/dev/null | stamp >"$OUT/glass.pvh.$hz.$round.err"
        event glass-end pvh "$hz" "$round"
        cut -d' ' -f2- "$OUT/glass.pvh.$hz.$round.err"
    done
done
xl destroy pvh
event done
exit 0
