#!/bin/bash
# run-script.sh [OPTIONS] KIT OUTDIR SCRIPT [FILE...] — runs the shell script SCRIPT in a
# Linux guest of the kit (kit.sh) under QEMU TCG and brings its output directory back.
# The guest: KIT/ARCH's kernel and an initramfs made here of the kit's busybox (/bin/*),
# the kit's modules, the ARCH's glibc loader and libraries at their guest paths (libc,
# libm, libgcc_s, libstdc++ ...), each FILE in /work/ (its base name, modes kept) and
# SCRIPT as /work/run.sh. Its init (script-init) runs `sh /work/run.sh` in /work with
# OUT=/out (a tmpfs), then writes /out as a tar to a raw disk and powers off.
# On the host, OUTDIR receives /out's files, serial.log (the console: the kernel's
# messages and the script's stdout and stderr) and status (the script's exit status).
# Options:
#   --arch ARCH      aarch64 (default) or x86_64
#   --cpu MODEL      -cpu MODEL (aarch64: cortex-a57 by default; max runs as
#                    max,pauth-impdef=on, pointer authentication made cheap; x86_64: max)
#   --smp N          vCPUs (default 2)
#   --ram MIB        guest RAM (default 512; /out and /tmp live in it)
#   --disk MIB       the output disk's size (default 1024, a sparse file)
#   --timeout S      kill QEMU after S seconds (default 300): exit 124
#   --append ARGS    more kernel command line
# Exit status: 0 when the guest ran the script and its output came back (whatever the
# script's own status, in OUTDIR/status); 2 on bad usage; 124 on a timeout; 1 otherwise.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "run-script.sh: $*" >&2; exit 2; }
arch=aarch64 cpu="" smp=2 ram=512 disk=1024 timeout=300 append=""
while [ $# -gt 0 ]; do
    case "$1" in
        --arch | --cpu | --smp | --ram | --disk | --timeout | --append)
            [ $# -ge 2 ] || die "$1 needs a value"
            case "$1" in
                --arch) arch="$2" ;;
                --cpu) cpu="$2" ;;
                --smp) smp="$2" ;;
                --ram) ram="$2" ;;
                --disk) disk="$2" ;;
                --timeout) timeout="$2" ;;
                --append) append="$2" ;;
            esac
            shift 2
            ;;
        -h | --help) sed -n '2,/^# Exit/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
        --) shift; break ;;
        -*) die "unknown option $1 (usage: run-script.sh [--arch A] [--cpu M] [--smp N] [--ram MIB] [--disk MIB] [--timeout S] KIT OUTDIR SCRIPT [FILE...])" ;;
        *) break ;;
    esac
done
[ $# -ge 3 ] || die "usage: run-script.sh [--arch A] [--cpu M] [--smp N] [--ram MIB] [--disk MIB] [--timeout S] KIT OUTDIR SCRIPT [FILE...]"
for n in "$smp" "$ram" "$disk" "$timeout"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "not a positive number: $n"
done
kit="$1/$arch" out="$2" script="$3"
shift 3
[ -f "$script" ] || die "no such script: $script"
for f in "$@"; do
    [ -e "$f" ] || die "no such file: $f"
    [ "$(basename "$f")" != run.sh ] || die "a file named run.sh would replace the script: $f"
done
case "$arch" in
    aarch64)
        c="${cpu:-cortex-a57}"
        [ "$c" = max ] && c="max,pauth-impdef=on"
        qemu=(qemu-system-aarch64 -M virt -accel tcg -cpu "$c")
        console=ttyAMA0 blk=virtio-blk-device
        hostlib=/usr/aarch64-linux-gnu/lib libdir=/lib/aarch64-linux-gnu
        ldso=ld-linux-aarch64.so.1 interp=/lib/ld-linux-aarch64.so.1
        ;;
    x86_64)
        qemu=(qemu-system-x86_64 -accel tcg -cpu "${cpu:-max}")
        console=ttyS0 blk=virtio-blk-pci
        hostlib=/lib/x86_64-linux-gnu libdir=/lib/x86_64-linux-gnu
        ldso=ld-linux-x86-64.so.2 interp=/lib64/ld-linux-x86-64.so.2
        ;;
    *) die "no such architecture: $arch (aarch64 or x86_64)" ;;
esac
[ -s "$kit/kernel" ] && [ -s "$kit/busybox" ] ||
    die "no kernel or busybox in $kit: run guests/linux/kit.sh $1 first"
for lib in "$ldso" libc.so.6; do
    [ -e "$hostlib/$lib" ] || die "no $hostlib/$lib (libc6-arm64-cross for aarch64)"
done

mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d "$out/.run-script.XXXXXX")"
qemu_pid=""
cleanup() {
    [ -z "$qemu_pid" ] || kill -9 "$qemu_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -f "$out/serial.log" "$out/status"

# The initramfs: a staging directory in an uncompressed newc cpio (nothing to inflate in
# the guest under TCG; ~0.1 s to build here).
st="$work/root"
mkdir -p "$st"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,out,work,lib/modules}
mkdir -p "$st$libdir" "$st$(dirname "$interp")"
cp "$kit/busybox" "$st/bin/busybox"
ln -s busybox "$st/bin/sh"
cp "$HERE/script-init" "$st/init"
chmod 755 "$st/init" "$st/bin/busybox"
[ ! -d "$kit/modules" ] || cp "$kit"/modules/* "$st/lib/modules/"
# glibc and the runtime libraries of C and C++ programs, whichever the host has.
for lib in "$ldso" libc.so.6 libm.so.6 libgcc_s.so.1 libstdc++.so.6 libpthread.so.0 \
    libdl.so.2 librt.so.1 libresolv.so.2 libutil.so.1; do
    [ ! -e "$hostlib/$lib" ] || cp -L "$hostlib/$lib" "$st$libdir/$lib"
done
[ "$interp" = "$libdir/$ldso" ] || ln -s "$libdir/$ldso" "$st$interp"
mknod -m 600 "$st/dev/console" c 5 1
mknod -m 666 "$st/dev/null" c 1 3
cp "$script" "$st/work/run.sh"
for f in "$@"; do
    cp -a "$f" "$st/work/"
done
(cd "$st" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$work/initramfs.cpio"
rm -rf "$st"

img="$work/out.img"
truncate -s "${disk}M" "$img"
qemu+=(-smp "$smp" -m "$ram" -nodefaults -display none -no-reboot
    -kernel "$kit/kernel" -initrd "$work/initramfs.cpio"
    -append "console=$console panic=-1 quiet loglevel=4 $append"
    -serial "file:$out/serial.log"
    -drive "file=$img,format=raw,if=none,id=out" -device "$blk,drive=out")
started=$SECONDS
deadline=$(( ${EPOCHREALTIME/./} + timeout * 1000000 ))
"${qemu[@]}" </dev/null >"$work/qemu.log" 2>&1 &
qemu_pid=$!
while kill -0 "$qemu_pid" 2>/dev/null; do
    if [ "${EPOCHREALTIME/./}" -ge "$deadline" ]; then
        kill -9 "$qemu_pid" 2>/dev/null || true
        wait "$qemu_pid" 2>/dev/null || true
        qemu_pid=""
        echo "run-script.sh: the guest did not finish in ${timeout} s: QEMU killed (console: $out/serial.log)" >&2
        exit 124
    fi
    sleep 0.1
done
qemu_status=0
wait "$qemu_pid" || qemu_status=$?
qemu_pid=""
read -r magic status bytes < <(head -c 512 "$img" | tr -d '\0') || true
if [ "${magic:-}" != glass-out ]; then
    echo "run-script.sh: the guest wrote no output (QEMU exited with $qemu_status: $(tr '\n' ' ' <"$work/qemu.log"); console: $out/serial.log)" >&2
    exit 1
fi
dd if="$img" bs=1M skip=1 iflag=count_bytes count="$bytes" status=none | tar -x -m -C "$out" --no-same-owner
echo "$status" >"$out/status"
echo "run-script.sh: $arch guest ran the script in $((SECONDS - started)) s (status $status)" >&2
