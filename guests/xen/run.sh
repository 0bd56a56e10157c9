#!/bin/bash
# run.sh KIT SCRIPT OUTDIR [TIMEOUT_S] — boots Xen + a dom0 under QEMU (TCG) from the kit
# that kit.sh built, runs SCRIPT (a host path) inside dom0 as root, and exits with SCRIPT's
# exit status (124: timeout, 125: dom0 setup failed, 126: no status came back). dom0 sees
# the host's root read-only at / (tmpfs overlay on top) and OUTDIR read-write at its host
# path; logs land in OUTDIR (serial.log, script.log, console/, xen-dmesg.log, dom0-dmesg.log).
# Tunables (env): GLASS_XEN_RAM_MB (3072), GLASS_XEN_DOM0_MEM (1024M),
# GLASS_XEN_DOM0_VCPUS (1), GLASS_XEN_CPU (qemu64), GLASS_XEN_ARGS / GLASS_XEN_DOM0_ARGS
# (extra Xen / dom0 kernel arguments).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 KIT SCRIPT OUTDIR [TIMEOUT_S]" >&2; exit 2; }
KIT="$(cd "$1" && pwd)"
SCRIPT="$(realpath "$2")"
mkdir -p "$3"
OUT="$(cd "$3" && pwd)"
TIMEOUT="${4:-600}"
RAM_MB="${GLASS_XEN_RAM_MB:-3072}"
DOM0_MEM="${GLASS_XEN_DOM0_MEM:-1024M}"
DOM0_VCPUS="${GLASS_XEN_DOM0_VCPUS:-1}"
CPU="${GLASS_XEN_CPU:-qemu64}"
for f in xen vmlinuz dom0.cpio.gz; do
    [ -s "$KIT/$f" ] || { echo "run.sh: $KIT/$f missing: run guests/xen/kit.sh $KIT" >&2; exit 2; }
done
[ -f "$SCRIPT" ] || { echo "run.sh: no script $SCRIPT" >&2; exit 2; }
case "$KIT$SCRIPT$OUT" in
*[,\ ]*) echo "run.sh: KIT, SCRIPT and OUTDIR paths must not contain commas or spaces" >&2; exit 2 ;;
esac

rm -rf "$OUT/script.status" "$OUT/script.started" "$OUT/script.log" "$OUT/serial.log" \
    "$OUT/console" "$OUT/xen-dmesg.log" "$OUT/dom0-dmesg.log"

XEN_ARGS="console=com1 com1=115200,8n1 dom0_mem=$DOM0_MEM,max:$DOM0_MEM dom0_max_vcpus=$DOM0_VCPUS"
XEN_ARGS+=" loglvl=all guest_loglvl=all bootscrub=0 ${GLASS_XEN_ARGS:-}"
DOM0_ARGS="console=hvc0 glass_script=$SCRIPT glass_out=$OUT glass_kit=$KIT ${GLASS_XEN_DOM0_ARGS:-}"

start=$(date +%s%3N)
qemu-system-x86_64 -accel tcg -machine q35 -cpu "$CPU" -smp 2 -m "$RAM_MB" \
    -display none -nodefaults -no-reboot -serial "file:$OUT/serial.log" \
    -kernel "$KIT/xen" -append "$XEN_ARGS" \
    -initrd "$KIT/vmlinuz $DOM0_ARGS,$KIT/dom0.cpio.gz" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$OUT,mount_tag=out,security_model=none,multidevs=remap" \
    </dev/null >"$OUT/qemu.log" 2>&1 &
qpid=$!
trap 'kill $qpid 2>/dev/null; exit 130' INT TERM
ms() { echo $(($(date +%s%3N) - start)); } # milliseconds since QEMU start
secs() { printf '%d.%d' $(($1 / 1000)) $(($1 % 1000 / 100)); }

echo "run.sh: QEMU pid $qpid; Xen+dom0 console: $OUT/serial.log" >&2
started="" done_at="" timed_out=0
while kill -0 $qpid 2>/dev/null; do
    if [ -z "$started" ] && [ -e "$OUT/script.started" ]; then
        started=$(ms)
        echo "run.sh: script started $(secs "$started") s after QEMU start" >&2
    fi
    if [ -z "$done_at" ] && [ -s "$OUT/script.status" ]; then done_at=$(ms); fi
    # dom0 powers itself off; give it 20 s after the status file appears, then pull the plug.
    if [ -n "$done_at" ] && [ "$(ms)" -gt $((done_at + 20000)) ]; then
        echo "run.sh: dom0 did not power off; killing QEMU" >&2
        kill $qpid 2>/dev/null || true
        break
    fi
    if [ "$(ms)" -gt $((TIMEOUT * 1000)) ]; then
        echo "run.sh: TIMEOUT after $TIMEOUT s; killing QEMU" >&2
        timed_out=1
        kill $qpid 2>/dev/null || true
        break
    fi
    sleep 0.5
done
wait $qpid 2>/dev/null && qrc=0 || qrc=$?
trap - INT TERM
total=$(ms)

if [ $timed_out = 1 ]; then
    rc=124
elif [ -s "$OUT/script.status" ]; then
    rc=$(cat "$OUT/script.status")
else
    echo "run.sh: QEMU exited ($qrc) without a script status: see $OUT/serial.log" >&2
    rc=126
fi
echo "run.sh: exit $rc, total $(secs "$total") s (QEMU exit $qrc)." \
    "Logs: $OUT/{serial.log,script.log,console/,xen-dmesg.log,dom0-dmesg.log,qemu.log}" >&2
exit "$rc"
