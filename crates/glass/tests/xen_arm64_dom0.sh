# The dom0 half of crates/glass/tests/xen_arm64.rs, run (busybox sh) inside the nested Xen
# on ARM64 of guests/xen-arm64 (run.sh boots it under qemu-system-aarch64 and runs this in
# dom0). It drives the aarch64 build of glass against the demo unikernel as a 2-vCPU domU
# and leaves in $GLASS_OUT what the Rust tests check:
#   nofp.glass, nofp.err, nofp.rc, nofp.console{.before,}   the CFI-only build, 30 s
#   fp.glass, fp.err, fp.rc, fp.console{.before,}           the frame-record build, 20 s
#   endings.txt, end.*.glass, end.*.err                     SIGINT/SIGTERM/SIGKILL of glass
#   trace.*                                                 glass trace --xen (see below)
# The host writes $GLASS_OUT/env first (GLASS: the aarch64 binary, KIT).
# Placement (Xen has 2 pCPUs): dom0's vCPU on pCPU 0 (run.sh pins it) with credit weight
# 4096, domU vCPU 0 alone on pCPU 1, vCPU 1 on pCPU 0 (as bench/xen_dom0.sh places the PV
# guest).
. "$GLASS_OUT/env"
OUT="$GLASS_OUT"
DEMO="$GLASS_KIT/demo-domu.sh"
# A hypercall under nested TCG costs 10-100x its native time, and arm64 on an x86 host
# more: on a loaded host one stop took 1.2 s (guests/xen's tests give 1000 ms).
export GLASS_STOP_BOUND_MS=5000
# Xen 4.17 schedules with credit2 by default, where `xl sched-credit` fails (it did,
# silently, until 2026-11-28: dom0 ran at the default weight, 256).
xl sched-credit2 -d 0 -w 4096 >/dev/null 2>&1 || xl sched-credit -d 0 -w 4096 >/dev/null 2>&1 || true

console() { cat /var/log/xen/console/guest-"$1"-vuart0.log 2>/dev/null | tr -d '\r'; }
lines() { console "$1" | grep -c '^split '; }
state() { xl list "$1" 2>/dev/null | awk 'NR == 2 { print $5 }'; }
# wait_lines NAME SECONDS N: until NAME printed N more split lines than it had.
wait_lines() {
    want=$(($(lines "$1") + $3))
    limit=$(($(date +%s) + $2))
    while [ "$(lines "$1")" -lt "$want" ]; do
        [ "$(date +%s)" -lt "$limit" ] || return 1
        sleep 0.5
    done
}

"$GLASS" --version >"$OUT/version.txt" 2>&1 || { echo "the aarch64 glass does not run in dom0:"; cat "$OUT/version.txt"; exit 1; }
cat "$OUT/version.txt"

for variant in nofp fp; do
    name=uk$variant
    echo "== $variant build as domU $name"
    domid=$(sh "$DEMO" -f "$variant" -n 1 -t 120 "$name") || { echo "domU $name did not start"; exit 1; }
    # vCPU 0 (the split) alone on pCPU 1; vCPU 1 (delta) beside dom0 on pCPU 0, where
    # dom0's weight gives glass the CPU when it wants it. Sharing pCPU 1, vCPU 0 lost
    # 30 ms timeslices to vCPU 1 in the middle of whichever function it was in, which
    # made the guest's own split of a few seconds noisy.
    xl vcpu-pin "$name" 0 1 >/dev/null 2>&1
    xl vcpu-pin "$name" 1 0 >/dev/null 2>&1
    wait_lines "$name" 60 1 || { echo "$name printed no second split line"; console "$name"; exit 1; }
    seconds=30
    [ $variant = fp ] && seconds=20
    console "$name" >"$OUT/$variant.console.before"
    # At 53 Hz: under nested TCG a stop takes 3-40 ms, and vCPU 0 shares pCPU 1 with
    # vCPU 1, so at a higher rate it barely runs between two samples and they land in
    # the same function, far from independent draws (at 199 Hz on a loaded host beta read
    # 51% against the guest's 34% over 167 samples). The gap a deadline leaves after each
    # unpause decorrelates them.
    "$GLASS" record --xen "$name" -F 53 -d $seconds --symbols "$GLASS_KIT/uk-xen-$variant.elf" \
        -o "$OUT/$variant.glass" 2>"$OUT/$variant.err"
    echo "$?" >"$OUT/$variant.rc"
    # The guest prints its split every 5 rounds: one more line closes the window.
    wait_lines "$name" 60 1
    console "$name" >"$OUT/$variant.console"
    cat "$OUT/$variant.err"
    [ $variant = fp ] || xl destroy "$name"
done

echo "== endings (domU ukfp) ($(date +%T))"
: >"$OUT/endings.txt"
for signal in INT TERM KILL KILL KILL; do
    n=$(ls "$OUT"/end.*.err 2>/dev/null | wc -l)
    "$GLASS" record --xen ukfp -F 499 --symbols "$GLASS_KIT/uk-xen-fp.elf" -o "$OUT/end.$n.$signal.glass" \
        2>"$OUT/end.$n.$signal.err" &
    pid=$!
    if [ "$signal" != KILL ]; then
        # Sampling first (glass prints its unwind tables just before the first pause; its
        # start-up in this dom0 took over 2 s on a loaded host).
        for _ in $(seq 1 300); do
            grep -q 'unwind tables of' "$OUT/end.$n.$signal.err" 2>/dev/null && break
            sleep 0.1
        done
    fi
    # INT and TERM a second into sampling; KILLs at spread moments (2, 3 and 4 s
    # after the start: while starting, and while sampling).
    if [ "$signal" = KILL ]; then sleep "$n"; else sleep 1; fi
    kill -"$signal" "$pid"
    wait "$pid"
    rc=$?
    sleep 1
    st=$(state ukfp)
    wait_lines ukfp 60 1 && progressed=yes || progressed=no
    echo "$signal n=$n rc=$rc state=$st progressed=$progressed" >>"$OUT/endings.txt"
done
cat "$OUT/endings.txt"
xl destroy ukfp

# glass trace --xen: the exact-count build (kit.sh's uk-xen-exact: idle 12 s, 20 rounds,
# idle 4 s, then rounds forever; a "text fnv=" hash of its own .text with every split
# line) as domU tr, traced from dom0:
#   trace.exact.glass, .err, .rc, .calls   attached in the first idle, detached in the
#                                       second: the 20 rounds whole
#   trace.exact.late                    what went wrong with that timing, if anything
#   trace.kill.err, .rc                 glass SIGKILLed while it traces (its guardian
#                                       puts the code back)
#   trace.again.glass, .err, .rc, .calls   a trace of 3 s in the earlier traces' region
#   trace.text.after.WHEN               the guest's hash of its .text after each trace
#                                       (WHEN: exact, kill, again)
#   trace.console                       the guest's console at the end (its hashes)
echo "== glass trace --xen: the exact-count build as domU tr ($(date +%T))"
sh "$DEMO" -f exact -n 0 -t 120 tr >/dev/null || { echo "domU tr did not start"; exit 1; }
xl vcpu-pin tr 0 1 >/dev/null 2>&1
xl vcpu-pin tr 1 0 >/dev/null 2>&1
said() { console tr | grep -c "^$1"; }
# wait_said LINE SECONDS: until the guest printed a line starting with LINE.
wait_said() {
    limit=$(($(date +%s) + $2))
    until [ "$(said "$1")" -gt 0 ]; do
        [ "$(date +%s)" -lt "$limit" ] || return 1
        sleep 0.2
    done
}
# text_after WHEN: waits (up to 120 s) until the guest printed two more hashes of its
# .text than it had (the first may have been under way while glass put the code back),
# and writes the last to trace.text.after.WHEN.
text_after() {
    want=$(($(said "text fnv=") + 2))
    limit=$(($(date +%s) + 120))
    until [ "$(said "text fnv=")" -ge "$want" ]; do
        [ "$(date +%s)" -lt "$limit" ] || break
        sleep 0.5
    done
    console tr | grep '^text fnv=' | tail -1 | cut -d= -f2 >"$OUT/trace.text.after.$1"
    echo "text after $1: $(cat "$OUT/trace.text.after.$1")"
}
wait_said "idle before the work" 120 || { echo "tr did not boot"; console tr; exit 1; }
functions="dispatch,alpha,beta,gamma,descend,spin_block"
"$GLASS" trace --xen tr --symbols "$GLASS_KIT/uk-xen-exact.elf" -f "$functions" -d 300 \
    -o "$OUT/trace.exact.glass" 2>"$OUT/trace.exact.err" &
pid=$!
limit=$(($(date +%s) + 60))
until grep -q "attached to" "$OUT/trace.exact.err" 2>/dev/null; do
    [ "$(date +%s)" -lt "$limit" ] && kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
[ "$(said "work begins")" -eq 0 ] || echo "glass attached after the work began" >>"$OUT/trace.exact.late"
wait_said "exact rounds=" 240 || echo "the guest never finished its exact rounds" >>"$OUT/trace.exact.late"
kill -INT "$pid"
wait "$pid"
echo "$?" >"$OUT/trace.exact.rc"
[ "$(said "work goes on")" -eq 0 ] || echo "glass detached after the work went on" >>"$OUT/trace.exact.late"
cat "$OUT/trace.exact.err" "$OUT/trace.exact.late" 2>/dev/null
"$GLASS" report "$OUT/trace.exact.glass" --format calls >"$OUT/trace.exact.calls" 2>&1
cat "$OUT/trace.exact.calls"
wait_said "work goes on" 60
text_after exact
echo "== glass trace --xen killed while it traces ($(date +%T))"
GLASS_TEST_STOP_AT=guest-tracing "$GLASS" trace --xen tr --symbols "$GLASS_KIT/uk-xen-exact.elf" \
    -f "$functions" -d 60 -o /run/kill.glass 2>"$OUT/trace.kill.err" &
pid=$!
limit=$(($(date +%s) + 60))
until grep -q "test hook: stopped at guest-tracing" "$OUT/trace.kill.err" 2>/dev/null; do
    [ "$(date +%s)" -lt "$limit" ] && kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
kill -KILL "$pid"
wait "$pid"
echo "$?" >"$OUT/trace.kill.rc"
limit=$(($(date +%s) + 30))
until grep -q "its guardian" "$OUT/trace.kill.err" 2>/dev/null; do
    [ "$(date +%s)" -lt "$limit" ] || break
    sleep 0.2
done
cat "$OUT/trace.kill.err"
text_after kill
echo "== glass trace --xen again, in the region of the traces before ($(date +%T))"
"$GLASS" trace --xen tr --symbols "$GLASS_KIT/uk-xen-exact.elf" -f "$functions" -d 3 \
    -o "$OUT/trace.again.glass" 2>"$OUT/trace.again.err"
echo "$?" >"$OUT/trace.again.rc"
cat "$OUT/trace.again.err"
"$GLASS" report "$OUT/trace.again.glass" --format calls >"$OUT/trace.again.calls" 2>&1
text_after again
console tr >"$OUT/trace.console"
grep '^text fnv=' "$OUT/trace.console"
xl list
exit 0
