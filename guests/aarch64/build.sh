#!/usr/bin/env bash
# Builds the AArch64 demo guest (QEMU virt, cortex-a57, EL1, high-half kernel) with the
# aarch64-linux-gnu cross toolchain, twice from the same source:
#   OUT/uk-fp.elf    frame pointers in every function (-fno-omit-frame-pointer
#                    -mno-omit-leaf-frame-pointer, frame records in the assembly too) and
#                    no unwind tables at all: no .eh_frame, and the .debug_frame that -g
#                    makes is removed, so only a frame-record walk unwinds it
#   OUT/uk-nofp.elf  no frame pointers (-fomit-frame-pointer), CFI in .eh_frame (C with
#                    -fasynchronous-unwind-tables, assembly with .cfi_*), .eh_frame_hdr
# Both -O2 -g, ELF64 with symbols and DWARF, given to QEMU as they are:
#   qemu-system-aarch64 -M virt -cpu cortex-a57 -smp 2 -m 128 -accel tcg -display none \
#       -nodefaults -serial stdio -kernel OUT/uk-fp.elf
# The script checks the result with readelf/objdump and fails if a variant is not what it
# says (see the checks at the end).
# Usage: guests/aarch64/build.sh OUT [ROUNDS] [PLATFORM]     (ROUNDS 0 = run forever)
# PLATFORM virt (default) builds the above for QEMU's virt machine; xen builds the same
# guest for a Xen on ARM domU (layout.h's GLASS_XEN memory map: vGICv2, SBSA vUART) as
# OUT/uk-xen-fp.elf, OUT/uk-xen-nofp.elf (the ELFs to give a profiler as symbols) and
# OUT/uk-xen-fp.img, OUT/uk-xen-nofp.img: what xl boots as kernel= (vuart="sbsa_uart"),
# a 4 KiB arm64 Image header in front of objcopy -O binary of the ELF. The header's
# text_offset puts the binary at the ELF's PHYS_BASE (libxenguest loads an Image at
# GUEST_RAM0_BASE + text_offset and enters it at its first byte, a branch over the header).
# CROSS_COMPILE (default aarch64-linux-gnu-) selects the toolchain; AARCH64_DEFINES adds
# -D flags (kernel.c's exact-count build: START_IDLE_MS, EXACT_ROUNDS, HOLD_MS).
set -euo pipefail
fail() { echo "guests/aarch64/build.sh: $*" >&2; exit 1; }
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: guests/aarch64/build.sh OUT [ROUNDS] [virt|xen]}"; rounds="${2:-0}"
platform="${3:-virt}"
case "$platform" in
virt) uk=uk; platform_flags=() ;;
xen) uk=uk-xen; platform_flags=(-DGLASS_XEN) ;;
*) fail "platform $platform: virt or xen" ;;
esac
cross="${CROSS_COMPILE:-aarch64-linux-gnu-}"
for tool in gcc cpp ld objcopy readelf objdump nm; do
    command -v "${cross}$tool" >/dev/null \
        || fail "${cross}$tool not found: install the AArch64 cross toolchain (Debian: apt-get install gcc-aarch64-linux-gnu)"
done
mkdir -p "$out"

common=(-O2 -g -std=gnu11 -ffreestanding -fno-builtin -nostdlib -fno-pic -fno-pie
        -fno-stack-protector -march=armv8-a -mgeneral-regs-only -mno-outline-atomics
        -mbranch-protection=none -mcmodel=small -Wall -Wextra -DROUNDS="$rounds" "${platform_flags[@]}")
# shellcheck disable=SC2206 # -D flags, split on spaces
common+=(${AARCH64_DEFINES:-})
"${cross}cpp" -P -undef "${platform_flags[@]}" -I"$here" "$here/link.ld.S" -o "$out/$uk-link.ld"
for variant in fp nofp; do
    if [ $variant = fp ]; then
        flags=(-DGLASS_FP -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer
               -fno-asynchronous-unwind-tables -fno-unwind-tables)
        ldflags=()
    else
        flags=(-fomit-frame-pointer -fasynchronous-unwind-tables)
        ldflags=(--eh-frame-hdr)
    fi
    for src in kernel.c boot.S mix_block.S; do
        "${cross}gcc" "${common[@]}" "${flags[@]}" -I"$here" -c "$here/$src" \
            -o "$out/$uk-$variant-${src%.*}.o"
    done
    "${cross}ld" -nostdlib -static -n --build-id --no-warn-rwx-segments "${ldflags[@]}" -T "$out/$uk-link.ld" \
        -o "$out/$uk-$variant.elf" \
        "$out/$uk-$variant-boot.o" "$out/$uk-$variant-kernel.o" "$out/$uk-$variant-mix_block.o"
done
"${cross}objcopy" --remove-section=.debug_frame "$out/$uk-fp.elf"

# --- checks ---------------------------------------------------------------------------
functions=(kmain run dispatch alpha spin_block beta descend gamma idle_wait
           second_cpu_main delta_loop delta checkpoint)
sections() { "${cross}readelf" -S -W "$1"; }
disassembly() { "${cross}objdump" -d --no-show-raw-insn --disassemble="$2" "$1" | grep -P '^\s*[0-9a-f]+:\t'; }
for variant in fp nofp; do
    elf="$out/$uk-$variant.elf"
    "${cross}readelf" -h "$elf" | grep -q 'AArch64' || fail "$elf is not an AArch64 ELF"
    sections "$elf" | grep -q ' \.symtab ' || fail "$elf has no symbols"
    sections "$elf" | grep -q ' \.debug_info ' || fail "$elf has no DWARF"
    for f in "${functions[@]}" mix_block kernel_entry secondary_entry _start secondary_start; do
        "${cross}nm" "$elf" | grep -qE " [tT] $f\$" || fail "$elf has no symbol $f"
    done
done
fp="$out/$uk-fp.elf"; nofp="$out/$uk-nofp.elf"
if sections "$fp" | grep -qE ' \.(eh_frame|eh_frame_hdr|debug_frame) '; then
    fail "uk-fp.elf has unwind tables"
fi
for f in "${functions[@]}" mix_block; do
    # a frame record in the prologue (first 8 instructions, scheduled): stp x29, x30, [sp, #-N]! (or sub sp first and
    # stp x29, x30, [sp]), then mov x29, sp (or add x29, sp, #N)
    prologue="$(disassembly "$fp" "$f" | awk 'NR <= 8' | tr -s ' \t' ' ' | tr '\n' ';')"
    grep -qP 'stp x29, x30, \[sp(, #-\d+\]!|\]);.*(mov x29, sp|add x29, sp, #\w+);' <<< "$prologue" \
        || fail "$f sets up no frame record in uk-fp.elf"
done
sections "$nofp" | grep -q ' \.eh_frame ' || fail "uk-nofp.elf has no .eh_frame"
sections "$nofp" | grep -q ' \.eh_frame_hdr ' || fail "uk-nofp.elf has no .eh_frame_hdr"
if "${cross}objdump" -d --no-show-raw-insn "$nofp" | grep -P '\t(mov|add)\s+x29, sp' >/dev/null; then
    fail "uk-nofp.elf uses x29 as a frame pointer"
fi
fdes="$("${cross}readelf" --debug-dump=frames "$nofp" | awk '/ FDE / { split($NF, r, "[=.]+"); print r[2], r[3] }')"
for f in "${functions[@]}" mix_block kernel_entry secondary_entry; do
    a="$("${cross}nm" "$nofp" | awk -v f="$f" '$3 == f { print $1 }')"
    covered=no
    while read -r start end; do
        if [ "$(printf '%s\n%s\n' "$start" "$a" | sort | head -1)" = "$start" ] \
            && [ "$(printf '%s\n%s\n' "$a" "$end" | sort | head -1)" = "$a" ] && [ "$a" != "$end" ]; then
            covered=yes; break
        fi
    done <<< "$fdes"
    [ $covered = yes ] || fail "$f has no .eh_frame FDE in uk-nofp.elf"
done
rm -f "$out/$uk"-*.o
if [ "$platform" = xen ]; then
    for variant in fp nofp; do
        elf="$out/$uk-$variant.elf"
        start="$("${cross}nm" "$elf" | awk '$3 == "_start" { print $1 }')"
        [ "$((16#$start))" = "$((16#$("${cross}readelf" -h "$elf" | awk '/Entry point/ { print substr($4, 3) }')))" ] \
            || fail "$elf: _start is not the entry point"
        "${cross}objcopy" -O binary "$elf" "$out/$uk-$variant.bin"
        # The arm64 Image header (Linux's Documentation/arch/arm64/booting.rst): code0 =
        # b +4096, text_offset = _start - 4096 - RAM base, image_size, flags = 4 KiB
        # pages, magic "ARM\x64"; the binary, which starts at _start, follows at 4096.
        python3 - "$out/$uk-$variant.bin" "$out/$uk-$variant.img" "$start" <<'PY'
import struct, sys
binary = open(sys.argv[1], "rb").read()
start = int(sys.argv[3], 16)
ram_base = 0x40000000
text_offset = start - 4096 - ram_base
assert text_offset > 0, hex(start)
header = struct.pack("<IIQQQQQQI", 0x14000000 | (4096 // 4), 0, text_offset,
                     4096 + len(binary), 1 << 1, 0, 0, 0, 0x644D5241)
open(sys.argv[2], "wb").write(header.ljust(4096, b"\0") + binary)
PY
        rm -f "$out/$uk-$variant.bin"
    done
    echo "built $fp $nofp $out/$uk-fp.img $out/$uk-nofp.img"
else
    echo "built $fp $nofp"
fi
