#!/bin/bash
# glass trace --xen in the nested Xen (called by xen_dom0.sh; the host half is
# crates/glass/tests/xen.rs). The demo unikernel's PVH build (guests/xenpv, linked in the
# top 2 GiB, no room at the top-level entry: glass's region hangs from its own table),
# 2 vCPUs both calling checkpoint, traced from dom0 and left as found. It is the
# exact-count build ($EXACT_ELF: idle 10 s, 200 rounds, idle 3 s, then rounds forever).
# In $GLASS_OUT:
#   trace.exact.glass, .err, .rc, .calls   attached in the first idle, detached in the
#                                       second: the 200 rounds whole
#   trace.exact.late                    what went wrong with that timing, if anything
#   trace.N.glass, trace.N.err, trace.N.rc, trace.N.calls   two traces, one after the other
#                                       (N = 1, 2; both reuse glass's region)
#   trace.kill.STEP.err, .rc            glass SIGKILLed (tracing) or stopped past the stop
#                                       bound (attach-stopped, detach-stopped) at STEP
#   trace.text.before, trace.text.after.WHEN   the guest's own hash of its .text (text
#                                       fnv=), before the first trace and after each
#                                       trace or death of glass (WHEN: exact, N,
#                                       kill.STEP)
#   trace.text.patched                  the same while glass traces (it must differ)
#   trace.console                       the guest's console at the end
#   trace.bad.NAME.txt                  bad input: exit code, then stderr (NAME second: a
#                                       second glass while one traces the domain)
set -uo pipefail
source "$GLASS_OUT/env"
OUT="$GLASS_OUT"
# A pause under nested TCG takes milliseconds (see xen_dom0.sh): a bound of a second.
export GLASS_STOP_BOUND_MS=1000
export PATH="/usr/lib/xen-4.17/bin:$PATH"
source "$(dirname "${BASH_SOURCE[0]}")/xen_dom0_lib.sh"

# The guest's own hash of its .text (the exact-count build prints `text fnv=HASH`, FNV-1a
# of .text read through its page tables, in its first idle and before each rate line):
# the last one once $2 more (2 unless given; at least one in all) were printed, so that
# it was taken after what came before.
# (xenctx -m read the same words from dom0 in 3-4 s a call; this takes a split line.)
text_hash() {
    local limit=$(($(date +%s) + 60)) want=$(($(said "text fnv=") + ${2:-2}))
    [ "$want" -ge 1 ] || want=1
    until [ "$(said "text fnv=")" -ge "$want" ]; do
        [ "$(date +%s)" -lt "$limit" ] || { echo "no new text hash"; return; }
        sleep 0.1
    done
    tr -d '\r' <"$(console "$1")" | sed -n 's/^text fnv=//p' | tail -n1
}

echo "== glass trace --xen: the PVH demo unikernel"
cat >/run/tr.cfg <<EOF2
name = "tr"
type = "pvh"
kernel = "$EXACT_ELF"
memory = 64
vcpus = 2
cpus = ["1", "1"]
tsc_mode = "native"
on_poweroff = "destroy"
on_crash = "preserve"
EOF2
xl create -q /run/tr.cfg || { echo "xl create tr failed"; exit 1; }
said() { tr -d '\r' <"$(console tr)" 2>/dev/null | grep -c "^$1" || true; }
# Waits up to $2 s for the console line $1.
wait_said() {
    local limit=$(($(date +%s) + $2))
    until [ "$(said "$1")" -gt 0 ]; do
        [ "$(date +%s)" -lt "$limit" ] || return 1
        sleep 0.2
    done
}
wait_said "idle before the work" 120 || { echo "tr did not boot"; cat "$(console tr)"; exit 1; }
# The hash printed with "idle before the work".
text_hash tr 0 >"$OUT/trace.text.before"
echo "text before: $(cat "$OUT/trace.text.before")"
functions="dispatch,alpha,beta,gamma,descend,checkpoint"
after() {
    wait_lines tr 60 1 && progressed=yes || progressed=no
    echo "$(text_hash tr 1) at $(date +%T) state=$(xl list tr 2>/dev/null | awk 'NR == 2 { print $5 }') progressed=$progressed ($1)" >"$OUT/trace.text.after.$1"
    cat "$OUT/trace.text.after.$1"
}

# The exact count: attached while the guest idles before its first round, detached
# while it idles after round 200 (the exact build: START_IDLE_MS, EXACT_ROUNDS).
"$GLASS" trace --xen tr --symbols "$EXACT_ELF" -f "$functions" -d 300 -o "$OUT/trace.exact.glass" 2>"$OUT/trace.exact.err" &
pid=$!
limit=$(($(date +%s) + 60))
until grep -q "attached to" "$OUT/trace.exact.err" 2>/dev/null; do
    [ "$(date +%s)" -lt "$limit" ] && kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
[ "$(said "work begins")" -eq 0 ] || echo "glass attached after the work began" >>"$OUT/trace.exact.late"
wait_said "exact rounds=" 120 || echo "the guest never finished its exact rounds" >>"$OUT/trace.exact.late"
kill -INT "$pid"
wait "$pid"
echo "$?" >"$OUT/trace.exact.rc"
[ "$(said "work goes on")" -eq 0 ] || echo "glass detached after the work went on" >>"$OUT/trace.exact.late"
cat "$OUT/trace.exact.err" "$OUT/trace.exact.late" 2>/dev/null
"$GLASS" report "$OUT/trace.exact.glass" --format calls >"$OUT/trace.exact.calls" 2>&1
cat "$OUT/trace.exact.calls"
wait_said "work goes on" 60 && wait_lines tr 120 1
after exact

for n in 1 2; do
    "$GLASS" trace --xen tr --symbols "$EXACT_ELF" -f "$functions" -d 2 -o "$OUT/trace.$n.glass" 2>"$OUT/trace.$n.err"
    echo "$?" >"$OUT/trace.$n.rc"
    cat "$OUT/trace.$n.err"
    "$GLASS" report "$OUT/trace.$n.glass" --format calls >"$OUT/trace.$n.calls" 2>&1
    cat "$OUT/trace.$n.calls"
    after "$n"
done
for hook in guest-tracing guest-attach-stopped guest-attach-patched guest-detach-stopped; do
    GLASS_TEST_STOP_AT=$hook "$GLASS" trace --xen tr --symbols "$EXACT_ELF" -f "$functions" -d 2 -o "/run/kill.glass" 2>"$OUT/trace.kill.$hook.err" &
    pid=$!
    limit=$(($(date +%s) + 60))
    until grep -q "test hook: stopped at $hook" "$OUT/trace.kill.$hook.err" 2>/dev/null; do
        [ "$(date +%s)" -lt "$limit" ] || break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    # At a stop inside a pause the guardian kills glass at the stop bound; elsewhere
    # the test does.
    case $hook in guest-tracing | guest-attach-patched) kill -KILL "$pid" ;; esac
    wait "$pid"
    echo "$?" >"$OUT/trace.kill.$hook.rc"
    wait_guardian 10
    cat "$OUT/trace.kill.$hook.err"
    after "kill.$hook"
done
echo "== trace bad input"
bad() {
    local name=$1; shift
    "$@" >/dev/null 2>"$OUT/trace.bad.$name.err"
    echo "$?" >"$OUT/trace.bad.$name.txt"
    cat "$OUT/trace.bad.$name.err" >>"$OUT/trace.bad.$name.txt"
    echo "$name: $(tr '\n' ' ' <"$OUT/trace.bad.$name.txt")"
}
bad no-function "$GLASS" trace --xen tr --symbols "$EXACT_ELF" -f no_such_function -d 1 -o /run/bad.glass
bad wrong-symbols "$GLASS" trace --xen tr --symbols "$PV_ELF" -f alpha -d 1 -o /run/bad.glass
# A second glass while one traces the domain.
"$GLASS" trace --xen tr --symbols "$EXACT_ELF" -f alpha -d 20 -o /run/first.glass 2>"$OUT/trace.first.err" &
first=$!
limit=$(($(date +%s) + 60))
until grep -q "attached to" "$OUT/trace.first.err" 2>/dev/null; do
    [ "$(date +%s)" -lt "$limit" ] && kill -0 "$first" 2>/dev/null || break
    sleep 0.2
done
bad second "$GLASS" trace --xen tr --symbols "$EXACT_ELF" -f beta -d 1 -o /run/bad.glass
# The hash sees a patch: the guest's text, with alpha patched, hashes otherwise.
text_hash tr >"$OUT/trace.text.patched"
kill -INT "$first"
wait "$first"
echo "first: rc=$?"
tr -d '\r' <"$(console tr)" >"$OUT/trace.console"
xl destroy tr
