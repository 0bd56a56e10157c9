#!/usr/bin/env bash
# Builds the demo unikernel as a Xen PV guest (x86-64), with the machine's gcc and ld:
#   OUT/uk-pv.elf   64-bit PV kernel ELF for Xen's domain builder (xl create, type="pv",
#                   kernel="OUT/uk-pv.elf"), with symbols and DWARF (give it to --symbols)
#   OUT/uk-pv-nofp.elf, OUT/uk-hvm-nofp.elf   the Unikraft-style builds (nofp, below)
# C (kernel.c) is compiled (fp, the default) -O2 -g -fno-omit-frame-pointer with gcc's
# default asynchronous unwind tables, so both frame pointers and .eh_frame unwind it;
# head.S has .cfi_* directives; the link has --eh-frame-hdr. Linked at 0xffffffff80000000
# (link.ld).
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
# the entry point, DWARF, .eh_frame/.eh_frame_hdr or (nofp) .debug_frame are not as
# expected.
# Usage: guests/xenpv/build.sh OUT [ROUNDS] [pv|hvm] [fp|nofp]     (ROUNDS 0 = run forever)
# XENPV_DEFINES adds -D options to kernel.c's build: "-DSTART_IDLE_MS=8000 -DEXACT_ROUNDS=200"
# makes the exact-count build (idle 8 s before the first round, and HOLD_MS idle after
# round 200 before the work goes on: crates/glass/tests/xen_trace_dom0.sh traces those
# 200 rounds whole).
#
# hvm builds OUT/uk-hvm.elf instead: the same work as a PVH/HVM guest (-DXEN_HVM), loaded
# by physical address from 1 MiB and entered at pvh_start in 32-bit protected mode
# (XEN_ELFNOTE_PHYS32_ENTRY): xl type="pvh" kernel=uk-hvm.elf, or type="hvm" with
# firmware_override=uk-hvm.elf (it then runs in place of hvmloader). It makes its own
# page tables (physical 0-4 GiB at 0 and 0-2 GiB at VIRT_BASE, 2 MiB pages), fills its
# hypercall page through Xen's CPUID/MSR interface (vmcall/vmmcall stubs), prints to
# the PV console where the toolstack gave one (HVM_PARAM_CONSOLE_PFN) and to Xen's
# debug port 0xe9 otherwise, waits in SCHEDOP_poll with a timeout instead of
# SCHEDOP_block, and starts vCPU1 in long mode (VCPUOP_initialise, VCPU_HVM_MODE_64B).
#
# nofp builds the same guest the way Unikraft builds its images (as guests/unikernel does
# for QEMU): kernel.c with -fomit-frame-pointer -fno-asynchronous-unwind-tables
# -fno-unwind-tables, still -g, so its C functions have no frame-pointer chain and their
# CFI is only in .debug_frame; head.S keeps its .cfi_* directives, so .eh_frame and
# .eh_frame_hdr still exist for the assembly. A profiler must then unwind the C by
# .debug_frame. Outputs are named apart, OUT/uk-pv-nofp.elf and OUT/uk-hvm-nofp.elf, so
# both builds can share OUT. The checks below then require each C function to have an
# FDE in .debug_frame, none in .eh_frame, and CFI that never computes the CFA from %rbp.
set -euo pipefail
# (No `grep -q` at the end of a pipe: it stops reading at the first match, the writer
# dies of SIGPIPE, and pipefail turns that into a failure now and then.)
here="$(cd "$(dirname "$0")" && pwd)"
out="$1"; rounds="${2:-0}"; mode="${3:-pv}"; frames="${4:-fp}"
usage() { echo "usage: $0 OUT [ROUNDS] [pv|hvm] [fp|nofp]" >&2; exit 2; }
mkdir -p "$out"
case "$frames" in
fp) unwind=(-fno-omit-frame-pointer); suffix= ;;
nofp) unwind=(-fomit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables); suffix=-nofp ;;
*) usage ;;
esac
case "$mode" in
pv) defs=(); name=uk-pv$suffix; script="$here/link.ld" ;;
hvm)
    defs=(-DXEN_HVM); name=uk-hvm$suffix; script="$out/$name.ld"
    sed -e 's/^LOAD_PHYS = 0;/LOAD_PHYS = 0x100000;/' -e 's/^ENTRY(_start)/ENTRY(pvh_start)/' \
        "$here/link.ld" >"$script"
    ;;
*) usage ;;
esac

gcc -O2 -g -ffreestanding -fno-pic -fno-pie -mcmodel=kernel -mno-red-zone -fno-stack-protector \
    -mno-sse -mno-mmx -mno-80387 "${unwind[@]}" -fcf-protection=none \
    -Wall -Wextra -DROUNDS="$rounds" "${defs[@]}" ${XENPV_DEFINES:-} \
    -c "$here/kernel.c" -o "$out/$name-kernel.o"
gcc -g "${defs[@]}" -c "$here/head.S" -Wa,--noexecstack -o "$out/$name-head.o"
ld -nostdlib -z max-page-size=4096 --eh-frame-hdr --build-id -T "$script" \
    -o "$out/$name.elf" "$out/$name-head.o" "$out/$name-kernel.o"

# --- checks ---------------------------------------------------------------------------
fail() { echo "guests/xenpv/build.sh: $*" >&2; exit 1; }
elf="$out/$name.elf"
readelf -h "$elf" | grep 'Class: *ELF64' >/dev/null || fail "not ELF64"
readelf -h "$elf" | grep 'Machine: *Advanced Micro Devices X86-64' >/dev/null || fail "not x86-64"
readelf -l -W "$elf" | grep '^ *NOTE ' >/dev/null || fail "no PT_NOTE program header"
readelf -l -W "$elf" | grep 'GNU_EH_FRAME' >/dev/null || fail "no PT_GNU_EH_FRAME program header"
sections=(.eh_frame .eh_frame_hdr .debug_info .debug_line .symtab)
[ "$frames" = fp ] || sections+=(.debug_frame)
for s in "${sections[@]}"; do
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
le32() { local v="${1#0x}" r="" i; v="$(printf '%08x' "$((16#$v))")"; for i in 6 4 2 0; do r+="${v:$i:2}"; done; echo "$r"; }
if [ "$mode" = pv ]; then
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

else
[ "$(note 6)" = "$(hexstr glass-hvm)" ] || fail "XEN_ELFNOTE_GUEST_OS is not glass-hvm: $(note 6)"
pvh="$(addr pvh_start)"
pvh_phys="$(printf '%x' $((16#$pvh - 0xffffffff80000000)))"
[ "$(note 18)" = "$(le32 "$pvh_phys")" ] || fail "XEN_ELFNOTE_PHYS32_ENTRY is not pvh_start's physical address ($pvh_phys): $(note 18)"
readelf -l -W "$elf" | awk '$1 == "LOAD" { print $4 }' | grep -x '0x0*100000' >/dev/null \
    || fail "the image is not loaded at physical 1 MiB"
fi
# The functions: symbols, each covered by an FDE: the assembly's in .eh_frame, the C's in
# .eh_frame (fp) or only in .debug_frame (nofp, where an .eh_frame FDE would let a
# profiler pass without reading .debug_frame at all). One line per FDE: "section start
# end rbp", rbp 1 where the FDE ever computes the CFA from %rbp (a frame pointer).
fdes="$(readelf --debug-dump=frames "$elf" | awk '
    function flush() { if (fde) print sec, start, end, rbp; fde = 0 }
    /^Contents of the \.eh_frame section/ { flush(); sec = "eh_frame" }
    /^Contents of the \.debug_frame section/ { flush(); sec = "debug_frame" }
    / CIE$/ { flush() }
    / FDE / { flush(); split($NF, r, "[=.]+"); start = r[2]; end = r[3]; rbp = 0; fde = 1 }
    /DW_CFA_def_cfa(_register)?: r6 / { rbp = 1 }
    END { flush() }')"
# covered SECTION ADDRESS: whether an FDE of SECTION covers ADDRESS; sets by_rbp to its rbp.
covered() {
    local sec s e r
    while read -r sec s e r; do
        if [ "$sec" = "$1" ] && (( 16#$s <= 16#$2 && 16#$2 < 16#$e )); then by_rbp=$r; return 0; fi
    done <<< "$fdes"
    return 1
}
if [ "$mode" = pv ]; then c_entry=kmain; asm_entry=_start; else c_entry=kmain_hvm; asm_entry=pvh_high; fi
for f in "$asm_entry" mix_block ap_entry hypervisor_callback failsafe_callback; do
    covered eh_frame "$(addr "$f")" || fail "$f has no FDE in .eh_frame"
done
for f in "$c_entry" run dispatch alpha beta gamma descend idle_wait checkpoint delta ap_main do_event; do
    a="$(addr "$f")"
    if [ "$frames" = fp ]; then
        covered eh_frame "$a" || fail "$f has no FDE in .eh_frame"
    else
        ! covered eh_frame "$a" || fail "$f has an FDE in .eh_frame"
        covered debug_frame "$a" || fail "$f has no FDE in .debug_frame"
        # No frame pointer, by gcc's own CFI: the instructions cannot tell, as %rbp is a
        # general register there (descend copies %rsp into it to address its array).
        [ "$by_rbp" = 0 ] || fail "$f computes its CFA from %rbp: a frame pointer"
    fi
done
if [ "$frames" = fp ]; then
    # the C functions keep a frame pointer: push %rbp, later mov %rsp,%rbp, before any call
    # (gcc schedules other instructions in between)
    for f in run dispatch alpha beta gamma descend idle_wait delta; do
        code="$(objdump -d --no-show-raw-insn --disassemble="$f" "$elf")"
        grep -P '^\s*[0-9a-f]+:\t' <<< "$code" | awk '/call/ { done = 1 } !done { print }' | tr -s ' \t' ' ' \
            | tr '\n' ';' | grep 'push %rbp;.*mov %rsp,%rbp' >/dev/null || fail "$f does not set up a frame pointer"
    done
fi
# idle_wait blocks through the hypercall page, as Linux and Mini-OS do
objdump -d --no-show-raw-insn --disassemble=idle_wait "$elf" | grep 'call.*hypercall_page' >/dev/null \
    || fail "idle_wait does not call into the hypercall page"
echo "guests/xenpv/build.sh: $elf ok (entry $(readelf -h "$elf" | awk '/Entry point address/ { print $NF }'), hypercall page 0x$(addr hypercall_page))"
