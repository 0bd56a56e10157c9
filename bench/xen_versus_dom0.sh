#!/bin/bash
# The dom0 half of bench/xen_versus.py (glass against the uniprof-like reference,
# bench/xen_reference.c), run inside the nested Xen of guests/xen by guests/xen/run.sh. It
# only measures and stamps; the host parses what it leaves in $GLASS_OUT:
#   events.log          "EPOCHREALTIME what ..." lines: each window (idle, glass, ref) opened
#                       and closed
#   console.stamped     the guest's console, each line with its arrival time in dom0
#   tsc.txt             Xen's "Detected N MHz processor" line (the guest's TSC rate)
#   glass.RUN.R.err     glass record's stderr, each line stamped; RUN is 101, 997 or 997max
#                       (997 Hz with --max-stopped 100), or 101wall or 997maxwall (the same
#                       on --clock wall, the reference's clock)
#   glass.RUN.R.glass   its recording (the host reports it for the split)
#   ref.HZ.R.out        xen_reference's summary line; ref.HZ.R.traces its traces;
#                       ref.HZ.R.err its stderr
# The host writes $GLASS_OUT/env first: GLASS, PV_ELF, REF, ROUNDS, IDLE (seconds per window
# with no tool), RUN_SECONDS (per run; not SECONDS, which bash counts up by itself).
# The set-up of issue 34: the PV demo unikernel with one vCPU (kernel.c's vCPU1 start
# fails and it goes on alone), that vCPU alone on pCPU 1; dom0's one vCPU pinned to pCPU 0
# with credit2 weight 4096. A round (odd rounds take each pair and the 997 Hz runs the
# other way round, so that neither tool always follows the other):
#   [idle] ref 101, glass 101, glass 101wall [idle] ref 997, glass 997, glass 997max,
#   glass 997maxwall [idle]
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/xen_dom0_common.sh"

cat >/run/uk.cfg <<EOF
name = "uk"
type = "pv"
kernel = "$PV_ELF"
memory = 32
vcpus = 1
cpus = "1"
on_poweroff = "destroy"
on_crash = "preserve"
EOF
create_uk
echo "uk is domain $DOMID; $(rates) rate lines; its vCPUs:"
xl vcpu-list uk
tr -d '\r' <"$LOG" | grep -m1 '^vcpu1'
tail -s 0.05 -n +1 -F "$LOG" 2>/dev/null | stamp >"$OUT/console.stamped" 2>/dev/null &
stamper=$!
sleep 1

idle() {
    event idle-start "$1"
    sleep "$IDLE"
    event idle-end "$1"
}

glass() { # RUN ROUND  (RUN: 101, 997, 997max; with "wall" after it, on --clock wall)
    local hz="${1%%[a-z]*}" extra=()
    case "$1" in *max*) extra+=(--max-stopped 100) ;; esac
    case "$1" in *wall) extra+=(--clock wall) ;; esac
    event glass-start "$1" "$2"
    "$GLASS" record --xen uk -F "$hz" "${extra[@]}" -d "$RUN_SECONDS" --symbols "$PV_ELF" \
        -o "$OUT/glass.$1.$2.glass" 2>&1 >/dev/null | stamp >"$OUT/glass.$1.$2.err"
    event glass-end "$1" "$2" "rc=${PIPESTATUS[0]}"
    cut -d' ' -f2- "$OUT/glass.$1.$2.err" | grep -v '^glass: warning' | tail -n 12
}

ref() { # HZ ROUND
    event ref-start "$1" "$2"
    "$REF" "$DOMID" "$1" "$RUN_SECONDS" "$OUT/ref.$1.$2.traces" >"$OUT/ref.$1.$2.out" 2>"$OUT/ref.$1.$2.err"
    event ref-end "$1" "$2" "rc=$?"
    cat "$OUT/ref.$1.$2.out" "$OUT/ref.$1.$2.err"
}

for round in $(seq 0 $((ROUNDS - 1))); do
    echo "== round $round"
    idle "$round.a"
    if [ $((round % 2)) = 0 ]; then
        ref 101 "$round"
        glass 101 "$round"
        glass 101wall "$round"
        idle "$round.b"
        ref 997 "$round"
        glass 997 "$round"
        glass 997max "$round"
        glass 997maxwall "$round"
    else
        glass 101wall "$round"
        glass 101 "$round"
        ref 101 "$round"
        idle "$round.b"
        glass 997maxwall "$round"
        glass 997max "$round"
        glass 997 "$round"
        ref 997 "$round"
    fi
    idle "$round.c"
done
sleep 0.5
kill "$stamper" 2>/dev/null
echo "rate lines: $(rates); guest state: $(xl list uk | awk 'NR == 2 { print $5 }')"
xl destroy uk
event done
exit 0
