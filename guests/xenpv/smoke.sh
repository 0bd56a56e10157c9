#!/bin/bash
# smoke.sh [ELF] — the dom0 smoke test of the Xen PV demo guest (run it inside the kit's
# dom0 with guests/xen/run.sh, not on the host). Builds nothing: the host builds uk-pv.elf
# first, e.g.
#   guests/xenpv/build.sh OUT && guests/xen/run.sh KIT guests/xenpv/smoke.sh OUT
# ELF defaults to $GLASS_OUT/uk-pv.elf, then $GLASS_KIT/uk-pv.elf (run.sh's dom0 exports
# both; the host's root is visible read-only at the same paths).
# Creates the PV domain (vcpus=2, memory=32, vCPUs pinned: see below), waits for two `split`
# lines in its console log (xenconsoled: /var/log/xen/console/guest-NAME.log), prints them,
# `xl vcpu-list`, one xenctx per vCPU (its rip named with addr2line) and the console, and
# destroys the domain. Exits 0 when the domain booted, printed 2 split lines within 5 points
# of 60/30/10, has 2 vCPUs and vCPU1 ran delta.
# Env: XENPV_NAME (glass-pv), XENPV_TIMEOUT (180 s), XENPV_LINES (2 split lines),
# XENPV_MEMORY (32 MB), XENPV_CPUS ("1 0"), XENPV_DOM0_CPUS ("0"), XENPV_KEEP=1 leaves the
# domain running.
set -euo pipefail
export PATH="/usr/lib/xen-4.17/bin:$PATH"
ELF="${1:-}"
if [ -z "$ELF" ]; then
    for c in "${GLASS_OUT:-}/uk-pv.elf" "${GLASS_KIT:-}/uk-pv.elf"; do
        if [ -s "$c" ]; then ELF="$c"; break; fi
    done
fi
[ -n "$ELF" ] && [ -s "$ELF" ] || { echo "smoke: no uk-pv.elf (give its path, or build it into \$GLASS_OUT)" >&2; exit 2; }
NAME="${XENPV_NAME:-glass-pv}"
TIMEOUT="${XENPV_TIMEOUT:-180}"
LINES="${XENPV_LINES:-2}"
LOG="/var/log/xen/console/guest-$NAME.log"
CFG="/run/glass/$NAME.cfg"
SYMS="/run/glass/$NAME.syms"
mkdir -p /run/glass
cat >"$CFG" <<EOF
name = "$NAME"
type = "pv"
kernel = "$ELF"
memory = ${XENPV_MEMORY:-32}
vcpus = 2
on_poweroff = "destroy"
on_crash = "preserve"
EOF
# Pinning (the kit's Xen has 2 pCPUs): vCPU0 alone on pCPU1, vCPU1 (delta) and dom0 on
# pCPU0. Unpinned, the credit scheduler often puts both vCPUs on one pCPU; vCPU0, woken
# with a boost, then loses the pCPU to vCPU1 about one accounting tick later, which is
# mostly in beta, and the guest's wall-clock (TSC) split reads ~54/36/10 instead of
# 59/30.5/10.5. XENPV_CPUS="" / XENPV_DOM0_CPUS="" turn it off.
CPUS="${XENPV_CPUS-1 0}" DOM0_CPUS="${XENPV_DOM0_CPUS-0}"
if [ -n "$CPUS" ]; then
    echo "cpus = [$(for c in $CPUS; do printf '"%s",' "$c"; done | sed 's/,$//')]" >>"$CFG"
fi
[ -z "$DOM0_CPUS" ] || xl vcpu-pin Domain-0 all "$DOM0_CPUS"
nm -n "$ELF" | grep -v " [aA] " >"$SYMS"     # System.map-style table for xenctx
rm -f "$LOG"
ms() { date +%s%3N; }
secs() { printf '%d.%d' $(($1 / 1000)) $(($1 % 1000 / 100)); }
splits() { [ -f "$LOG" ] && tr -d '\r' <"$LOG" | grep '^split alpha=' || true; }

echo "== xl create ($ELF)"
t0=$(ms)
xl create -q "$CFG"
domid="$(xl domid "$NAME")"
echo "== $NAME is domain $domid"
first="" rc=0 polls=0
while :; do
    if [ -z "$first" ] && [ -s "$LOG" ]; then
        first=$(($(ms) - t0))
        echo "== first console output $(secs $first) s after xl create"
    fi
    [ "$(splits | wc -l)" -ge "$LINES" ] && break
    # xl costs dom0 a lot of CPU under TCG (and takes it from the guest): every 2 s only
    if [ $((++polls % 10)) = 0 ]; then
        state="$(xl list "$domid" 2>/dev/null | awk 'NR == 2 { print $5 }')"
        if [ -z "$state" ] || [[ "$state" == *c* ]] || [[ "$state" == *s* ]]; then
            echo "FAIL: domain $domid is ${state:-gone} before $LINES split lines"
            rc=1
            break
        fi
    fi
    if [ $(($(ms) - t0)) -gt $((TIMEOUT * 1000)) ]; then
        echo "FAIL: no $LINES split lines after $TIMEOUT s"
        rc=1
        break
    fi
    sleep 0.2
done
t1=$(($(ms) - t0))
[ $rc = 0 ] && echo "== $LINES split lines $(secs $t1) s after xl create"
splits | head -n "$LINES"

echo "== xl list"
xl list
echo "== xl vcpu-list $NAME"
vcpus="$(xl vcpu-list "$NAME" 2>&1 || true)"
echo "$vcpus"
for v in 0 1; do
    echo "== xenctx $domid $v"
    ctx="$(timeout 30 xenctx -s "$SYMS" "$domid" "$v" 2>&1)" || echo "(xenctx exited $?)"
    grep -vE '^(Code|[0-9a-f]{2} )' <<<"$ctx" || true
    rip="$(sed -n 's/^rip: \([0-9a-f]*\).*/\1/p' <<<"$ctx")"
    # the function: the last symbol at or below rip (fixed-width hex compares as text)
    [ -z "$rip" ] || echo "vCPU$v rip 0x$rip is in $(awk -v r="$rip" '$2 ~ /^[tT]$/ && $1 <= r { f = $3 } END { print f }' "$SYMS")"
done
echo "== console ($LOG, first 16 of $(wc -l <"$LOG" 2>/dev/null || echo 0) lines)"
tr -d '\r' <"$LOG" 2>/dev/null | head -n 16 || true
if [ $rc != 0 ]; then
    echo "== xl dmesg (tail)"
    xl dmesg | tail -n 60 || true
fi
if [ "${XENPV_KEEP:-0}" != 1 ]; then
    xl destroy "$domid" 2>/dev/null || true
    echo "== destroyed $domid"
    [ -z "$DOM0_CPUS" ] || xl vcpu-pin Domain-0 all all
fi

# checks
[ $rc = 0 ] || exit 1
last="$(splits | sed -n "${LINES}p")"
for kv in alpha:60 beta:30 gamma:10; do
    k=${kv%%:*} want=${kv#*:}
    got="$(sed -n "s/.* $k=\([0-9.]*\)%.*/\1/p; s/^split $k=\([0-9.]*\)%.*/\1/p" <<<"$last" | head -n1)"
    if [ -z "$got" ] || ! awk -v g="$got" -v w="$want" 'BEGIN { exit !(g >= w - 5 && g <= w + 5) }'; then
        echo "FAIL: $k=$got% (want $want +- 5) in: $last"
        rc=1
    fi
done
n="$(awk -v d="$domid" '$2 == d' <<<"$vcpus" | wc -l)"
[ "$n" = 2 ] || { echo "FAIL: xl vcpu-list shows $n vCPUs of domain $domid, not 2"; rc=1; }
tr -d '\r' <"$LOG" | grep -q '^vcpu1 up (delta)' || { echo "FAIL: vCPU1 did not come up"; rc=1; }
deltas="$(tr -d '\r' <"$LOG" | sed -n 's/^delta rounds=\([0-9]*\).*/\1/p' | tail -n 1)"
[ "${deltas:-0}" -gt 0 ] || { echo "FAIL: delta did not run on vCPU1 (delta rounds=${deltas:-none})"; rc=1; }
[ $rc = 0 ] && echo "smoke: PASS ($last; delta rounds=$deltas)"
exit $rc
