//! The probe runtime `glass trace` loads into the traced process (LD_PRELOAD when glass
//! launches it). glass patches each chosen function's first bytes with a jump to a
//! trampoline of its own making:
//!
//! ```text
//! trampoline:  push <function id>; call [rip+enter]; <the displaced instructions>; jmp back
//! ```
//!
//! `glass_enter` records the entry and swaps the function's return address (the word the
//! call pushed, its *slot*) for `glass_exit_stub`, remembering the real one on a per-thread
//! shadow stack; the function's `ret` then lands in the stub, which records the exit and
//! returns to the real address. One patch per function runs both probes, as in
//! LProfile's function-level fast breakpoint.
//!
//! Why return-address hijacking rather than patching every `ret`: return sites are many,
//! often shorter than a jump, and tail calls leave through `jmp`; the slot is one word,
//! always there, and the stub sees every way a call returns. The price is that code which
//! reads return addresses must be kept honest:
//! - longjmp and exceptions abandon frames without returning: the next probe of the
//!   thread finds shadow entries whose slot lies below the current stack pointer (those
//!   frames are gone) and records them as *unwound*;
//! - the C++ unwinder reads return addresses to find handlers: `_Unwind_RaiseException`
//!   and friends are interposed here to put the real addresses back before unwinding,
//!   and `__cxa_begin_catch` (the handler has been reached) drops the unwound entries and
//!   re-hijacks the frames that are still live;
//! - a tail call (`jmp` to another instrumented function) reuses the caller's slot: the
//!   callee's entry shares it, and the stub ends both calls at once;
//! - a signal handler that runs while a probe is mid-update finds the thread *busy* and
//!   is not traced (counted as skipped) rather than corrupting the shadow stack;
//! - fork: the child takes a fresh thread area with a copy of the shadow stack.
//!
//! The probe path is hand-written assembly because it runs between a call and the
//! function's first instruction: every register may hold an argument, the stack is the
//! caller's, and nothing may allocate, lock or make a system call. Records go into the
//! thread's ring in the session's shared memory (layout in `glass_probe_abi`), published
//! every [`glass_probe_abi::PUBLISH_EVERY`] records; a full ring drops and counts.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use glass_probe_abi::{area, header, EXIT_BIT, FUNCTION_SHIFT, MAGIC, UNWOUND_BIT, VERSION};

/// The session's shared memory, once mapped.
static SHM: AtomicPtr<u8> = AtomicPtr::new(core::ptr::null_mut());

const ENTRY_ID: usize = 16;
const RESTORED: u64 = 1 << glass_probe_abi::SHADOW_RESTORED_BIT;
const EXIT_WORD: u64 = 1 << EXIT_BIT;
const UNWOUND_WORD: u64 = (1 << EXIT_BIT) | (1 << UNWOUND_BIT);

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "aarch64")]
use aarch64 as arch;
#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
use x86_64 as arch;

fn stub_address() -> u64 {
    glass_exit_stub as *const () as u64
}

extern "C" {
    fn glass_enter();
    fn glass_exit_stub();
    fn glass_record_c(area: *mut u8, word: u64) -> u32;
    fn glass_thread_area_ptr() -> *mut *mut u8;
    fn glass_thread_area_offset() -> i64;
}

// ---------------------------------------------------------------------------------------
// Start-up: map the session glass created and tell glass where the probes are.

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    // SAFETY: getenv of a NUL-terminated name.
    let path = unsafe { libc::getenv(c"GLASS_TRACE_SHM".as_ptr()) };
    if !path.is_null() {
        // SAFETY: a NUL-terminated path from the environment.
        if unsafe { start_session(path) } == 0 {
            // SAFETY: sigaction with our own handler, before the program's main.
            unsafe { note_fatal_faults() };
        }
    }
}

/// The faults a program dies of with the default action; glass says where.
const FATAL_FAULTS: [c_int; 4] = [libc::SIGSEGV, libc::SIGILL, libc::SIGBUS, libc::SIGFPE];

/// For a launched program only, at start-up, and only for the faults it has no handler
/// of its own for (a handler it installs later replaces this one): a fault is noted in
/// the session's header (signal, pc, address) and the default action then ends the
/// program as it would have ended (SA_RESETHAND: the faulting instruction runs again
/// with the default disposition), so that glass can say whether it died inside glass's
/// trampolines or probe, or in its own code.
unsafe fn note_fatal_faults() {
    for signal in FATAL_FAULTS {
        let mut old: libc::sigaction = core::mem::zeroed();
        if libc::sigaction(signal, core::ptr::null(), &mut old) != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            continue;
        }
        let mut action: libc::sigaction = core::mem::zeroed();
        action.sa_sigaction = on_fatal_fault as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND | libc::SA_NODEFER;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, core::ptr::null_mut());
    }
}

extern "C" fn on_fatal_fault(signal: c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let shm = SHM.load(Ordering::Acquire);
    if shm.is_null() || info.is_null() || context.is_null() {
        return;
    }
    // SAFETY: the kernel's siginfo and ucontext for this signal; the header's words.
    unsafe {
        let context = &*(context as *const libc::ucontext_t);
        let pc = arch::fault_pc(context);
        word(shm, header::FATAL_PC).store(pc, Ordering::Relaxed);
        word(shm, header::FATAL_ADDRESS).store((*info).si_addr() as u64, Ordering::Relaxed);
        word(shm, header::FATAL_PID).store(libc::getpid() as u64, Ordering::Relaxed);
        word(shm, header::FATAL_SIGNAL).store(signal as u64, Ordering::Release);
    }
}

/// Bytes of the session's mapping (for `glass_probe_detach`).
static SHM_LEN: AtomicU64 = AtomicU64::new(0);
static ATFORK_DONE: AtomicU64 = AtomicU64::new(0);

/// Maps the session at `path` and publishes the probes' addresses in its header.
/// Returns 0, or a negative errno: EBUSY (a session is running), what `open`, `fstat`
/// or `mmap` of the file failed with (glass explains it to the user), or EPROTO (the
/// file is not a session of this runtime's layout).
unsafe fn start_session(path: *const c_char) -> i64 {
    if !SHM.load(Ordering::Acquire).is_null() {
        return -(libc::EBUSY as i64);
    }
    // The last session's placeholder: any probe a signal had interrupted then is long
    // over.
    let placeholder = PLACEHOLDER.swap(0, Ordering::Relaxed);
    if placeholder != 0 {
        libc::munmap(
            placeholder as *mut c_void,
            PLACEHOLDER_LEN.load(Ordering::Relaxed) as usize,
        );
    }
    let shm = match map_session(path) {
        Ok(shm) => shm,
        Err(errno) => return -(errno as i64),
    };
    // A program this one execs inherits the environment: only the first process to
    // load the runtime owns the session.
    let pid = word(shm, header::RUNTIME_PID);
    if pid.load(Ordering::Acquire) != 0 {
        return -(libc::EBUSY as i64);
    }
    word(shm, header::EXIT_STUB).store(stub_address(), Ordering::Relaxed);
    word(shm, header::ENTER).store(glass_enter as *const () as u64, Ordering::Relaxed);
    let [site_enter, site_exit, site_return] = arch::site_probes();
    word(shm, header::SITE_ENTER).store(site_enter, Ordering::Relaxed);
    word(shm, header::SITE_EXIT).store(site_exit, Ordering::Relaxed);
    word(shm, header::SITE_RETURN).store(site_return, Ordering::Relaxed);
    word(shm, header::AS_HELD).store(arch::as_held_entry(), Ordering::Relaxed);
    word(shm, header::TLS_OFFSET).store(glass_thread_area_offset() as u64, Ordering::Relaxed);
    word(shm, header::MAPPED_AT).store(shm as u64, Ordering::Relaxed);
    SHM.store(shm, Ordering::Release);
    if pid
        .compare_exchange(
            0,
            libc::getpid() as u64,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        SHM.store(core::ptr::null_mut(), Ordering::Release);
        return -(libc::EBUSY as i64);
    }
    if ATFORK_DONE.swap(1, Ordering::AcqRel) == 0 {
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
    }
    0
}

/// `glass trace --pid` calls this in the target (through an injected call, after
/// loading the runtime with dlopen) to join the session at `path`.
///
/// # Safety
/// `path` is a NUL-terminated file name.
#[no_mangle]
pub unsafe extern "C" fn glass_probe_attach(path: *const c_char) -> i64 {
    start_session(path)
}

/// `glass trace --pid` calls this when it detaches, with every thread stopped outside
/// the probes and every thread's area word cleared: the session's memory is let go, and
/// a later attach starts afresh.
///
/// # Safety
/// No thread may be inside a probe or hold a hijacked return address.
#[no_mangle]
pub unsafe extern "C" fn glass_probe_detach() -> i64 {
    let shm = SHM.swap(core::ptr::null_mut(), Ordering::AcqRel);
    if shm.is_null() {
        return -(libc::ENOENT as i64);
    }
    // The session's pages go, but its addresses stay writable, as fresh anonymous
    // memory in its place (one mmap, no moment unmapped): a thread can be inside a
    // probe, with its area's address in a register, while a signal handler runs, and
    // glass sees only the handler (Go sends its threads preemption signals all the
    // time). Such a probe finishes into the placeholder; the next session unmaps it.
    let len = SHM_LEN.load(Ordering::Relaxed) as usize;
    let placed = libc::mmap(
        shm as *mut c_void,
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
        -1,
        0,
    );
    if placed == libc::MAP_FAILED {
        return libc::munmap(shm as *mut c_void, len) as i64;
    }
    PLACEHOLDER.store(shm as u64, Ordering::Relaxed);
    PLACEHOLDER_LEN.store(len as u64, Ordering::Relaxed);
    0
}

/// Where the last session was, kept writable by [`glass_probe_detach`] until the next
/// one starts (0: none).
static PLACEHOLDER: AtomicU64 = AtomicU64::new(0);
static PLACEHOLDER_LEN: AtomicU64 = AtomicU64::new(0);

/// The session at `path`, mapped; or the errno of the step that failed.
unsafe fn map_session(path: *const c_char) -> Result<*mut u8, c_int> {
    let errno = || *libc::__errno_location();
    let fd = libc::open(path, libc::O_RDWR | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(errno());
    }
    let mut stat: libc::stat = core::mem::zeroed();
    let mapped = if libc::fstat(fd, &mut stat) != 0 {
        Err(errno())
    } else if (stat.st_size as usize) <= header::SIZE {
        Err(libc::EPROTO)
    } else {
        let at = libc::mmap(
            core::ptr::null_mut(),
            stat.st_size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        if at == libc::MAP_FAILED {
            Err(errno())
        } else {
            Ok(at)
        }
    };
    libc::close(fd);
    let mapped = mapped?;
    let shm = mapped as *mut u8;
    SHM_LEN.store(stat.st_size as u64, Ordering::Relaxed);
    if word(shm, header::MAGIC).load(Ordering::Acquire) != MAGIC
        || word(shm, header::VERSION).load(Ordering::Relaxed) != VERSION
    {
        libc::munmap(mapped, stat.st_size as usize);
        return Err(libc::EPROTO);
    }
    Ok(shm)
}

unsafe fn word<'a>(base: *mut u8, offset: usize) -> &'a AtomicU64 {
    &*(base.add(offset) as *const AtomicU64)
}

/// This thread's area, if it has one.
unsafe fn thread_area() -> Option<*mut u8> {
    let area = *glass_thread_area_ptr();
    (area as usize > 1).then_some(area)
}

unsafe fn field(area: *mut u8, offset: usize) -> *mut u64 {
    area.add(offset) as *mut u64
}

unsafe fn shadow_entry(area: *mut u8, index: u64) -> *mut [u64; 3] {
    area.add(area::SHADOW + index as usize * area::SHADOW_ENTRY) as *mut [u64; 3]
}

// ---------------------------------------------------------------------------------------
// C++ exceptions. The unwinder finds each frame's caller by its return address; a
// hijacked slot would send it into the exit stub, which has no unwind table, and the
// program would terminate. Before any unwinding starts, every live slot gets its real
// address back; once a handler has been entered, the frames below it are recorded as
// unwound and the live ones above it are hijacked again.

const UNWIND_HOOKS: [&core::ffi::CStr; 4] = [
    c"_Unwind_RaiseException",
    c"_Unwind_Resume",
    c"_Unwind_Resume_or_Rethrow",
    c"_Unwind_ForcedUnwind",
];
/// `glass trace --pid`'s record of what it changed in this process (its ledger, in a
/// mapping of its own), so that a glass attaching after one that died can undo it. The
/// runtime never reads it.
#[export_name = "glass_probe_ledger"]
pub static LEDGER: AtomicU64 = AtomicU64::new(0);

/// Where `glass trace --pid` keeps the landing its injected calls return to (a page of
/// its own that stays mapped for the life of the process), so that a later attach reuses
/// it. The runtime never reads it.
#[export_name = "glass_probe_landing"]
pub static LANDING: AtomicU64 = AtomicU64::new(0);

/// The real unwinder entry points (the four of UNWIND_HOOKS, then __cxa_begin_catch):
/// looked up with dlsym(RTLD_NEXT) when preloaded; `glass trace --pid` writes them here
/// itself, because a runtime loaded with dlopen has no "next" definition to find, and
/// it sends the process's GOT slots for these functions to the hooks below.
#[export_name = "glass_probe_real_functions"]
pub static REAL_FUNCTIONS: [AtomicPtr<c_void>; 5] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; 5];
const BEGIN_CATCH: usize = 4;

unsafe fn real_function(which: usize) -> *mut c_void {
    let known = REAL_FUNCTIONS[which].load(Ordering::Relaxed);
    if !known.is_null() {
        return known;
    }
    let name = if which == BEGIN_CATCH {
        c"__cxa_begin_catch"
    } else {
        UNWIND_HOOKS[which]
    };
    let found = libc::dlsym(libc::RTLD_NEXT, name.as_ptr());
    if found.is_null() {
        // Nothing to forward to: the program could not have called this without glass.
        libc::abort();
    }
    REAL_FUNCTIONS[which].store(found, Ordering::Relaxed);
    found
}

// ---------------------------------------------------------------------------------------
// fork: the child's copy of the stack still holds hijacked slots, so it needs the shadow
// entries; but the shared area belongs to the parent's thread. The prepare handler copies
// the shadow stack into private memory (which the child inherits), and the child claims a
// fresh area for it.

static mut FORK_SHADOW: [[u64; 3]; area::SHADOW_CAPACITY] = [[0; 3]; area::SHADOW_CAPACITY];
static FORK_DEPTH: AtomicU64 = AtomicU64::new(0);
static FORK_BUSY: AtomicU64 = AtomicU64::new(0);

extern "C" fn fork_prepare() {
    // SAFETY: this thread's area; FORK_SHADOW is only touched around fork, by the forking
    // thread (glibc serialises atfork handlers).
    unsafe {
        let Some(area) = thread_area() else { return };
        FORK_BUSY.store(*field(area, area::BUSY), Ordering::Relaxed);
        *field(area, area::BUSY) = 1;
        let depth = *field(area, area::DEPTH);
        FORK_DEPTH.store(depth, Ordering::Relaxed);
        let copy = &raw mut FORK_SHADOW;
        for index in 0..depth as usize {
            (*copy)[index] = *shadow_entry(area, index as u64);
        }
    }
}

extern "C" fn fork_parent() {
    // SAFETY: as in fork_prepare.
    unsafe {
        if let Some(area) = thread_area() {
            *field(area, area::BUSY) = FORK_BUSY.load(Ordering::Relaxed);
        }
    }
}

extern "C" fn fork_child() {
    // SAFETY: the child is single-threaded here.
    unsafe {
        let pointer = glass_thread_area_ptr();
        if (*pointer as usize) <= 1 {
            return;
        }
        let depth = FORK_DEPTH.load(Ordering::Relaxed);
        let copy = &*(&raw const FORK_SHADOW).cast::<[[u64; 3]; area::SHADOW_CAPACITY]>();
        let shm = SHM.load(Ordering::Acquire);
        let index = word(shm, header::NEXT_AREA).fetch_add(1, Ordering::AcqRel);
        if index >= word(shm, header::AREA_COUNT).load(Ordering::Relaxed) {
            word(shm, header::NO_AREA_LOST).fetch_add(1, Ordering::Relaxed);
            // Untraced from here on: give every hijacked slot its real address back.
            arch::give_back_returns(&copy[..depth as usize]);
            *pointer = core::ptr::dangling_mut::<u8>();
            return;
        }
        let stride = word(shm, header::AREA_STRIDE).load(Ordering::Relaxed);
        let area = shm.add(header::SIZE + (index * stride) as usize);
        for (i, entry) in copy[..depth as usize].iter().enumerate() {
            *shadow_entry(area, i as u64) = *entry;
        }
        *field(area, area::DEPTH) = depth;
        *field(area, area::TID) = libc::gettid() as u64;
        *field(area, area::PID) = libc::getpid() as u64;
        *field(area, area::BUSY) = FORK_BUSY.load(Ordering::Relaxed);
        *field(area, area::CLAIMED) = 1;
        if word(shm, header::COUNTERS).load(Ordering::Relaxed) > 0 {
            // The parent's events count the parent: the child opens its own.
            arch::open_counters(area);
        }
        *pointer = area;
    }
}

/// Keeps `c_int` in the public vocabulary of hooks that return unwinder codes.
pub type UnwindReasonCode = c_int;
