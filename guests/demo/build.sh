#!/usr/bin/env bash
# Builds the demo unikernel with the machine's gcc and ld: OUT/guest-fp.elf (frame
# pointers) and OUT/guest-nofp.elf (without), each with DWARF and .eh_frame, plus the
# ELF32 copies QEMU's multiboot loader accepts (OUT/guest-*.img).
# Usage: guests/demo/build.sh OUT [ROUNDS] [TICKS]
# With TICKS (0 or more) the guest times its own calls (-DSELF_TIME=1, self_time.h): it
# calls tick, a function with an almost empty body, TICKS times a round, times every call
# of alpha, beta, gamma_ and tick with rdtsc and, before "done", prints a line a function,
# `self alpha calls=N p50=CYCLES min=CYCLES`. Without it the image is the plain demo,
# byte for byte (the existing tests and benchmarks use it). UNIT_ITERATIONS=N in the
# environment sets the spin loop's length (20000 a unit by default) of a self-timed build.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$1"; rounds="${2:-0}"
mkdir -p "$out"
common=(-O2 -g -ffreestanding -fno-pic -fno-pie -mno-red-zone -fno-stack-protector
        -mno-sse -mno-mmx -mno-80387 -fasynchronous-unwind-tables -DROUNDS="$rounds")
if [ $# -ge 3 ]; then
    case "$3" in
        ''|*[!0-9]*) echo "build.sh: TICKS must be a number of calls a round, not '$3'" >&2; exit 2 ;;
    esac
    common+=(-DSELF_TIME=1 -DSELF_TICKS="$3")
    if [ -n "${UNIT_ITERATIONS:-}" ]; then common+=(-DSELF_UNIT_ITERATIONS="$UNIT_ITERATIONS"); fi
fi
for variant in fp nofp; do
    if [ $variant = fp ]; then flags=(-fno-omit-frame-pointer); else flags=(-fomit-frame-pointer); fi
    gcc "${common[@]}" "${flags[@]}" -c "$here/kernel.c" -o "$out/kernel-$variant.o"
    gcc -c "$here/boot.S" -Wa,--noexecstack -o "$out/boot.o"
    ld -n -nostdlib --no-warn-rwx-segments -T "$here/link.ld" --build-id -o "$out/guest-$variant.elf" "$out/boot.o" "$out/kernel-$variant.o"
    objcopy -O elf32-i386 "$out/guest-$variant.elf" "$out/guest-$variant.img"
done
