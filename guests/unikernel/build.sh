#!/usr/bin/env bash
# Builds the unikernel guest the way Unikraft builds its images, with the machine's gcc
# and ld:
#   OUT/uk.elf           64-bit ELF with symbols and DWARF (give it to --symbols)
#   OUT/uk.img           the elf32-i386 multiboot copy QEMU's -kernel accepts
#   OUT/uk-stripped.img  the same, stripped of symbols and DWARF (.eh_frame stays)
# C (kernel.c) is compiled with -fno-asynchronous-unwind-tables and without frame
# pointers, so its CFI is only in .debug_frame; the assembly (entry.S) has .cfi_*
# directives, so .eh_frame exists, and the link has --eh-frame-hdr. The boot code is
# guests/demo/boot.S with -DBOOT_SINGLE_VCPU: the guest runs on one vCPU and never starts
# another (under -smp 2 the second vCPU stays in SeaBIOS), linked with guests/demo/link.ld.
#
# Functions (kernel.c's first comment has the split):
#   kmain -> run -> dispatch -> alpha                          60% of busy time
#   kmain -> run -> dispatch -> beta -> descend (80 frames)    30%, at the bottom, > 40 KiB deep
#   kmain -> run -> dispatch -> gamma -> mix_block (asm)       10%, in mix_block
#   kmain -> run -> idle_wait                                  halted (sti; hlt), ~30% of wall time
#   timer_isr (asm, PIT vector 32), spurious_isr, fault_stubs, guest_fault, checkpoint
# Serial: "rate rounds=25 cycles=N" then "split alpha=A% beta=B% gamma=G% halted=H% rounds=N"
# every 25 rounds; "stack depth=BYTES frames=80 ..." after round 1; "done rounds=N" at the end.
#
# The script checks the result with readelf/nm/objdump and fails if the C functions have
# an FDE in .eh_frame or none in .debug_frame, if they set up a frame pointer, if mix_block
# has no .eh_frame FDE, or if .eh_frame_hdr / PT_GNU_EH_FRAME are missing.
# Usage: guests/unikernel/build.sh OUT [ROUNDS]     (ROUNDS 0 = run forever)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
demo="$here/../demo"
out="$1"; rounds="${2:-0}"
mkdir -p "$out"

gcc -O2 -g -ffreestanding -fno-pic -fno-pie -mno-red-zone -fno-stack-protector \
    -mno-sse -mno-mmx -mno-80387 -fno-asynchronous-unwind-tables -fno-unwind-tables \
    -fomit-frame-pointer -Wall -Wextra -DROUNDS="$rounds" \
    -c "$here/kernel.c" -o "$out/uk-kernel.o"
gcc -g -c "$here/entry.S" -Wa,--noexecstack -o "$out/uk-entry.o"
gcc -DBOOT_SINGLE_VCPU -DBOOT_STACK_SIZE=131072 -c "$demo/boot.S" -Wa,--noexecstack -o "$out/uk-boot.o"
ld -n -nostdlib --no-warn-rwx-segments --eh-frame-hdr -T "$demo/link.ld" --build-id \
    -o "$out/uk.elf" "$out/uk-boot.o" "$out/uk-entry.o" "$out/uk-kernel.o"
objcopy -O elf32-i386 "$out/uk.elf" "$out/uk.img"
objcopy -O elf32-i386 --strip-all "$out/uk.elf" "$out/uk-stripped.img"

# --- checks ---------------------------------------------------------------------------
fail() { echo "guests/unikernel/build.sh: $*" >&2; exit 1; }
elf="$out/uk.elf"
readelf -S -W "$elf" | grep -q ' \.eh_frame_hdr ' || fail "no .eh_frame_hdr section"
readelf -S -W "$elf" | grep -q ' \.eh_frame ' || fail "no .eh_frame section"
readelf -S -W "$elf" | grep -q ' \.debug_frame ' || fail "no .debug_frame section"
readelf -l -W "$elf" | grep -q 'GNU_EH_FRAME' || fail "no PT_GNU_EH_FRAME program header"
readelf -h "$out/uk.img" | grep -q 'ELF32' || fail "uk.img is not ELF32"
readelf -S -W "$out/uk.img" | grep -q ' \.symtab ' || fail "uk.img has no symbols"
if readelf -S -W "$out/uk-stripped.img" | grep -qE ' \.(symtab|debug_[a-z]+) '; then
    fail "uk-stripped.img still has symbols or DWARF"
fi
# "section start end" for every FDE of .eh_frame and .debug_frame.
fdes="$(readelf --debug-dump=frames "$elf" | awk '
    /^Contents of the \.eh_frame section/ { sec = "eh_frame" }
    /^Contents of the \.debug_frame section/ { sec = "debug_frame" }
    / FDE / { split($NF, r, "[=.]+"); print sec, r[2], r[3] }')"
# covered SECTION ADDRESS: whether an FDE of SECTION covers ADDRESS (hex, no 0x).
covered() {
    local sec start end
    while read -r sec start end; do
        if [ "$sec" = "$1" ] && (( 16#$start <= 16#$2 && 16#$2 < 16#$end )); then return 0; fi
    done <<< "$fdes"
    return 1
}
address() {
    local a; a="$(nm "$elf" | awk -v f="$1" '$3 == f { print $1 }')"
    [ -n "$a" ] || fail "no symbol $1"
    echo "$a"
}
for f in kmain run dispatch alpha beta gamma descend idle_wait checkpoint; do
    a="$(address $f)"
    covered debug_frame "$a" || fail "$f has no FDE in .debug_frame"
    ! covered eh_frame "$a" || fail "$f has an FDE in .eh_frame"
    # a frame-pointer prologue: push %rbp, then mov %rsp,%rbp as the first instructions
    if objdump -d --no-show-raw-insn --disassemble="$f" "$elf" | grep -P '^\s+[0-9a-f]+:\t' | head -2 \
        | tr -s ' \t' ' ' | tr '\n' ';' | grep -q 'push %rbp; .*mov %rsp,%rbp'; then
        fail "$f sets up a frame pointer"
    fi
done
for f in mix_block timer_isr; do
    covered eh_frame "$(address $f)" || fail "$f has no FDE in .eh_frame"
done
if nm "$elf" | grep -qE ' (ap_main|ap_long_mode|ap_trampoline)$'; then
    fail "the image brings up a second vCPU"
fi
