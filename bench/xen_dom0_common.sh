# Sourced by bench/xen_dom0.sh and bench/xen_versus_dom0.sh in the nested dom0 (guests/xen's
# run.sh runs them there): the run's env file, Xen's tools, glass's stop bound, dom0's
# placement, the stamping helpers, and the unikernel's creation (each script writes its
# own /run/uk.cfg first).
source "$GLASS_OUT/env"
OUT="$GLASS_OUT"
export PATH="/usr/lib/xen-4.17/bin:$PATH"
LOG=/var/log/xen/console/guest-uk.log
# As in crates/glass/tests/xen_dom0.sh: under nested TCG on a loaded host one pause can
# take hundreds of ms (Xen waits for the guest's vCPUs to be descheduled), which the
# default stop bound (50 ms) would end as a stalled glass.
export GLASS_STOP_BOUND_MS=1000

# Xen 4.17 schedules with credit2 by default, where `xl sched-credit` fails (it did,
# silently, until 2026-11-28: dom0 ran at the default weight, 256).
xl sched-credit2 -d 0 -w 4096 >/dev/null 2>&1 || xl sched-credit -d 0 -w 4096 >/dev/null 2>&1 || true
xl vcpu-pin Domain-0 all 0 >/dev/null 2>&1 || true

event() { echo "$EPOCHREALTIME $*" >>"$OUT/events.log"; }
# Stamps each line of stdin with its arrival time.
stamp() {
    local line
    while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "${line%$'\r'}"; done
}
rates() { tr -d '\r' <"$LOG" 2>/dev/null | grep -c '^rate ' || true; }

: >"$OUT/events.log"
xl dmesg | grep -m1 'Detected .* MHz processor' >"$OUT/tsc.txt"

# Creates domain uk from /run/uk.cfg and waits for its first two rate lines; sets DOMID.
create_uk() {
    event create
    xl create -q /run/uk.cfg || { echo "xl create failed"; exit 1; }
    DOMID="$(xl domid uk)"
    event created "$DOMID"
    local limit=$(($(date +%s) + 120))
    while [ "$(rates)" -lt 2 ]; do
        [ "$(date +%s)" -lt "$limit" ] || { echo "the unikernel printed no rate lines"; cat "$LOG"; exit 1; }
        sleep 0.2
    done
}
