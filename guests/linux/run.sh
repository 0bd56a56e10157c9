#!/bin/bash
# run.sh [OPTIONS] ARCH KIT OUTDIR [-- PREFIX...] — boots the Linux guest kit (kit.sh) for
# ARCH (x86_64 or aarch64) under QEMU TCG: Debian's kernel, the kit's initramfs (init says
# what it runs), the console in OUTDIR/serial.log and a raw dump disk OUTDIR/dump.img, from
# which OUTDIR/kallsyms and OUTDIR/vmlinux.btf are cut when QEMU has exited.
# PREFIX runs QEMU's command line (appended to it) instead of running it here, e.g.
#   run.sh x86_64 KIT OUT -- glass record --vm -o OUT/x.glass --symbols KIT/x86_64/kallsyms --
# Options:
#   --kaslr          leave KASLR on (default: nokaslr on the command line)
#   --cpu MODEL      -cpu MODEL (aarch64: cortex-a57 by default, max for PAC; x86_64: max)
#   --smp N          vCPUs (default 2; the workload runs on vCPU 0, the others idle)
#   --work S         seconds of workload (default 10)
#   --nice N         dd's nice value (default 3)
#   --ram MIB        guest RAM (default 256)
#   --append ARGS    more kernel command line
#   --gdb SOCKET     a GDB stub on a unix socket (not with glass --vm, which adds its own)
#   --qmp SOCKET     a QMP monitor on a unix socket
#   --no-dump        no dump disk (init skips the copy)
#   --print          print QEMU's command line, one argument a line, and exit
# Exit status: PREFIX's or QEMU's.
set -euo pipefail
usage() { sed -n '2,/^# Exit/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
kaslr=0 cpu="" smp=2 work=10 nice=3 ram=256 append="" gdb="" qmp="" dump=1 print=0
while [ $# -gt 0 ]; do
    case "$1" in
        --kaslr) kaslr=1 ;;
        --cpu) cpu="$2"; shift ;;
        --smp) smp="$2"; shift ;;
        --work) work="$2"; shift ;;
        --nice) nice="$2"; shift ;;
        --ram) ram="$2"; shift ;;
        --append) append="$2"; shift ;;
        --gdb) gdb="$2"; shift ;;
        --qmp) qmp="$2"; shift ;;
        --no-dump) dump=0 ;;
        --print) print=1 ;;
        -h | --help) usage ;;
        -*) echo "run.sh: unknown option $1" >&2; usage ;;
        *) break ;;
    esac
    shift
done
[ $# -ge 3 ] || usage
arch="$1" kit="$2/$1" out="$3"
shift 3
prefix=()
if [ $# -gt 0 ]; then
    [ "$1" = -- ] || usage
    shift
    prefix=("$@")
fi
[ -s "$kit/kernel" ] || { echo "run.sh: no kernel in $kit: run guests/linux/kit.sh first" >&2; exit 2; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cmdline="panic=-1 quiet loglevel=4 glass_work=$work glass_nice=$nice glass_dump=$dump"
[ $kaslr = 1 ] || cmdline="$cmdline nokaslr"
case "$arch" in
    x86_64)
        qemu=(qemu-system-x86_64 -accel tcg -cpu "${cpu:-max}")
        cmdline="console=ttyS0 $cmdline"
        disk=virtio-blk-pci
        ;;
    aarch64)
        # -cpu max has pointer authentication (the kernel's pac-ret signs return addresses);
        # pauth-impdef keeps TCG's PAC cheap.
        c="${cpu:-cortex-a57}"
        [ "$c" = max ] && c="max,pauth-impdef=on"
        qemu=(qemu-system-aarch64 -M virt -accel tcg -cpu "$c")
        cmdline="console=ttyAMA0 $cmdline"
        disk=virtio-blk-device
        ;;
    *) echo "run.sh: no such architecture: $arch (x86_64 or aarch64)" >&2; exit 2 ;;
esac
qemu+=(-smp "$smp" -m "$ram" -nodefaults -display none -no-reboot
    -kernel "$kit/kernel" -initrd "$kit/initramfs.cpio.gz" -append "$cmdline ${append}"
    -serial "file:$out/serial.log")
if [ $dump = 1 ]; then
    rm -f "$out/dump.img" "$out/kallsyms" "$out/vmlinux.btf"
    truncate -s 64M "$out/dump.img"
    qemu+=(-drive "file=$out/dump.img,format=raw,if=none,id=dump" -device "$disk,drive=dump")
fi
[ -z "$gdb" ] || qemu+=(-gdb "unix:$gdb,server=on,wait=off")
[ -z "$qmp" ] || qemu+=(-qmp "unix:$qmp,server=on,wait=off")
if [ $print = 1 ]; then
    printf '%s\n' "${qemu[@]}"
    exit 0
fi
status=0
"${prefix[@]}" "${qemu[@]}" || status=$?
if [ $dump = 1 ]; then
    # sector 0: "glass-dump KALLSYMS_BYTES BTF_BYTES"; kallsyms at 1 MiB, BTF at the next MiB.
    read -r magic ks bs < <(head -c 512 "$out/dump.img" | tr -d '\0') || true
    if [ "${magic:-}" = glass-dump ]; then
        kmib=$(((ks + 1048575) / 1048576))
        dd if="$out/dump.img" of="$out/kallsyms" bs=1M skip=1 iflag=count_bytes count="$ks" status=none
        dd if="$out/dump.img" of="$out/vmlinux.btf" bs=1M skip=$((1 + kmib)) iflag=count_bytes count="$bs" status=none
    else
        echo "run.sh: the guest wrote no dump (see $out/serial.log)" >&2
    fi
    rm -f "$out/dump.img"
fi
exit $status
