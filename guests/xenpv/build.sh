#!/usr/bin/env bash
# Builds the demo unikernel as a Xen PV guest (x86-64), with the machine's gcc and ld:
#   OUT/uk-pv.elf   64-bit PV kernel ELF for Xen's domain builder (xl create, type="pv",
#                   kernel="OUT/uk-pv.elf"), with symbols and DWARF (give it to --symbols)
# C (kernel.c) is compiled -O2 -g -fno-omit-frame-pointer with gcc's default asynchronous
# unwind tables, so both frame pointers and .eh_frame unwind it; head.S has .cfi_*
# directives; the link has --eh-frame-hdr. Linked at 0xffffffff80000000 (link.ld).
#
# Functions (kernel.c's first comment has the split and the console lines):
#   vCPU0: _start -> kmain -> run -> dispatch -> alpha                      60% of busy time
#          _start -> kmain -> run -> dispatch -> beta -> descend (80 frames)  30%, at the bottom
#          _start -> kmain -> run -> dispatch -> gamma -> mix_block (asm)     10%, in mix_block
#          _start -> kmain -> run -> idle_wait       blocked (SCHEDOP_block through the hypercall page)
#   vCPU1: ap_entry -> ap_main -> delta               a spin loop, forever
#   hypervisor_callback -> do_event (events, only on a wake-up from idle_wait's block)
#
# The script checks the result with readelf/nm and fails if the Xen notes, the symbols,
# the entry point, DWARF or .eh_frame/.eh_frame_hdr are not as expected.
# Usage: guests/xenpv/build.sh OUT [ROUNDS]     (ROUNDS 0 = run forever)
set -euo pipefail
# (No `grep -q` at the end of a pipe: it stops reading at the first match, the writer
# dies of SIGPIPE, and pipefail turns that into a failure now and then.)
here="$(cd "$(dirname "$0")" && pwd)"
out="$1"; rounds="${2:-0}"
mkdir -p "$out"

gcc -O2 -g -ffreestanding -fno-pic -fno-pie -mcmodel=kernel -mno-red-zone -fno-stack-protector \
    -mno-sse -mno-mmx -mno-80387 -fno-omit-frame-pointer -fcf-protection=none \
    -Wall -Wextra -DROUNDS="$rounds" \
    -c "$here/kernel.c" -o "$out/uk-pv-kernel.o"
gcc -g -c "$here/head.S" -Wa,--noexecstack -o "$out/uk-pv-head.o"
ld -nostdlib -z max-page-size=4096 --eh-frame-hdr --build-id -T "$here/link.ld" \
    -o "$out/uk-pv.elf" "$out/uk-pv-head.o" "$out/uk-pv-kernel.o"

# --- checks ---------------------------------------------------------------------------
fail() { echo "guests/xenpv/build.sh: $*" >&2; exit 1; }
elf="$out/uk-pv.elf"
readelf -h "$elf" | grep 'Class: *ELF64' >/dev/null || fail "not ELF64"
readelf -h "$elf" | grep 'Machine: *Advanced Micro Devices X86-64' >/dev/null || fail "not x86-64"
readelf -l -W "$elf" | grep '^ *NOTE ' >/dev/null || fail "no PT_NOTE program header"
readelf -l -W "$elf" | grep 'GNU_EH_FRAME' >/dev/null || fail "no PT_GNU_EH_FRAME program header"
for s in .eh_frame .eh_frame_hdr .debug_info .debug_line .symtab; do
    readelf -S -W "$elf" | grep " \\$s " >/dev/null || fail "no $s section"
done

# The Xen notes: "type hex-bytes" for each note owned by Xen. readelf names a few Xen
# note types after GNU/core ones (1 NT_VERSION, 2 NT_ARCH, 4 GO BUILDID): map them back.
notes="$(readelf -n "$elf" | awk '
    $1 == "Xen" {
        if (match($0, /\(0x[0-9a-f]+\)/)) type = substr($0, RSTART + 1, RLENGTH - 2);
        else if (/NT_VERSION/) type = "0x00000001"; else if (/NT_ARCH/) type = "0x00000002";
        else if (/BUILDID/) type = "0x00000004";
        else type = "?";
        xen = 1; next }
    xen && /description data:/ { sub(/.*description data: */, ""); gsub(/ /, ""); print type, $0; xen = 0 }')"
note() { awk -v t="$(printf '0x%08x' "$1")" '$1 == t { print $2; exit }' <<< "$notes"; }
hexstr() { printf '%s' "$1" | od -An -tx1 | tr -d ' \n'; echo -n 00; }
le64() { local v="${1#0x}" r="" i; v="$(printf '%016x' "$((16#$v))")"; for i in 14 12 10 8 6 4 2 0; do r+="${v:$i:2}"; done; echo "$r"; }
addr() {
    local a; a="$(nm "$elf" | awk -v f="$1" '$3 == f { print $1 }')"
    [ -n "$a" ] || fail "no symbol $1"
    echo "$a"
}
[ "$(note 6)" = "$(hexstr glass-pv)" ] || fail "XEN_ELFNOTE_GUEST_OS is not glass-pv: $(note 6)"
[ "$(note 5)" = "$(hexstr xen-3.0)" ] || fail "XEN_ELFNOTE_XEN_VERSION is not xen-3.0"
[ "$(note 8)" = "$(hexstr generic)" ] || fail "XEN_ELFNOTE_LOADER is not generic"
[ "$(note 3)" = "$(le64 0xffffffff80000000)" ] || fail "XEN_ELFNOTE_VIRT_BASE is not 0xffffffff80000000"
[ "$(note 4)" = "$(le64 0)" ] || fail "XEN_ELFNOTE_PADDR_OFFSET is not 0"
start="$(addr _start)"; hpage="$(addr hypercall_page)"
[ "$(note 1)" = "$(le64 "$start")" ] || fail "XEN_ELFNOTE_ENTRY is not _start ($start)"
[ "$(note 2)" = "$(le64 "$hpage")" ] || fail "XEN_ELFNOTE_HYPERCALL_PAGE is not hypercall_page ($hpage)"
(( (16#$hpage & 0xfff) == 0 )) || fail "hypercall_page is not page-aligned"
entry="$(readelf -h "$elf" | awk '/Entry point address/ { print $NF }')"
(( entry == 16#$start )) || fail "the ELF entry $entry is not _start ($start)"
# Xen's own parser (xen-utils), where installed: the domain builder reads the same notes.
readnotes=/usr/lib/xen-4.17/bin/readnotes
if [ -x "$readnotes" ]; then
    "$readnotes" "$elf" | grep 'GUEST_OS: glass-pv' >/dev/null || fail "Xen's readnotes does not parse the notes"
fi

# The functions: symbols, each covered by an FDE in .eh_frame.
fdes="$(readelf --debug-dump=frames "$elf" | awk '
    /^Contents of the \.eh_frame section/ { sec = "eh_frame" }
    /^Contents of the \.debug_frame section/ { sec = "debug_frame" }
    / FDE / { split($NF, r, "[=.]+"); print sec, r[2], r[3] }')"
covered() {
    local sec s e
    while read -r sec s e; do
        if [ "$sec" = "$1" ] && (( 16#$s <= 16#$2 && 16#$2 < 16#$e )); then return 0; fi
    done <<< "$fdes"
    return 1
}
for f in kmain run dispatch alpha beta gamma descend idle_wait checkpoint delta ap_main do_event \
         mix_block _start ap_entry hypervisor_callback failsafe_callback; do
    covered eh_frame "$(addr "$f")" || fail "$f has no FDE in .eh_frame"
done
# the C functions keep a frame pointer: push %rbp, later mov %rsp,%rbp, before any call
# (gcc schedules other instructions in between)
for f in run dispatch alpha beta gamma descend idle_wait delta; do
    code="$(objdump -d --no-show-raw-insn --disassemble="$f" "$elf")"
    grep -P '^\s*[0-9a-f]+:\t' <<< "$code" | awk '/call/ { done = 1 } !done { print }' | tr -s ' \t' ' ' \
        | tr '\n' ';' | grep 'push %rbp;.*mov %rsp,%rbp' >/dev/null || fail "$f does not set up a frame pointer"
done
# idle_wait blocks through the hypercall page, as Linux and Mini-OS do
objdump -d --no-show-raw-insn --disassemble=idle_wait "$elf" | grep 'call.*hypercall_page' >/dev/null \
    || fail "idle_wait does not call into the hypercall page"
echo "guests/xenpv/build.sh: $elf ok (entry $entry, hypercall page 0x$hpage)"
