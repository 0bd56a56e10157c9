//! The x86-64 probe path: the probes in assembly, the hardware counters read with rdpmc,
//! and the C++ unwinder's hooks (see the crate's first comment for the design).

use super::*;

const KEYED_WORD: u64 = 1 << glass_probe_abi::KEYED_BIT;

// Register use in the probe path: rsi = this thread's area, rdi = the slot. Every
// caller-saved general register is preserved: at a function's entry any of them may
// carry an argument (r10: static chain, rax: vector-argument count), and at its return
// rax/rdx carry the result (some runtime helpers promise to preserve all of them).
core::arch::global_asm!(
    // The thread's area: 0 before its first probe, 1 when it could not get one.
    ".section .tbss,\"awT\",@nobits",
    ".p2align 3",
    ".globl glass_thread_area",
    ".hidden glass_thread_area",
    ".type glass_thread_area, @object",
    ".size glass_thread_area, 8",
    "glass_thread_area:",
    ".zero 8",
    ".text",
    // ---------------------------------------------------------------------------------
    // glass_record: appends one record (and the thread's hardware counters, if the
    // session has any). In: rsi = area, r8 = the record without its time.
    // Out: eax = 0 written, 1 dropped. Clobbers rax, rcx, rdx, r8.
    ".p2align 4",
    ".globl glass_record",
    ".hidden glass_record",
    ".type glass_record, @function",
    "glass_record:",
    "mov rcx, [rsi + {cursor}]",
    "mov rax, [rsi + {record_words}]",
    "add rax, rcx",
    "cmp rax, [rsi + {limit}]",
    "jbe 2f",
    // The cached limit ran out: glass may have consumed since.
    "mov rdx, [rsi + {tail}]",
    "add rdx, [rsi + {mask}]",
    "inc rdx",
    "mov [rsi + {limit}], rdx",
    "cmp rax, rdx",
    "jbe 2f",
    // Full: publish what there is, count the loss, never wait.
    "mov [rsi + {head}], rcx",
    "inc qword ptr [rsi + {lost}]",
    "mov eax, 1",
    "ret",
    "2:",
    "rdtsc",
    "shl rdx, 32",
    "or rax, rdx",
    "shl rax, 20",
    "shr rax, 20",
    "or rax, r8",
    "mov rdx, rcx",
    "and rdx, [rsi + {mask}]",
    "mov [rsi + rdx*8 + {records}], rax",
    "inc rcx",
    "cmp qword ptr [rsi + {record_words}], 1",
    "jne 5f",
    "4:",
    "mov [rsi + {cursor}], rcx",
    "test cl, {publish_mask}",
    "jnz 3f",
    // x86 stores are not reordered with earlier stores: the records are visible first.
    "mov [rsi + {head}], rcx",
    "3:",
    "xor eax, eax",
    "ret",
    // Hardware counters: each read from user space with rdpmc under the seqlock of the
    // thread's perf_event page (see glass_probe_abi::pmc); r8 = next word.
    "5:",
    "push r9",
    "push r10",
    "push r11",
    "mov r8, rcx",
    "xor r11d, r11d",
    "6:",
    "mov r9, [rsi + r11*8 + {pmc_pages}]",
    "7:",
    "mov r10d, [r9 + {page_lock}]",
    "mov ecx, [r9 + {page_index}]",
    "xor eax, eax",
    "test ecx, ecx",
    "jz 8f",
    "dec ecx",
    "rdpmc",
    "shl rdx, 32",
    "or rax, rdx",
    "movzx ecx, word ptr [r9 + {page_width}]",
    "neg ecx",
    "add ecx, 64",
    "shl rax, cl",
    "sar rax, cl",
    "8:",
    "add rax, [r9 + {page_offset}]",
    "cmp r10d, [r9 + {page_lock}]",
    "jne 7b",
    "mov rdx, r8",
    "and rdx, [rsi + {mask}]",
    "mov [rsi + rdx*8 + {records}], rax",
    "inc r8",
    "inc r11",
    "lea rax, [r11 + 1]",
    "cmp rax, [rsi + {record_words}]",
    "jb 6b",
    "mov rcx, r8",
    "pop r11",
    "pop r10",
    "pop r9",
    "jmp 4b",
    ".size glass_record, . - glass_record",
    // ---------------------------------------------------------------------------------
    // glass_record_c(area, word) -> dropped: glass_record for Rust.
    ".p2align 4",
    ".globl glass_record_c",
    ".hidden glass_record_c",
    "glass_record_c:",
    "mov r8, rsi",
    "mov rsi, rdi",
    "jmp glass_record",
    // ---------------------------------------------------------------------------------
    // glass_thread_area_ptr() -> address of this thread's area word.
    ".p2align 4",
    ".globl glass_thread_area_ptr",
    ".hidden glass_thread_area_ptr",
    "glass_thread_area_ptr:",
    "mov rax, [rip + glass_thread_area@GOTTPOFF]",
    "add rax, fs:[0]",
    "ret",
    // glass_thread_area_offset() -> the area word's offset from the thread pointer.
    ".p2align 4",
    ".globl glass_thread_area_offset",
    ".hidden glass_thread_area_offset",
    "glass_thread_area_offset:",
    "mov rax, [rip + glass_thread_area@GOTTPOFF]",
    "ret",
    // ---------------------------------------------------------------------------------
    // glass_enter: called by a trampoline. Stack: [rsp] return into the trampoline,
    // [rsp+8] the function id (pushed by the trampoline), [rsp+16] the slot.
    ".p2align 4",
    ".globl glass_enter",
    ".type glass_enter, @function",
    "glass_enter:",
    "push rax",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "mov r8, [rip + glass_thread_area@GOTTPOFF]",
    "mov rsi, fs:[r8]",
    "cmp rsi, 1",
    "jbe 40f",
    "10:",
    "cmp qword ptr [rsi + {busy}], 0",
    "jne 45f",
    "mov qword ptr [rsi + {busy}], 1",
    "lea rdi, [rsp + 88]",
    // Is the top shadow entry a frame that is gone (longjmp, exception)?
    "mov rcx, [rsi + {depth}]",
    "test rcx, rcx",
    "jz 20f",
    "lea rax, [rcx + rcx*2]",
    "lea r9, [rsi + rax*8 + {shadow} - {entry}]",
    "mov rdx, [r9]",
    "cmp rdx, rdi",
    "ja 20f",
    "jb 11f",
    // Same slot: a tail call from the top function if the slot still holds the stub.
    "mov rax, [rdi]",
    "lea rdx, [rip + glass_exit_stub]",
    "cmp rax, rdx",
    "je 20f",
    "11:",
    // On a signal's alternate stack the slots of the interrupted frames may lie anywhere:
    // leave them alone.
    "push rsi",
    "push rdi",
    "sub rsp, 24",
    "mov eax, 131",
    "xor edi, edi",
    "mov rsi, rsp",
    "syscall",
    "mov eax, [rsp + 8]",
    "add rsp, 24",
    "pop rdi",
    "pop rsi",
    "test eax, 1",
    "jnz 20f",
    "12:",
    // Pop the top entry as unwound.
    "mov rcx, [rsi + {depth}]",
    "dec rcx",
    "mov [rsi + {depth}], rcx",
    "lea rax, [rcx + rcx*2]",
    "mov r8d, dword ptr [rsi + rax*8 + {shadow} + {entry_id}]",
    "shl r8, {function_shift}",
    "mov rax, {unwound_word}",
    "or r8, rax",
    "inc qword ptr [rsi + {unwound}]",
    "call glass_record",
    // And look again.
    "mov rcx, [rsi + {depth}]",
    "test rcx, rcx",
    "jz 20f",
    "lea rax, [rcx + rcx*2]",
    "lea r9, [rsi + rax*8 + {shadow} - {entry}]",
    "mov rdx, [r9]",
    "cmp rdx, rdi",
    "ja 20f",
    "jb 12b",
    "mov rax, [rdi]",
    "lea rdx, [rip + glass_exit_stub]",
    "cmp rax, rdx",
    "jne 12b",
    "20:",
    // Push: record the entry, then take over the slot.
    "mov rcx, [rsi + {depth}]",
    "cmp rcx, {shadow_capacity}",
    "jae 30f",
    "mov r8, [rsp + 80]",
    "shl r8, {function_shift}",
    "call glass_record",
    "test eax, eax",
    "jnz 31f",
    "mov rcx, [rsi + {depth}]",
    "lea rax, [rcx + rcx*2]",
    "lea r9, [rsi + rax*8 + {shadow}]",
    "mov [r9], rdi",
    "mov rax, [rdi]",
    "mov [r9 + 8], rax",
    "mov eax, dword ptr [rsp + 80]",
    "mov [r9 + {entry_id}], rax",
    "inc rcx",
    "mov [rsi + {depth}], rcx",
    // A call timed at its return sites keeps its return address.
    "test dword ptr [rsp + 80], {site_id}",
    "jnz 25f",
    "lea rax, [rip + glass_exit_stub]",
    "mov [rdi], rax",
    "25:",
    "mov qword ptr [rsi + {busy}], 0",
    "26:",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rdi",
    "pop rsi",
    "pop rdx",
    "pop rcx",
    "pop rax",
    "ret 8",
    // Shadow stack full: not traced.
    "30:",
    "inc qword ptr [rsi + {skipped}]",
    "jmp 25b",
    // Entry dropped (ring full): its exit is not recorded either.
    "31:",
    "inc qword ptr [rsi + {lost}]",
    "jmp 25b",
    // First probe of this thread (rsi = 0), or it has no area (rsi = 1).
    "40:",
    "call glass_claim_area",
    "cmp rsi, 1",
    "jbe 26b",
    "jmp 10b",
    // A probe of this thread is running (a signal arrived inside it): not traced.
    "45:",
    "inc qword ptr [rsi + {skipped}]",
    "jmp 26b",
    ".size glass_enter, . - glass_enter",
    // ---------------------------------------------------------------------------------
    // glass_claim_area: a thread's first probe claims an area (rsi = 0), or finds it has
    // none (rsi = 1). In: r8 = the area word's offset from fs. Out: rsi = the area, or 1.
    // Clobbers rax, rcx, rdx, r11.
    ".p2align 4",
    ".globl glass_claim_area",
    ".hidden glass_claim_area",
    ".type glass_claim_area, @function",
    "glass_claim_area:",
    "mov rax, [rip + {shm}]",
    "test rax, rax",
    "jz 42f",
    "cmp rsi, 1",
    "je 41f",
    "mov ecx, 1",
    "lock xadd [rax + {next_area}], rcx",
    "cmp rcx, [rax + {area_count}]",
    "jae 41f",
    "imul rcx, [rax + {area_stride}]",
    "lea rsi, [rax + rcx + {header_size}]",
    "mov eax, 186",
    "syscall",
    "mov [rsi + {tid}], rax",
    "mov eax, 39",
    "syscall",
    "mov [rsi + {pid}], rax",
    "mov qword ptr [rsi + {claimed}], 1",
    "mov fs:[r8], rsi",
    // The thread's own counters, if the session records any: opened in Rust, once, with
    // the vector registers (arguments of the traced function) saved around it.
    "mov rax, [rip + {shm}]",
    "cmp qword ptr [rax + {counters}], 0",
    "je 43f",
    "mov rdx, rsp",
    "and rsp, -16",
    "sub rsp, 144",
    "mov [rsp + 128], rdx",
    "movdqu [rsp], xmm0",
    "movdqu [rsp + 16], xmm1",
    "movdqu [rsp + 32], xmm2",
    "movdqu [rsp + 48], xmm3",
    "movdqu [rsp + 64], xmm4",
    "movdqu [rsp + 80], xmm5",
    "movdqu [rsp + 96], xmm6",
    "movdqu [rsp + 112], xmm7",
    "push rsi",
    "push rsi",
    "mov rdi, rsi",
    "call {open_counters}",
    "pop rsi",
    "pop rsi",
    "movdqu xmm0, [rsp]",
    "movdqu xmm1, [rsp + 16]",
    "movdqu xmm2, [rsp + 32]",
    "movdqu xmm3, [rsp + 48]",
    "movdqu xmm4, [rsp + 64]",
    "movdqu xmm5, [rsp + 80]",
    "movdqu xmm6, [rsp + 96]",
    "movdqu xmm7, [rsp + 112]",
    "mov rsp, [rsp + 128]",
    "43:",
    "ret",
    "41:",
    "lock inc qword ptr [rax + {no_area_lost}]",
    "42:",
    "mov qword ptr fs:[r8], 1",
    "mov esi, 1",
    "ret",
    ".size glass_claim_area, . - glass_claim_area",
    // ---------------------------------------------------------------------------------
    // glass_record_keyed: appends a Go probe's record, three words (see
    // glass_probe_abi::KEYED_BIT), published at once: the goroutine may go on on another
    // thread, whose records glass must not see first. In: rsi = area, r8 = the record
    // without its time, r9 = g, r10 = depth. Clobbers rax, rcx, rdx.
    ".p2align 4",
    ".globl glass_record_keyed",
    ".hidden glass_record_keyed",
    "glass_record_keyed:",
    "mov rcx, [rsi + {cursor}]",
    "lea rax, [rcx + 3]",
    "cmp rax, [rsi + {limit}]",
    "jbe 2f",
    "mov rdx, [rsi + {tail}]",
    "add rdx, [rsi + {mask}]",
    "inc rdx",
    "mov [rsi + {limit}], rdx",
    "cmp rax, rdx",
    "jbe 2f",
    "mov [rsi + {head}], rcx",
    "inc qword ptr [rsi + {lost}]",
    "ret",
    "2:",
    "rdtsc",
    "shl rdx, 32",
    "or rax, rdx",
    "shl rax, 20",
    "shr rax, 20",
    "or rax, r8",
    "mov rdx, rcx",
    "and rdx, [rsi + {mask}]",
    "mov [rsi + rdx*8 + {records}], rax",
    "lea rdx, [rcx + 1]",
    "and rdx, [rsi + {mask}]",
    "mov [rsi + rdx*8 + {records}], r9",
    "lea rdx, [rcx + 2]",
    "and rdx, [rsi + {mask}]",
    "mov [rsi + rdx*8 + {records}], r10",
    "add rcx, 3",
    "mov [rsi + {cursor}], rcx",
    "mov [rsi + {head}], rcx",
    "ret",
    ".size glass_record_keyed, . - glass_record_keyed",
    // ---------------------------------------------------------------------------------
    // glass_site_enter, glass_site_exit: the probes of Go functions, called by a trampoline
    // at the function's entry and at each of its returns. Neither touches the return
    // address: the Go runtime reads and moves every frame itself. Stack: [rsp] return
    // into the trampoline, [rsp+8] the function id (pushed by the trampoline), [rsp+16]
    // the slot (the return address's word). They take 88 bytes of the goroutine's stack,
    // within the 128 Go keeps below any frame for functions that do not check.
    ".p2align 4",
    ".globl glass_site_enter",
    ".type glass_site_enter, @function",
    "glass_site_enter:",
    "push rax",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "xor edi, edi",
    "jmp 60f",
    ".size glass_site_enter, . - glass_site_enter",
    ".p2align 4",
    ".globl glass_site_exit",
    ".type glass_site_exit, @function",
    "glass_site_exit:",
    "push rax",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "mov rdi, {exit_word}",
    "60:",
    "mov r8, [rip + glass_thread_area@GOTTPOFF]",
    "mov rsi, fs:[r8]",
    "cmp rsi, 1",
    "ja 61f",
    "push rdi",
    "call glass_claim_area",
    "pop rdi",
    "cmp rsi, 1",
    "jbe 66f",
    "61:",
    "cmp qword ptr [rsi + {busy}], 0",
    "jne 65f",
    "mov qword ptr [rsi + {busy}], 1",
    "mov r8, [rsp + 80]",
    "shl r8, {function_shift}",
    "or r8, rdi",
    "mov rax, {keyed_word}",
    "or r8, rax",
    // The key: the goroutine and the slot relative to its stack's top (plus 2^62: the
    // same wherever the runtime moves the stack); off any goroutine's stack (a signal
    // handler's first frames, code on a stack the runtime has not switched g to), the
    // thread pointer and the slot itself.
    "lea rdi, [rsp + 88]",
    "mov r10, rdi",
    "mov r9, fs:[0]",
    "mov rax, [rip + {shm}]",
    "mov rcx, [rax + {go_g_offset}]",
    "test rcx, rcx",
    "jz 62f",
    "mov rax, fs:[rcx]",
    "test rax, rax",
    "jz 62f",
    "cmp rdi, [rax]",
    "jb 62f",
    "cmp rdi, [rax + 8]",
    "jae 62f",
    "mov r9, rax",
    "sub r10, [rax + 8]",
    "mov rax, {stack_relative}",
    "add r10, rax",
    "62:",
    "call glass_record_keyed",
    "mov qword ptr [rsi + {busy}], 0",
    "66:",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rdi",
    "pop rsi",
    "pop rdx",
    "pop rcx",
    "pop rax",
    "ret 8",
    "65:",
    "inc qword ptr [rsi + {skipped}]",
    "jmp 66b",
    ".size glass_site_exit, . - glass_site_exit",
    // ---------------------------------------------------------------------------------
    // glass_exit_stub: where hijacked returns land; rsp is just above the slot.
    ".p2align 4",
    ".globl glass_exit_stub",
    ".type glass_exit_stub, @function",
    "glass_exit_stub:",
    "sub rsp, 8",
    "push rax",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "lea rdi, [rsp + 72]",
    "mov rsi, [rip + glass_thread_area@GOTTPOFF]",
    "mov rsi, fs:[rsi]",
    "mov r11, [rsi + {busy}]",
    "mov qword ptr [rsi + {busy}], 1",
    "xor r10d, r10d",
    "50:",
    "mov rcx, [rsi + {depth}]",
    "test rcx, rcx",
    "jz 55f",
    "lea rax, [rcx + rcx*2]",
    "lea r9, [rsi + rax*8 + {shadow} - {entry}]",
    "mov rdx, [r9]",
    "cmp rdx, rdi",
    "ja 55f",
    "dec rcx",
    "mov [rsi + {depth}], rcx",
    "mov r8d, dword ptr [r9 + {entry_id}]",
    "shl r8, {function_shift}",
    "cmp rdx, rdi",
    "jb 52f",
    // This call's entry (or, after a tail call, one of the calls sharing the slot).
    "mov r10, [r9 + 8]",
    "mov rax, {exit_word}",
    "or r8, rax",
    "test r11, r11",
    "jnz 50b",
    "call glass_record",
    "jmp 50b",
    // Deeper entries whose frames are gone.
    "52:",
    "mov rax, {unwound_word}",
    "or r8, rax",
    "inc qword ptr [rsi + {unwound}]",
    "test r11, r11",
    "jnz 50b",
    "call glass_record",
    "jmp 50b",
    "55:",
    "test r10, r10",
    "jz 58f",
    "mov [rdi], r10",
    "mov [rsi + {busy}], r11",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rdi",
    "pop rsi",
    "pop rdx",
    "pop rcx",
    "pop rax",
    "ret",
    // No entry for this slot: the real return address is lost. Cannot happen unless the
    // program rewrote its own return address; stop loudly rather than jump anywhere.
    "58:",
    "ud2",
    ".size glass_exit_stub, . - glass_exit_stub",
    // ---------------------------------------------------------------------------------
    // glass_site_return: native code's probe at a return site (glass_patch::
    // return_sites), called by the return's trampoline just before its `ret`: the call's
    // entry, which glass_enter pushed flagged with SITE_ID_BIT and without taking its
    // return address, is popped and its exit recorded; deeper entries are gone
    // (longjmp, an exception) and recorded as unwound. An entry at the same slot without
    // the flag is a caller's that tail-called this function: its own exit stub pops it.
    // Stack: [rsp] return into the trampoline, [rsp+8] the function id, [rsp+16] the slot.
    ".p2align 4",
    ".globl glass_site_return",
    ".type glass_site_return, @function",
    "glass_site_return:",
    "push rax",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "lea rdi, [rsp + 88]",
    "mov rsi, [rip + glass_thread_area@GOTTPOFF]",
    "mov rsi, fs:[rsi]",
    "cmp rsi, 1",
    "jbe 78f",
    "mov r11, [rsi + {busy}]",
    "mov qword ptr [rsi + {busy}], 1",
    "70:",
    "mov rcx, [rsi + {depth}]",
    "test rcx, rcx",
    "jz 77f",
    "lea rax, [rcx + rcx*2]",
    "lea r9, [rsi + rax*8 + {shadow} - {entry}]",
    "mov rdx, [r9]",
    "cmp rdx, rdi",
    "ja 77f",
    "jb 72f",
    "test dword ptr [r9 + {entry_id}], {site_id}",
    "jz 77f",
    "dec rcx",
    "mov [rsi + {depth}], rcx",
    "mov r8d, dword ptr [r9 + {entry_id}]",
    "shl r8, {function_shift}",
    "mov rax, {exit_word}",
    "or r8, rax",
    "test r11, r11",
    "jnz 77f",
    "call glass_record",
    "jmp 77f",
    "72:",
    "dec rcx",
    "mov [rsi + {depth}], rcx",
    "mov r8d, dword ptr [r9 + {entry_id}]",
    "shl r8, {function_shift}",
    "mov rax, {unwound_word}",
    "or r8, rax",
    "inc qword ptr [rsi + {unwound}]",
    "test r11, r11",
    "jnz 70b",
    "call glass_record",
    "jmp 70b",
    "77:",
    "mov [rsi + {busy}], r11",
    "78:",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rdi",
    "pop rsi",
    "pop rdx",
    "pop rcx",
    "pop rax",
    "ret 8",
    ".size glass_site_return, . - glass_site_return",
    cursor = const area::CURSOR,
    limit = const area::LIMIT,
    tail = const area::TAIL,
    head = const area::HEAD,
    mask = const area::MASK,
    lost = const area::LOST,
    records = const area::RECORDS,
    publish_mask = const glass_probe_abi::PUBLISH_EVERY - 1,
    busy = const area::BUSY,
    depth = const area::DEPTH,
    shadow = const area::SHADOW,
    entry = const area::SHADOW_ENTRY,
    entry_id = const ENTRY_ID,
    shadow_capacity = const area::SHADOW_CAPACITY,
    function_shift = const FUNCTION_SHIFT,
    unwound_word = const UNWOUND_WORD,
    exit_word = const EXIT_WORD,
    keyed_word = const KEYED_WORD,
    site_id = const 1u32 << glass_probe_abi::SITE_ID_BIT,
    go_g_offset = const header::GO_G_OFFSET,
    stack_relative = const 1u64 << 62,
    unwound = const area::UNWOUND,
    skipped = const area::SKIPPED,
    next_area = const header::NEXT_AREA,
    area_count = const header::AREA_COUNT,
    area_stride = const header::AREA_STRIDE,
    header_size = const header::SIZE,
    no_area_lost = const header::NO_AREA_LOST,
    tid = const area::TID,
    pid = const area::PID,
    claimed = const area::CLAIMED,
    record_words = const area::RECORD_WORDS,
    pmc_pages = const area::PMC_PAGES,
    page_lock = const glass_probe_abi::pmc::page::LOCK,
    page_index = const glass_probe_abi::pmc::page::INDEX,
    page_offset = const glass_probe_abi::pmc::page::OFFSET,
    page_width = const glass_probe_abi::pmc::page::PMC_WIDTH,
    counters = const header::COUNTERS,
    open_counters = sym open_counters,
    shm = sym SHM,
);

// ---------------------------------------------------------------------------------------
// Hardware counters: each thread opens its own events (perf_event_open on itself) the
// first time it hits a probe, and maps their pages for rdpmc. A counter that cannot be
// opened reads as zero from a blank page (index 0, offset 0) rather than failing the
// thread.

#[repr(C, align(4096))]
struct BlankPage([u8; 4096]);
static BLANK_PAGE: BlankPage = BlankPage([0; 4096]);

pub(crate) extern "C" fn open_counters(area: *mut u8) {
    // SAFETY: `area` is this thread's claimed area; the header describes the counters.
    unsafe {
        let shm = SHM.load(Ordering::Acquire);
        let count = (word(shm, header::COUNTERS).load(Ordering::Relaxed) as usize)
            .min(glass_probe_abi::MAX_COUNTERS);
        for i in 0..count {
            let kind = word(shm, header::COUNTER_CONFIG + 16 * i).load(Ordering::Relaxed);
            let config = word(shm, header::COUNTER_CONFIG + 16 * i + 8).load(Ordering::Relaxed);
            let page = glass_probe_abi::pmc::open_page(kind as u32, config)
                .unwrap_or(BLANK_PAGE.0.as_ptr());
            *field(area, area::PMC_PAGES + 8 * i) = page as u64;
        }
    }
}

/// Called by the unwinder hooks with the caller's canonical frame address; returns the
/// real function to continue in.
extern "C" fn before_unwind(caller_cfa: u64, which: usize) -> *mut c_void {
    // SAFETY: the area is this thread's; its shadow slots are live stack words of frames
    // at or above the caller (checked against caller_cfa).
    unsafe {
        if let Some(area) = thread_area() {
            let busy = *field(area, area::BUSY);
            *field(area, area::BUSY) = 1;
            let stub = stub_address();
            let depth = *field(area, area::DEPTH);
            for index in (0..depth).rev() {
                let entry = shadow_entry(area, index);
                let slot = (*entry)[0] as *mut u64;
                if (*entry)[0] >= caller_cfa && *slot == stub {
                    *slot = (*entry)[1];
                    (*entry)[2] |= RESTORED;
                }
            }
            *field(area, area::BUSY) = busy;
        }
        real_function(which)
    }
}

/// Called after the real `__cxa_begin_catch`, with the catching frame's canonical frame
/// address: frames below it are gone, frames above it are live again.
extern "C" fn after_catch(catcher_cfa: u64) {
    // SAFETY: as in before_unwind.
    unsafe {
        let Some(area) = thread_area() else { return };
        let busy = *field(area, area::BUSY);
        *field(area, area::BUSY) = 1;
        let mut depth = *field(area, area::DEPTH);
        while depth > 0 {
            let entry = shadow_entry(area, depth - 1);
            if (*entry)[0] >= catcher_cfa {
                break;
            }
            depth -= 1;
            *field(area, area::DEPTH) = depth;
            *field(area, area::UNWOUND) += 1;
            if busy == 0 {
                let id = (*entry)[2] & 0xffff_ffff;
                glass_record_c(area, (id << FUNCTION_SHIFT) | UNWOUND_WORD);
            }
        }
        let stub = stub_address();
        for index in 0..depth {
            let entry = shadow_entry(area, index);
            let slot = (*entry)[0] as *mut u64;
            if (*entry)[2] & RESTORED != 0 {
                if *slot == (*entry)[1] {
                    *slot = stub;
                }
                (*entry)[2] &= !RESTORED;
            }
        }
        *field(area, area::BUSY) = busy;
    }
}

// The interposed entry points: tail-jump into the real function once the slots are
// restored, so no frame of the runtime sits between the thrower and the unwinder.
macro_rules! unwind_hook {
    ($name:ident, $which:expr) => {
        /// Interposes the unwinder's entry point of the same name.
        ///
        /// # Safety
        /// Called only by the C++ runtime, with that function's arguments.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                "push rdi",
                "push rsi",
                "push rdx",
                "push rcx",
                "sub rsp, 8",
                "lea rdi, [rsp + 48]",
                "mov esi, {which}",
                "call {before}",
                "add rsp, 8",
                "pop rcx",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "jmp rax",
                which = const $which,
                before = sym before_unwind,
            )
        }
    };
}

unwind_hook!(_Unwind_RaiseException, 0);
unwind_hook!(_Unwind_Resume, 1);
unwind_hook!(_Unwind_Resume_or_Rethrow, 2);
unwind_hook!(_Unwind_ForcedUnwind, 3);

extern "C" fn begin_catch_real() -> *mut c_void {
    // SAFETY: dlsym lookup.
    unsafe { real_function(BEGIN_CATCH) }
}

/// Interposes `__cxa_begin_catch`: a handler has been reached.
///
/// # Safety
/// Called only by compiled C++ catch blocks, with the exception object.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn __cxa_begin_catch() {
    core::arch::naked_asm!(
        "push rbx",
        "lea rbx, [rsp + 16]",
        "push rdi",
        "sub rsp, 8",
        "call {real}",
        "add rsp, 8",
        "pop rdi",
        "call rax",
        "push rax",
        "sub rsp, 8",
        "mov rdi, rbx",
        "call {after}",
        "add rsp, 8",
        "pop rax",
        "pop rbx",
        "ret",
        real = sym begin_catch_real,
        after = sym after_catch,
    )
}

extern "C" {
    fn glass_site_enter();
    fn glass_site_exit();
    fn glass_site_return();
}

/// The return-site probes' entries (Go's pair, then native code's return probe).
pub(crate) fn site_probes() -> [u64; 3] {
    [
        glass_site_enter as *const () as u64,
        glass_site_exit as *const () as u64,
        glass_site_return as *const () as u64,
    ]
}

/// Return addresses are never signed on x86-64 (see header::AS_HELD).
pub(crate) fn as_held_entry() -> u64 {
    0
}

/// Where a fatal fault happened.
pub(crate) fn fault_pc(context: &libc::ucontext_t) -> u64 {
    context.uc_mcontext.gregs[libc::REG_RIP as usize] as u64
}

/// Puts the real return address back in every slot of `entries` that still holds the
/// stub (a forked child left without an area of its own).
///
/// # Safety
/// Each entry's slot is a live stack word of this thread.
pub(crate) unsafe fn give_back_returns(entries: &[[u64; 3]]) {
    for entry in entries.iter().rev() {
        let slot = entry[0] as *mut u64;
        if *slot == stub_address() {
            *slot = entry[1];
        }
    }
}
