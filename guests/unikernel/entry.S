/* Assembly of the unikernel guest (the boot code is guests/demo/boot.S, built with
 * -DBOOT_SINGLE_VCPU). Everything here that a sample can land in is described by
 * .cfi_* directives, so the image's .eh_frame (and .eh_frame_hdr) covers it, while the
 * C code's CFI is only in .debug_frame:
 *   mix_block     the hot leaf under gamma (10% of busy time), a frame of 48 bytes
 *                 below the return address; no frame pointer, only CFI unwinds it
 *   timer_isr     the PIT's handler (vector 32): counts the tick, EOI, iretq
 *   spurious_isr  the other PIC vectors: iretq
 *   fault_stubs   32 stubs of 16 bytes (one per exception vector): guest_fault(vector)
 */

    .text

/* uint64_t mix_block(uint64_t seed, uint64_t iterations): the same LCG as the C spin
 * loop, one step per iteration (registers only, as in C: a store per step would make it
 * much slower under TCG), the result passed through the frame. */
    .globl mix_block
    .type mix_block, @function
    .align 16
mix_block:
    .cfi_startproc
    pushq %rbx
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %rbx, 0
    pushq %r12
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %r12, 0
    subq $32, %rsp
    .cfi_adjust_cfa_offset 32
    movabsq $6364136223846793005, %rbx
    movabsq $1442695040888963407, %r12
    movq %rdi, %rax
    orq $1, %rax
    testq %rsi, %rsi
    jz 2f
1:  imulq %rbx, %rax
    addq %r12, %rax
    subq $1, %rsi                  /* as the C loop: dec (CF kept) costs more under TCG */
    jnz 1b
2:  movq %rax, 8(%rsp)
    movq 8(%rsp), %rax
    addq $32, %rsp
    .cfi_adjust_cfa_offset -32
    popq %r12
    .cfi_adjust_cfa_offset -8
    .cfi_restore %r12
    popq %rbx
    .cfi_adjust_cfa_offset -8
    .cfi_restore %rbx
    ret
    .cfi_endproc
    .size mix_block, . - mix_block

/* Interrupt entry at CPL 0: the CPU pushed ss, rsp, rflags, cs, rip (40 bytes) on the
 * current stack after aligning it to 16 bytes. The CFA is the address above that frame,
 * the interrupted rip is at CFA-40 and its rsp at CFA-16. */
#define INTERRUPT_FRAME_CFI      \
    .cfi_signal_frame;           \
    .cfi_def_cfa %rsp, 40;       \
    .cfi_offset %rip, -40;       \
    .cfi_offset %rsp, -16

    .globl timer_isr
    .type timer_isr, @function
    .align 16
timer_isr:
    .cfi_startproc simple
    INTERRUPT_FRAME_CFI
    pushq %rax
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %rax, 0
    incq pit_ticks(%rip)
    movb $0x20, %al                /* EOI to the master PIC */
    outb %al, $0x20
    popq %rax
    .cfi_adjust_cfa_offset -8
    .cfi_restore %rax
    iretq
    .cfi_endproc
    .size timer_isr, . - timer_isr

    .globl spurious_isr
    .type spurious_isr, @function
    .align 16
spurious_isr:
    .cfi_startproc simple
    INTERRUPT_FRAME_CFI
    iretq
    .cfi_endproc
    .size spurious_isr, . - spurious_isr

/* Exceptions do not return: each stub passes its vector to guest_fault. */
    .globl fault_stubs
    .type fault_stubs, @function
    .align 16
fault_stubs:
    .set vector, 0
    .rept 32
    .align 16
    movl $vector, %edi
    jmp fault_common
    .set vector, vector + 1
    .endr
fault_common:
    andq $-16, %rsp
    call guest_fault
    .size fault_stubs, . - fault_stubs
