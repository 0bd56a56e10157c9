/* The few Xen interface definitions the PV guest needs, copied (trimmed, same layouts and
 * values) from Xen 4.17's public headers as installed by libxen-dev under /usr/include/xen/:
 * xen.h, arch-x86/xen.h, arch-x86/xen-x86_64.h, elfnote.h, sched.h, vcpu.h,
 * event_channel.h and io/console.h. The guest is built freestanding (no libc, no system
 * headers besides gcc's stdint.h), so it carries its own copy. x86-64 PV only.
 * Usable from assembly (the constants) and from C (the structures). */
#ifndef GLASS_XENPV_XEN_H
#define GLASS_XENPV_XEN_H

/* elfnote.h */
#define XEN_ELFNOTE_ENTRY           1
#define XEN_ELFNOTE_HYPERCALL_PAGE  2
#define XEN_ELFNOTE_VIRT_BASE       3
#define XEN_ELFNOTE_PADDR_OFFSET    4
#define XEN_ELFNOTE_XEN_VERSION     5
#define XEN_ELFNOTE_GUEST_OS        6
#define XEN_ELFNOTE_GUEST_VERSION   7
#define XEN_ELFNOTE_LOADER          8
#define XEN_ELFNOTE_FEATURES       10
#define XEN_ELFNOTE_PHYS32_ENTRY   18

/* xen.h: hypercall numbers (each is a 32-byte stub in the hypercall page). */
#define __HYPERVISOR_set_callbacks        4
#define __HYPERVISOR_update_va_mapping   14
#define __HYPERVISOR_iret                23
#define __HYPERVISOR_vcpu_op             24
#define __HYPERVISOR_sched_op            29
#define __HYPERVISOR_event_channel_op    32
#define __HYPERVISOR_memory_op           12
#define __HYPERVISOR_hvm_op              34

#define VIRQ_TIMER        0
#define UVMF_INVLPG       2           /* update_va_mapping: flush only this entry */

/* arch-x86/xen-x86_64.h: the flat selectors Xen's GDT always has for 64-bit PV guests
 * (the guest kernel runs in ring 3). */
#define FLAT_KERNEL_CS64  0xe033
#define FLAT_KERNEL_SS64  0xe02b
#define FLAT_KERNEL_DS64  0x0000
#define MACH2PHYS_VIRT_START 0xFFFF800000000000UL  /* read-only machine-to-phys table */

/* arch-x86/xen.h: vcpu_guest_context.flags */
#define VGCF_in_kernel    (1 << 2)

/* sched.h */
#define SCHEDOP_yield     0
#define SCHEDOP_block     1
#define SCHEDOP_shutdown  2
#define SCHEDOP_poll      3
#define SHUTDOWN_poweroff 0
#define SHUTDOWN_crash    3

/* vcpu.h */
#define VCPUOP_initialise            0
#define VCPUOP_up                    1
#define VCPUOP_is_up                 3
#define VCPUOP_stop_periodic_timer   7
#define VCPUOP_set_singleshot_timer  8
#define VCPUOP_register_runstate_memory_area 5
#define RUNSTATE_offline             3

/* event_channel.h */
#define EVTCHNOP_bind_virq 1
#define EVTCHNOP_send      4

#ifndef __ASSEMBLER__
#include <stdint.h>

/* vcpu.h: a vCPU's time in each state (running, runnable, blocked, offline), in ns of
 * Xen system time, which Xen writes at every state change. */
struct vcpu_runstate_info {
    int state;
    uint64_t state_entry_time;
    uint64_t time[4];
};

/* xen.h (x86-64: xen_pfn_t and xen_ulong_t are unsigned long). */
struct vcpu_time_info {
    uint32_t version;
    uint32_t pad0;
    uint64_t tsc_timestamp;     /* TSC at last update of time vals */
    uint64_t system_time;       /* ns since boot */
    uint32_t tsc_to_system_mul;
    int8_t tsc_shift;
    uint8_t flags;
    uint8_t pad1[2];
};                              /* 32 bytes */

struct vcpu_info {
    uint8_t evtchn_upcall_pending;
    uint8_t evtchn_upcall_mask;
    unsigned long evtchn_pending_sel;
    unsigned long arch_cr2, arch_pad;   /* struct arch_vcpu_info */
    struct vcpu_time_info time;
};                              /* 64 bytes */

struct shared_info {
    struct vcpu_info vcpu_info[32];     /* XEN_LEGACY_MAX_VCPUS */
    unsigned long evtchn_pending[64];
    unsigned long evtchn_mask[64];
    /* wallclock and struct arch_shared_info follow; unused here */
};

struct start_info {
    char magic[32];             /* "xen-<version>-<platform>" */
    unsigned long nr_pages;
    unsigned long shared_info;  /* MACHINE address of the shared info page */
    uint32_t flags;
    unsigned long store_mfn;
    uint32_t store_evtchn;
    union {
        struct {
            unsigned long mfn;  /* MACHINE frame of the console ring page */
            uint32_t evtchn;
        } domU;
        struct {
            uint32_t info_off, info_size;
        } dom0;
    } console;
    unsigned long pt_base;      /* VIRTUAL address of the L4 page table */
    unsigned long nr_pt_frames;
    unsigned long mfn_list;     /* VIRTUAL address of the p2m array (pfn -> mfn) */
    unsigned long mod_start, mod_len;
    int8_t cmd_line[1024];
    unsigned long first_p2m_pfn, nr_p2m_frames;
};

/* arch-x86/xen-x86_64.h */
struct cpu_user_regs {
    uint64_t r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8;
    uint64_t rax, rcx, rdx, rsi, rdi;
    uint32_t error_code, entry_vector;
    uint64_t rip;
    uint16_t cs, _pad0[1];
    uint8_t saved_upcall_mask, _pad1[3];
    uint64_t rflags;
    uint64_t rsp;
    uint16_t ss, _pad2[3];
    uint16_t es, _pad3[3];
    uint16_t ds, _pad4[3];
    uint16_t fs, _pad5[3];
    uint16_t gs, _pad6[3];
};

#define xen_pfn_to_cr3(pfn) ((unsigned long)(pfn) << 12)

/* arch-x86/xen.h */
struct trap_info {
    uint8_t vector, flags;
    uint16_t cs;
    unsigned long address;
};

struct vcpu_guest_context {
    struct { char x[512]; } fpu_ctxt;
    unsigned long flags;                    /* VGCF_* */
    struct cpu_user_regs user_regs;
    struct trap_info trap_ctxt[256];
    unsigned long ldt_base, ldt_ents;
    unsigned long gdt_frames[16], gdt_ents;
    unsigned long kernel_ss, kernel_sp;
    unsigned long ctrlreg[8];
    unsigned long debugreg[8];
    unsigned long event_callback_eip;
    unsigned long failsafe_callback_eip;
    unsigned long syscall_callback_eip;
    unsigned long vm_assist;
    uint64_t fs_base, gs_base_kernel, gs_base_user;
};

/* vcpu.h */
struct vcpu_set_singleshot_timer {
    uint64_t timeout_abs_ns;    /* absolute system time (ns) */
    uint32_t flags;
};

/* event_channel.h */
struct evtchn_bind_virq {
    uint32_t virq, vcpu;
    uint32_t port;              /* OUT */
};
struct evtchn_send {
    uint32_t port;
};

/* sched.h */
struct sched_shutdown {
    unsigned int reason;
};

/* io/console.h */
typedef uint32_t XENCONS_RING_IDX;
struct xencons_interface {
    char in[1024];
    char out[2048];
    XENCONS_RING_IDX in_cons, in_prod;
    XENCONS_RING_IDX out_cons, out_prod;
};
#define MASK_XENCONS_IDX(idx, ring) ((idx) & (sizeof(ring) - 1))

/* SCHEDOP_poll: wait for one of `ports` or Xen system time `timeout` (0: none). */
struct sched_poll {
    uint32_t *ports;
    unsigned int nr_ports;
    uint64_t timeout;
};

/* HVM/PVH only: HVMOP_get_param, XENMEM_add_to_physmap, VCPUOP_initialise's context. */
#define DOMID_SELF 0x7ff0
#define HVMOP_get_param 1
#define HVM_PARAM_CONSOLE_PFN 17
#define HVM_PARAM_CONSOLE_EVTCHN 18
struct xen_hvm_param {
    uint16_t domid;
    uint16_t pad;
    uint32_t index;
    uint64_t value;
};
#define XENMEM_add_to_physmap 7
#define XENMAPSPACE_shared_info 0
struct xen_add_to_physmap {
    uint16_t domid;
    uint16_t size;
    unsigned int space;
    unsigned long idx;
    unsigned long gpfn;
};
#define VCPU_HVM_MODE_64B 1
struct vcpu_hvm_context {
    uint32_t mode;
    uint32_t pad;
    struct {
        uint64_t rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, rip, rflags;
        uint64_t cr0, cr3, cr4, efer;
    } x86_64;
    uint8_t rest[256];  /* the union's 32-bit member is larger: Xen reads its size */
};

_Static_assert(sizeof(struct vcpu_info) == 64, "vcpu_info");
_Static_assert(sizeof(struct cpu_user_regs) == 200, "cpu_user_regs");
#endif /* !__ASSEMBLER__ */
#endif
