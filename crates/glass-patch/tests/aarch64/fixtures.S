// Functions whose first instructions are each kind of PC-relative instruction glass-patch
// relocates on AArch64 (crates/glass-patch/src/aarch64.rs), for tests/aarch64_patch.rs:
// each is patched to a trampoline near (one B), a page away (adrp/add/br x16) and far
// (movz/movk/br x16), and must return what it returned unpatched. Each takes x0 and
// returns x0.
    .text

    .macro fixture name
    .global \name
    .type \name, %function
    .p2align 4
\name:
    .endm
    .macro end name
    .size \name, . - \name
    .endm

fixture fx_adrp
    adrp x0, table
    add x0, x0, :lo12:table
    ldr x0, [x0]
    ret
end fx_adrp

fixture fx_adr
    adr x1, 1f
    ldr x0, [x1]
    add x0, x0, #1
    ret
    .p2align 3
1:  .quad 0x1122334455667788
end fx_adr

fixture fx_ldr_x
    ldr x0, 1f
    nop
    nop
    ret
    .p2align 3
1:  .quad 0x0102030405060708
end fx_ldr_x

fixture fx_ldr_w
    ldr w0, 1f
    nop
    nop
    ret
1:  .word 0x89abcdef
end fx_ldr_w

fixture fx_ldrsw
    ldrsw x0, 1f
    nop
    nop
    ret
1:  .word 0x89abcdef
end fx_ldrsw

fixture fx_ldr_d
    ldr d0, 1f
    fmov x0, d0
    nop
    ret
    .p2align 3
1:  .quad 0x400921fb54442d18
end fx_ldr_d

fixture fx_ldr_q
    ldr q0, 1f
    mov x0, v0.d[1]
    nop
    ret
    .p2align 4
1:  .quad 0x1111111111111111, 0x2222222222222222
end fx_ldr_q

fixture fx_prfm
    prfm pldl1keep, 1f
    add x0, x0, #5
    nop
    ret
1:  .quad 0
end fx_prfm

fixture fx_cbz
    cbz x0, 1f
    mov x0, #7
    nop
    nop
    ret
1:  mov x0, #9
    ret
end fx_cbz

fixture fx_cbnz
    cbnz w0, 1f
    mov x0, #7
    nop
    nop
    ret
1:  mov x0, #9
    ret
end fx_cbnz

fixture fx_tbz
    tbz x0, #3, 1f
    mov x0, #7
    nop
    nop
    ret
1:  mov x0, #9
    ret
end fx_tbz

fixture fx_tbnz
    tbnz x0, #40, 1f
    mov x0, #7
    nop
    nop
    ret
1:  mov x0, #9
    ret
end fx_tbnz

// Entered with the flags of `cmp x0, #5` (fx_bcond_call).
fixture fx_bcond
    b.ne 1f
    mov x0, #7
    nop
    nop
    ret
1:  mov x0, #9
    ret
end fx_bcond

fixture fx_bcond_call
    cmp x0, #5
    b fx_bcond
end fx_bcond_call

// A tail call as the first instruction.
fixture fx_b
    b fx_b_target
end fx_b

fixture fx_b_target
    add x0, x0, #33
    ret
end fx_b_target

// A call as the first instruction: returns through x10 (fx_bl_call), since the call
// takes x30.
fixture fx_bl
    bl 1f
    add x0, x0, #1
    br x10
1:  mov x0, #41
    ret
end fx_bl

fixture fx_bl_call
    mov x11, x30
    adr x10, 1f
    b fx_bl
1:  mov x30, x11
    ret
end fx_bl_call

fixture fx_bti
    bti c
    adrp x1, table
    add x1, x1, :lo12:table
    ldr x1, [x1]
    add x0, x0, x1
    ret
end fx_bti

// Signs its return address first (a landing pad too): the patch goes after it.
fixture fx_pac
    paciasp
    stp x29, x30, [sp, #-16]!
    mov x29, sp
    adrp x1, table
    add x1, x1, :lo12:table
    ldr x1, [x1]
    eor x0, x0, x1
    ldp x29, x30, [sp], #16
    autiasp
    ret
end fx_pac

// A loop back to the second instruction: inside an indirect patch, not a B.
fixture fx_loop
    mov x1, #0
1:  add x1, x1, #1
    cmp x1, #100
    b.lt 1b
    add x0, x0, x1
    ret
end fx_loop

// Names x16, which the indirect patch clobbers.
fixture fx_x16
    mov x16, x0
    add x0, x16, #1
    nop
    ret
end fx_x16

    .data
    .p2align 3
table:
    .quad 0x5eed5eed12345678
