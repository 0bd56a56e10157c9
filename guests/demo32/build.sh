#!/usr/bin/env bash
# Builds the 32-bit demo guest (guests/demo32) in its three paging modes with the
# machine's gcc (-m32, freestanding: no multilib needed) and ld: OUT/demo32-none.elf
# (paging off, linked at 1 MiB), OUT/demo32-2level.elf and OUT/demo32-pae.elf (the
# kernel at 0xC0100000), multiboot ELF32 images that QEMU's -kernel boots.
# Usage: guests/demo32/build.sh OUT
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$1"
mkdir -p "$out"
flags=(-m32 -O2 -g -ffreestanding -fno-pic -fno-pie -fno-stack-protector -mno-sse -mno-mmx
       -mno-80387 -fno-omit-frame-pointer -nostdlib)
for variant in none:0:0 2level:2:0xC0000000 pae:3:0xC0000000; do
    IFS=: read -r name paging vma <<<"$variant"
    gcc "${flags[@]}" -c "$here/kernel.c" -o "$out/kernel32-$name.o"
    gcc -m32 -DPAGING="$paging" -DKERNEL_VMA="$vma" -c "$here/boot.S" -Wa,--noexecstack -o "$out/boot32-$name.o"
    cat > "$out/link32-$name.ld" <<LD
ENTRY(_start)
SECTIONS {
    . = 1M;
    .boot : { *(.multiboot) *(.boot) }
    . = ALIGN(4096) + $vma;
    .text : AT(ADDR(.text) - $vma) { *(.text*) }
    .rodata : AT(ADDR(.rodata) - $vma) { *(.rodata*) }
    .eh_frame : AT(ADDR(.eh_frame) - $vma) { *(.eh_frame*) }
    .data : AT(ADDR(.data) - $vma) { *(.data*) }
    .bss : AT(ADDR(.bss) - $vma) { *(.bss*) *(COMMON) }
    /DISCARD/ : { *(.note*) *(.comment) }
}
LD
    ld -m elf_i386 -n -nostdlib --no-warn-rwx-segments -T "$out/link32-$name.ld" -o "$out/demo32-$name.elf" \
        "$out/boot32-$name.o" "$out/kernel32-$name.o"
done
