/* uint64_t mix_block(uint64_t seed, uint64_t iterations): the hot leaf under gamma (10%
 * of busy time), the same LCG as the C spin loop, registers only, the result passed
 * through a 48-byte frame. Without frame pointers its frame is described only by CFI
 * (.eh_frame); in the frame-pointer build (GLASS_FP) it pushes a frame record
 * (x29, x30) and has no CFI, like the C code of that build. */
#ifdef GLASS_FP
#define CFI(...)
#else
#define CFI(...) __VA_ARGS__
#endif
    .text
    .globl mix_block
    .type mix_block, %function
    .balign 16
mix_block:
    CFI(.cfi_startproc)
#ifdef GLASS_FP
    stp x29, x30, [sp, #-48]!
    mov x29, sp
    stp x19, x20, [sp, #16]
#else
    sub sp, sp, #48
    CFI(.cfi_def_cfa_offset 48)
    stp x19, x20, [sp, #16]
    CFI(.cfi_offset x19, -32)
    CFI(.cfi_offset x20, -24)
#endif
    ldr x19, =6364136223846793005
    ldr x20, =1442695040888963407
    orr x0, x0, #1
    cbz x1, 2f
1:  madd x0, x0, x19, x20
    subs x1, x1, #1
    b.ne 1b
2:  str x0, [sp, #40]
    ldr x0, [sp, #40]
    ldp x19, x20, [sp, #16]
#ifdef GLASS_FP
    ldp x29, x30, [sp], #48
#else
    add sp, sp, #48
    CFI(.cfi_restore x19)
    CFI(.cfi_restore x20)
    CFI(.cfi_def_cfa_offset 0)
#endif
    ret
    CFI(.cfi_endproc)
    .size mix_block, . - mix_block
    .ltorg
