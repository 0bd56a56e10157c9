#!/usr/bin/env bash
# Builds the disk guest (guests/disk/kernel.c): a unikernel writing 4 KiB blocks to a
# legacy virtio-blk disk in a loop, and printing its write rate on COM1.
#   OUT/disk.elf   64-bit ELF with symbols and DWARF (give it to --symbols)
#   OUT/disk.img   the elf32-i386 multiboot copy QEMU's -kernel accepts
# The boot code is guests/demo/boot.S with -DBOOT_SINGLE_VCPU (one vCPU), linked with
# guests/demo/link.ld. MIB (default 16) is how much of the disk the writes cycle over.
#
# Run it with a raw disk of at least MIB MiB:
#   qemu-img create -f raw OUT/disk.raw 64M
#   qemu-system-x86_64 -accel tcg -m 64 -display none -nodefaults -serial stdio \
#     -kernel OUT/disk.img -drive file=OUT/disk.raw,if=none,id=d0,format=raw,cache=writeback \
#     -device virtio-blk-pci,drive=d0,disable-modern=on
# Usage: guests/disk/build.sh OUT [MIB]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
demo="$here/../demo"
out="$1"; mib="${2:-16}"
mkdir -p "$out"
gcc -O2 -g -ffreestanding -fno-pic -fno-pie -mno-red-zone -fno-stack-protector \
    -mno-sse -mno-mmx -mno-80387 -fasynchronous-unwind-tables -fno-omit-frame-pointer \
    -Wall -Wextra -DDISK_MIB="$mib" -c "$here/kernel.c" -o "$out/disk-kernel.o"
gcc -DBOOT_SINGLE_VCPU -c "$demo/boot.S" -Wa,--noexecstack -o "$out/disk-boot.o"
ld -n -nostdlib --no-warn-rwx-segments -T "$demo/link.ld" --build-id \
    -o "$out/disk.elf" "$out/disk-boot.o" "$out/disk-kernel.o"
objcopy -O elf32-i386 "$out/disk.elf" "$out/disk.img"
