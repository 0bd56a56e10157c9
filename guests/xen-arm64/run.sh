#!/bin/bash
# run.sh KIT SCRIPT OUTDIR [TIMEOUT_S] — boots Xen on ARM64 + an arm64 dom0 under
# qemu-system-aarch64 (TCG) from the kit that kit.sh built, runs SCRIPT (a host path, run
# with dom0's busybox sh) inside dom0 as root, and exits with SCRIPT's exit status (124:
# timeout, 125: dom0 setup failed, 126: no status came back). dom0's root is the kit's arm64
# rootfs (tmpfs overlay on top); the kit, SCRIPT's directory, OUTDIR and the directories in
# GLASS_XEN_ARM64_BIND (colon-separated host paths, e.g. where the aarch64 glass is) are at
# their host paths, OUTDIR read-write. Logs land in OUTDIR (serial.log, script.log,
# console/, xen-dmesg.log, dom0-dmesg.log).
# Tunables (env): GLASS_XEN_ARM64_RAM_MB (2048), GLASS_XEN_ARM64_DOM0_MEM (512M),
# GLASS_XEN_ARM64_ARGS / GLASS_XEN_ARM64_DOM0_ARGS (extra Xen / dom0 kernel arguments).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 KIT SCRIPT OUTDIR [TIMEOUT_S]" >&2; exit 2; }
KIT="$(cd "$1" && pwd)"
SCRIPT="$(realpath "$2")"
mkdir -p "$3"
OUT="$(cd "$3" && pwd)"
TIMEOUT="${4:-600}"
RAM_MB="${GLASS_XEN_ARM64_RAM_MB:-2048}"
DOM0_MEM="${GLASS_XEN_ARM64_DOM0_MEM:-512M}"
for f in xen Image dom0.cpio.gz rootfs/stage2.sh; do
    [ -s "$KIT/$f" ] || { echo "run.sh: $KIT/$f missing: run guests/xen-arm64/kit.sh $KIT" >&2; exit 2; }
done
[ -f "$SCRIPT" ] || { echo "run.sh: no script $SCRIPT" >&2; exit 2; }
BIND="$(dirname "$SCRIPT")${GLASS_XEN_ARM64_BIND:+:$GLASS_XEN_ARM64_BIND}"
case "$KIT$SCRIPT$OUT$BIND" in
*[,\ ]*) echo "run.sh: KIT, SCRIPT, OUTDIR and bound paths must not contain commas or spaces" >&2; exit 2 ;;
esac
command -v qemu-system-aarch64 >/dev/null || { echo "run.sh: qemu-system-aarch64 missing: run kit.sh" >&2; exit 2; }

rm -rf "$OUT/script.status" "$OUT/script.started" "$OUT/script.log" "$OUT/serial.log" \
    "$OUT/console" "$OUT/xen-dmesg.log" "$OUT/dom0-dmesg.log"

# bootscrub=off: scrubbing dom0's memory took 9-50 s under TCG. One dom0 vCPU, pinned to
# pCPU0, leaves pCPU1 to the domU (guests/xen/README.md: a 2-vCPU dom0 boots 2x slower).
XEN_ARGS="console=dtuart dom0_mem=$DOM0_MEM,max:$DOM0_MEM dom0_max_vcpus=1 dom0_vcpus_pin"
XEN_ARGS+=" loglvl=all guest_loglvl=all bootscrub=off ${GLASS_XEN_ARM64_ARGS:-}"
DOM0_ARGS="console=hvc0 glass_script=$SCRIPT glass_out=$OUT glass_kit=$KIT glass_bind=$BIND"
DOM0_ARGS+=" ${GLASS_XEN_ARM64_DOM0_ARGS:-}"

start=$(date +%s%3N)
# Xen is QEMU's -kernel (an arm64 Image, entered at EL2); dom0's kernel and initramfs go
# in as guest-loader blobs, which QEMU describes in the DT's /chosen as Xen's multiboot
# modules. The 33 MB kernel sits at 0x42000000, the initramfs above it.
qemu-system-aarch64 -accel tcg -M virt,virtualization=on,gic-version=2 -cpu cortex-a57 \
    -smp 2 -m "$RAM_MB" -display none -nodefaults -no-reboot -serial "file:$OUT/serial.log" \
    -kernel "$KIT/xen" -append "$XEN_ARGS" \
    -device "guest-loader,addr=0x42000000,kernel=$KIT/Image,bootargs=$DOM0_ARGS" \
    -device "guest-loader,addr=0x47000000,initrd=$KIT/dom0.cpio.gz" \
    -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
    -device virtio-9p-device,fsdev=hostroot,mount_tag=hostroot \
    -fsdev "local,id=out,path=$OUT,security_model=none,multidevs=remap" \
    -device virtio-9p-device,fsdev=out,mount_tag=out \
    </dev/null >"$OUT/qemu.log" 2>&1 &
qpid=$!
trap 'kill $qpid 2>/dev/null; exit 130' INT TERM
ms() { echo $(($(date +%s%3N) - start)); }
secs() { printf '%d.%d' $(($1 / 1000)) $(($1 % 1000 / 100)); }

echo "run.sh: QEMU pid $qpid; Xen+dom0 console: $OUT/serial.log" >&2
started="" done_at="" timed_out=0
while kill -0 $qpid 2>/dev/null; do
    if [ -z "$started" ] && [ -e "$OUT/script.started" ]; then
        started=$(ms)
        echo "run.sh: script started $(secs "$started") s after QEMU start" >&2
    fi
    if [ -z "$done_at" ] && [ -s "$OUT/script.status" ]; then done_at=$(ms); fi
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
