//! Which functions of a module `glass trace` patches: the `-f` globs over the ELF's
//! functions, each with its patch plan or the reason it is left alone.

use std::path::Path;

use glass_patch::{
    analyze_with_padding, function_bytes, functions, glob_match, DirectSite, Function, Plan,
};
use object::{Object, ObjectSegment};

/// A module to instrument, as read from its file.
pub struct ModuleChoice {
    pub path: String,
    /// Functions matched by a pattern, with their plan (addresses are the file's) and
    /// the bytes of padding after them the analysis may borrow.
    pub patchable: Vec<(Function, Plan, u64)>,
    pub skipped: Vec<(Function, SkipReason)>,
    /// Functions too short for the entry jump, traced at their direct call sites: the
    /// plan moves the whole function into the trampoline.
    pub redirected: Vec<(Function, Plan, Vec<DirectSite>)>,
    /// Library calls to hook: (symbol, GOT slot address in the file).
    pub libcalls: Vec<(String, u64)>,
    /// (file offset, virtual address) of each loadable segment, to find the load bias.
    pub segments: Vec<(u64, u64, u64)>,
    pub matched: usize,
    /// Functions timed at their return sites (`glass_patch::return_sites`: every Go
    /// function, native ones where their code allows), with their plans (addresses are
    /// the file's) and the bytes of padding after each.
    pub site_patchable: Vec<(Function, glass_patch::return_sites::SitePlan, u64)>,
    /// Built by Go's toolchain (whose functions take the Go probes, see `glass_patch::return_sites`,
    /// which leave return addresses alone; the exit probe's hijack is never used on it):
    /// where the running goroutine lies relative to the thread pointer.
    pub go_g_offset: Option<i64>,
    /// Built by Go's toolchain: the runtime's slice of every goroutine (`runtime.allgs`), its file
    /// address.
    pub go_allgs: Option<u64>,
    /// AArch64 functions with their entry patch plans (addresses are the file's) and where
    /// each keeps its return address, in words below its entry stack pointer (0: not
    /// known; see glass_patch::lr_save_words).
    pub arm_patchable: Vec<(Function, glass_patch::aarch64::Plan, u64)>,
    /// An AArch64 module marked BTI-compatible (its code mapped guarded): see
    /// [`bti_marked`].
    pub bti_guarded: bool,
    /// Why its AArch64 functions were planned with far patches, if they were.
    pub far_because: Option<String>,
}

impl ModuleChoice {
    /// The module's AArch64 entries take far patches (see [`arm_needs_far_patches`]).
    pub fn far_patches(&self) -> bool {
        self.arm_patchable
            .iter()
            .any(|(_, plan, _)| plan.reach != glass_patch::aarch64::Reach::Near)
    }

    /// What to tell the user when the module's AArch64 entries take far patches.
    pub fn far_note(&self) -> Option<String> {
        let far = self.arm_patchable.len();
        let why = self.far_because.as_deref().unwrap_or_default();
        self.far_patches().then(|| {
            format!(
                "{}: {far} function{} patched with adrp, add and br x16 ({why}); functions whose first instructions use x16 or x17 are skipped",
                self.path,
                if far == 1 { "" } else { "s" }
            )
        })
    }

    /// None of its functions, short functions or library calls can be patched.
    pub fn nothing_to_patch(&self) -> bool {
        self.patchable.is_empty()
            && self.arm_patchable.is_empty()
            && self.site_patchable.is_empty()
            && self.redirected.is_empty()
            && self.libcalls.is_empty()
    }
}

/// A symbol as reports show it: Rust's and C++'s demangled (Rust's without its hash), as
/// glass-symbols names sampled frames (the same addr2line call); C's unchanged.
pub fn demangled(raw: &str) -> String {
    addr2line::demangle_auto(raw.into(), None).into_owned()
}

/// Functions whose return address is not theirs to lose: those that return twice or
/// switch stacks (setjmp would save the exit stub as the place to come back to; a vfork
/// child would return through the parent's shadow entry), and the unwinder, which reads
/// the return addresses of its own frames.
const NEVER_PATCHED: &[(&str, &str)] = &[
    ("setjmp", "returns twice"),
    ("_setjmp", "returns twice"),
    ("__setjmp", "returns twice"),
    ("sigsetjmp", "returns twice"),
    ("__sigsetjmp", "returns twice"),
    ("_longjmp_unwind", "returns twice"),
    ("savectx", "returns twice"),
    ("vfork", "returns twice"),
    ("__vfork", "returns twice"),
    ("clone", "returns twice"),
    ("__clone", "returns twice"),
    ("__clone3", "returns twice"),
    ("__clone_internal", "returns twice"),
    ("getcontext", "switches stacks"),
    ("setcontext", "switches stacks"),
    ("swapcontext", "switches stacks"),
    ("makecontext", "switches stacks"),
    ("__start_context", "switches stacks"),
    ("_Unwind_*", "part of the unwinder"),
    ("__gcc_personality_v0", "part of the unwinder"),
    ("uw_*", "part of the unwinder"),
];

/// Go runtime functions never patched: those entered other than by a call, or at a pc
/// the runtime plants as a return address (`goexit+1`, `systemstack_switch+8`), those
/// that switch stacks or goroutines, and those that run where no goroutine is set.
const GO_NEVER_PATCHED: &[(&str, &str)] = &[
    (
        "runtime.goexit*",
        "its second byte is every goroutine's first return address",
    ),
    (
        "runtime.systemstack_switch",
        "its inside is a return address the runtime plants",
    ),
    (
        "runtime.morestack*",
        "entered with the stack nearly full, it switches stacks",
    ),
    ("runtime.rt0_go", "the program's start"),
    ("_rt0_*", "the program's start"),
    ("runtime.mstart*", "a thread's first frame"),
    ("runtime.clone", "returns on a new stack in the child"),
    ("runtime.asyncPreempt*", "a call the signal handler injects"),
    ("runtime.sigpanic*", "a call the signal handler injects"),
    ("runtime.sigtramp*", "the signal handler's entry"),
    ("runtime.cgoSigtramp*", "the signal handler's entry"),
    (
        "runtime.sigreturn*",
        "entered by the signal handler's return",
    ),
    ("runtime.debugCall*", "a call a debugger injects"),
    ("runtime.gogo*", "switches goroutines"),
    ("runtime.mcall*", "switches goroutines"),
    ("runtime.systemstack*", "switches stacks"),
    ("runtime.asmcgocall*", "switches stacks"),
    ("runtime.cgocallback*", "switches stacks"),
    ("runtime.gosave*", "saves its caller's context"),
    ("runtime.setg*", "sets the goroutine"),
    ("runtime.save_g*", "sets the goroutine"),
    ("runtime.load_g*", "sets the goroutine"),
    ("crosscall2", "C's way into Go"),
];

/// Why a function must not be patched whatever its code, if so.
/// Why a function is not patched, typed from glass-patch's analysis to the recording:
/// [`SkipReason::kind`] names the kind (the summary groups by it, and the recording
/// keeps it), `Display` says it in full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// glass-patch's analysis refused its first bytes.
    Patch(glass_patch::Reason),
    /// The program's entry point: never called, no return address.
    EntryPoint,
    /// Never patched, and why (the unwinder's own, or a function whose return address
    /// the exit probe would take).
    NeverPatched(String),
    /// A cold part of another function, not entered by a call.
    NotCalled,
    /// A symbol without a size.
    SizeUnknown,
    /// The symbol's bytes are not in the file.
    NoCode,
    /// Code elsewhere branches inside the bytes the patch replaces.
    BranchIntoPatch { target: u64 },
    /// Shorter than the jump, with no filler after it and no direct call to redirect.
    TooShortNoCallSite(glass_patch::Reason),
    /// The code in memory is not what the file says (something, or an earlier glass,
    /// patched it).
    CodeDiffers,
    /// Its trampoline could not be built or reached.
    Trampoline(String),
    /// A Go function a goroutine was parked inside, at `pc`, when glass attached (see
    /// attach/go_stacks.rs).
    GoroutineInside { pc: u64 },
    /// In a VM guest: the call-style probe shifts the arguments a function reads from
    /// the stack (see `glass_patch::stack_args`); why this one may have some.
    StackArguments(String),
}

impl SkipReason {
    /// The kind, without the detail (addresses, sizes, the instruction): stable names
    /// the summary groups by.
    pub fn kind(&self) -> &'static str {
        match self {
            SkipReason::Patch(reason) => reason.kind(),
            SkipReason::EntryPoint => "the program's entry point",
            SkipReason::NeverPatched(_) => "never patched",
            SkipReason::NotCalled => "not entered by a call",
            SkipReason::SizeUnknown => "size unknown",
            SkipReason::NoCode => "no code in the file",
            SkipReason::BranchIntoPatch { .. } => {
                "code elsewhere branches inside the patched bytes"
            }
            SkipReason::TooShortNoCallSite(_) => "too short, and no direct call to redirect",
            SkipReason::CodeDiffers => "the code in memory differs from the file",
            SkipReason::Trampoline(_) => "no trampoline",
            SkipReason::StackArguments(_) => "may take arguments on the stack",
            SkipReason::GoroutineInside { .. } => "a goroutine was stopped inside it",
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SkipReason::Patch(reason) => write!(f, "{reason}"),
            SkipReason::EntryPoint => {
                f.write_str("the program's entry point (never called, no return address)")
            }
            SkipReason::NeverPatched(why) => f.write_str(why),
            SkipReason::NotCalled => {
                f.write_str("not entered by a call (a cold part of another function)")
            }
            SkipReason::SizeUnknown => f.write_str("size unknown (a symbol without a size)"),
            SkipReason::NoCode => f.write_str("no code in the file"),
            SkipReason::BranchIntoPatch { target } => write!(
                f,
                "code elsewhere branches inside the patched bytes (to {target:#x})"
            ),
            SkipReason::TooShortNoCallSite(reason) => write!(
                f,
                "{reason}, no filler after it, and no direct call to redirect"
            ),
            SkipReason::CodeDiffers => f.write_str("the code in memory differs from the file"),
            SkipReason::Trampoline(why) => write!(f, "no trampoline: {why}"),
            SkipReason::GoroutineInside { pc } => write!(
                f,
                "a goroutine was stopped inside the bytes the patch replaces (at {pc:#x})"
            ),
            SkipReason::StackArguments(why) => write!(
                f,
                "may take arguments on the stack, which the guest probe's call would shift: {why}"
            ),
        }
    }
}

/// Where a Go program keeps its running goroutine, relative to the thread pointer: its
/// TLS variable `runtime.tlsg` in the executable's TLS block, which ends at the thread
/// pointer (x86-64's TLS variant II). Go's linker puts it at -8 when nothing else is in
/// the block, as in every cgo build seen here.
fn go_g_offset(elf: &object::File) -> i64 {
    use object::ObjectSymbol;
    let block = match &elf {
        object::File::Elf64(file) => {
            use object::read::elf::ProgramHeader;
            let endian = file.endian();
            file.elf_program_headers()
                .iter()
                .find(|header| header.p_type(endian) == object::elf::PT_TLS)
                .map(|header| {
                    let align = header.p_align(endian).max(1);
                    (
                        header.p_vaddr(endian),
                        header.p_memsz(endian).next_multiple_of(align),
                    )
                })
        }
        _ => None,
    };
    let symbol = elf.symbols().find(|s| s.name() == Ok("runtime.tlsg"));
    match (block, symbol) {
        (Some((start, size)), Some(symbol)) => {
            // In the symbol table, a TLS variable's value is its offset in the block (or,
            // for some linkers, its address).
            let offset = symbol
                .address()
                .checked_sub(start)
                .unwrap_or(symbol.address());
            offset as i64 - size as i64
        }
        _ => -8,
    }
}

/// Where a Go program's running goroutine lies relative to the thread pointer (see
/// [`go_g_offset`]); None for a program Go did not build, or one glass cannot read.
pub fn go_g_offset_of(path: &Path) -> Option<i64> {
    let bytes = std::fs::read(path).ok()?;
    let elf = object::File::parse(&*bytes).ok()?;
    is_go(&elf).then(|| go_g_offset(&elf))
}

/// Whether the file was built by Go's toolchain: it has Go's build information, or the
/// runtime's stack-growth routine every Go function's prologue calls.
fn is_go(elf: &object::File) -> bool {
    use object::ObjectSymbol;
    elf.section_by_name(".go.buildinfo").is_some()
        || elf.section_by_name(".gopclntab").is_some()
        || elf.symbols().any(|s| s.name() == Ok("runtime.morestack"))
}

fn never_patched(module: &Path, name: &str, go: bool) -> Option<String> {
    if go {
        return GO_NEVER_PATCHED
            .iter()
            .find(|(pattern, _)| glob_match(pattern, name))
            .map(|(_, why)| format!("part of the Go runtime: {why}"));
    }
    let file = module
        .file_name()
        .map(|f| f.to_string_lossy())
        .unwrap_or_default();
    if file.starts_with("libgcc_s") {
        return Some("part of the unwinder (it reads its own frames' return addresses)".into());
    }
    NEVER_PATCHED
        .iter()
        .find(|(pattern, _)| glob_match(pattern, name))
        .map(|(_, why)| format!("{why} (the exit probe would take its return address)"))
}

/// Bytes after a function the patch may borrow: up to the next function, at most 16.
const MAX_PADDING: u64 = 16;

/// The architecture whose code this glass's process tracer patches: its own.
pub fn host_architecture() -> object::Architecture {
    if cfg!(target_arch = "aarch64") {
        object::Architecture::Aarch64
    } else {
        object::Architecture::X86_64
    }
}

/// [`read_module_of`] for a module of a process on this machine.
pub fn read_module(
    path: &Path,
    patterns: &[String],
    libcalls: &[String],
    counters: bool,
    return_sites: bool,
) -> Result<ModuleChoice, String> {
    read_module_of(
        host_architecture(),
        path,
        patterns,
        libcalls,
        counters,
        return_sites,
    )
}

/// The functions of the ELF file at `path`, built for `native` (a process's modules are
/// the machine's own; a guest's may be another's), that `patterns` match, each with its
/// plan or the reason it has none. `counters`: hardware counters are recorded (only the
/// return-address probe reads them); `return_sites`: native functions take return-site
/// probes where their code allows (Go's always do).
pub fn read_module_of(
    native: object::Architecture,
    path: &Path,
    patterns: &[String],
    libcalls: &[String],
    counters: bool,
    return_sites: bool,
) -> Result<ModuleChoice, String> {
    let return_sites = return_sites && !counters;
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "cannot read {}: {}",
            path.display(),
            e.to_string().split(" (os error").next().unwrap_or_default()
        )
    })?;
    let elf = object::File::parse(&*bytes)
        .map_err(|_| format!("{} is not an ELF file", path.display()))?;
    if elf.format() != object::BinaryFormat::Elf {
        return Err(format!("{} is not an ELF file", path.display()));
    }
    if elf.architecture() != native {
        let name = |arch| match arch {
            object::Architecture::X86_64 => "x86-64".to_string(),
            object::Architecture::Aarch64 => "AArch64".to_string(),
            other => format!("{other:?}"),
        };
        return Err(format!(
            "{} is a {} binary; this glass trace instruments {} code",
            path.display(),
            name(elf.architecture()),
            name(native)
        ));
    }
    let arm = native == object::Architecture::Aarch64;
    let all = functions(&elf);
    let go = is_go(&elf);
    if arm && go {
        return Err(format!(
            "{} is a Go program: glass trace times Go functions on x86-64 only so far (sample it with glass record)",
            path.display()
        ));
    }
    let return_sites = return_sites && !arm;
    if go && counters {
        return Err(format!(
            "{} is a Go program: its probes record time only, so --pmc does not apply",
            path.display()
        ));
    }
    if go && !libcalls.is_empty() {
        return Err(format!(
            "{} is a Go program: --libcalls hooks calls made from Go code, whose return addresses the Go runtime reads itself; glass trace does not hook them (sample it with glass record)",
            path.display()
        ));
    }
    let mut choice = ModuleChoice {
        path: path.display().to_string(),
        patchable: Vec::new(),
        skipped: Vec::new(),
        redirected: Vec::new(),
        libcalls: Vec::new(),
        segments: elf
            .segments()
            .map(|s| (s.file_range().0, s.address(), s.file_range().1))
            .collect(),
        matched: 0,
        site_patchable: Vec::new(),
        go_g_offset: go.then(|| go_g_offset(&elf)),
        go_allgs: go
            .then(|| {
                use object::ObjectSymbol;
                elf.symbols()
                    .find(|s| s.name() == Ok("runtime.allgs"))
                    .map(|s| s.address())
            })
            .flatten(),
        arm_patchable: Vec::new(),
        bti_guarded: false,
        far_because: None,
    };
    let entry = elf.entry();
    let lr_saves = if arm {
        glass_patch::lr_save_words(&elf)
    } else {
        Default::default()
    };
    let targets = if arm {
        arm_branch_targets(&elf, &all)
    } else {
        glass_patch::branch_targets(&elf, &all)
    };
    // Functions shorter than the jump with no filler after them, and why not the jump.
    let mut short: Vec<(Function, Plan, glass_patch::Reason)> = Vec::new();
    let not_called = glass_patch::not_call_entries(&elf);
    let aliases = glass_patch::function_aliases(&elf);
    for (index, function) in all.iter().enumerate() {
        let names = aliases.get(&function.address);
        // A function matches by any of its names, raw or demangled (`-f 'rsp::*'`,
        // `-f 'ns::Class::*'`), and is then called by the one that matched (`-f puts`
        // is reported as puts, not as the C library's _IO_puts), demangled as every
        // report names functions.
        let Some(matched) = std::iter::once(&function.name)
            .chain(names.into_iter().flatten())
            .find_map(|name| {
                let shown = demangled(name);
                patterns
                    .iter()
                    .any(|p| glob_match(p, name) || glob_match(p, &shown))
                    .then_some(shown)
            })
        else {
            continue;
        };
        let function = &Function {
            name: matched,
            ..function.clone()
        };
        choice.matched += 1;
        if function.address == entry && entry != 0 {
            // Nothing calls it: its stack starts with argc, not a return address.
            choice
                .skipped
                .push((function.clone(), SkipReason::EntryPoint));
            continue;
        }
        if let Some(why) = std::iter::once(&function.name)
            .chain(names.into_iter().flatten())
            .find_map(|name| never_patched(path, name, go))
        {
            choice
                .skipped
                .push((function.clone(), SkipReason::NeverPatched(why)));
            continue;
        }
        if not_called.contains(&function.address) || function.name.contains(".cold") {
            choice
                .skipped
                .push((function.clone(), SkipReason::NotCalled));
            continue;
        }
        if function.size == 0 {
            choice
                .skipped
                .push((function.clone(), SkipReason::SizeUnknown));
            continue;
        }
        let Some(code) = function_bytes(&elf, function) else {
            choice.skipped.push((function.clone(), SkipReason::NoCode));
            continue;
        };
        let end = function.address + function.size;
        let next = all
            .get(index + 1)
            .map_or(end, |next| next.address)
            .min(end + MAX_PADDING);
        let padding = Function {
            name: String::new(),
            address: end,
            size: next.saturating_sub(end),
        };
        let padding = function_bytes(&elf, &padding).unwrap_or(&[]);
        if arm {
            // One B over the entry (after a landing pad), to a trampoline within its
            // reach: the region is mapped within ±128 MiB of the module.
            let reach = glass_patch::aarch64::Reach::Near;
            match arm_plan(code, function, reach, &targets) {
                Ok(plan) => {
                    let lr_save = lr_saves.get(&function.address).copied().unwrap_or(0);
                    choice.arm_patchable.push((function.clone(), plan, lr_save));
                }
                Err(reason) => choice.skipped.push((function.clone(), reason)),
            }
            continue;
        }
        // Return-site probes (see glass_patch::return_sites): a Go function's only
        // probes; native code's where its code allows them, else the return-address
        // probe below.
        if go || return_sites {
            let landed_on = |from: u64, to: u64| targets.range(from..to).next().copied();
            let planned =
                glass_patch::return_sites::plan(code, function.address, padding, &landed_on, go)
                    .map_err(SkipReason::Patch)
                    .and_then(|plan| {
                        let entry = &plan.entry;
                        match landed_on(entry.patch_at + 1, entry.patch_at + entry.overwritten) {
                            Some(target) => Err(SkipReason::BranchIntoPatch { target }),
                            None => Ok(plan),
                        }
                    });
            match planned {
                Ok(plan) => {
                    choice
                        .site_patchable
                        .push((function.clone(), plan, padding.len() as u64));
                    continue;
                }
                Err(reason) if go => {
                    choice.skipped.push((function.clone(), reason));
                    continue;
                }
                Err(_) => {}
            }
        }
        match analyze_with_padding(code, function.address, padding) {
            Ok(plan) => {
                if let Some(&target) = targets
                    .range(function.address + 1..plan.patch_at + plan.overwritten)
                    .next()
                {
                    choice
                        .skipped
                        .push((function.clone(), SkipReason::BranchIntoPatch { target }));
                    continue;
                }
                choice
                    .patchable
                    .push((function.clone(), plan, padding.len() as u64));
            }
            Err(too_short @ glass_patch::Reason::TooShort { .. }) => {
                match glass_patch::whole_function_plan(code, function.address) {
                    Ok(plan) => short.push((function.clone(), plan, too_short)),
                    Err(_) => choice
                        .skipped
                        .push((function.clone(), SkipReason::Patch(too_short))),
                }
            }
            Err(reason) => choice
                .skipped
                .push((function.clone(), SkipReason::Patch(reason))),
        }
    }
    redirect_call_sites(&elf, &all, short, &mut choice);
    if arm && arm_needs_far_patches(&choice.arm_patchable) {
        let because = if forced_far() {
            "GLASS_TEST_AARCH64_REACH=page"
        } else {
            "the code spans more than a B's ±128 MiB reach of one place for the trampolines"
        };
        replan_far(&elf, &targets, &mut choice, because);
    }
    if arm {
        choice.bti_guarded = bti_marked(&bytes);
    }
    if !libcalls.is_empty() {
        choice.libcalls = got_slots(&elf, libcalls);
    }
    Ok(choice)
}

/// The span of AArch64 code above which one B (±128 MiB) cannot reach trampolines from
/// all of it: glass maps them in one place within reach of every patched function, and
/// needs room for them beside the code (see glass_target's `map_code_near`).
const FAR_SPAN: u64 = 192 << 20;

/// Whether the module's patched functions lie too far apart for B patches, or a test
/// asks for far patches anyway (GLASS_TEST_AARCH64_REACH=page: the path a module of
/// several hundred MiB takes, on a fixture of a few KiB).
fn arm_needs_far_patches(patchable: &[(Function, glass_patch::aarch64::Plan, u64)]) -> bool {
    if forced_far() {
        return true;
    }
    let low = patchable.iter().map(|(f, ..)| f.address).min();
    let high = patchable.iter().map(|(f, ..)| f.address + f.size).max();
    matches!((low, high), (Some(low), Some(high)) if high - low > FAR_SPAN)
}

fn forced_far() -> bool {
    std::env::var_os("GLASS_TEST_AARCH64_REACH").is_some_and(|v| v == "page")
}

/// Where the direct branches of an AArch64 module's functions land.
fn arm_branch_targets(elf: &object::File, all: &[Function]) -> std::collections::BTreeSet<u64> {
    all.iter()
        .filter_map(|f| Some((f.address, function_bytes(elf, f)?)))
        .flat_map(|(address, code)| glass_patch::aarch64::branch_targets(code, address))
        .collect()
}

/// Plans the AArch64 functions of `choice` (its module read again from its path) with
/// far patches: what a guest takes whose tables have no free slot for glass's region
/// within B's reach of its code. The functions the far patch refuses join
/// `choice.skipped`.
pub fn replan_far_at(choice: &mut ModuleChoice, because: &str) -> Result<(), String> {
    let bytes =
        std::fs::read(&choice.path).map_err(|e| format!("cannot read {}: {e}", choice.path))?;
    let elf =
        object::File::parse(&*bytes).map_err(|_| format!("{} is not an ELF file", choice.path))?;
    let targets = arm_branch_targets(&elf, &functions(&elf));
    replan_far(&elf, &targets, choice, because);
    Ok(())
}

/// Plans every AArch64 function again with `adrp x16; add x16; br x16` (±4 GiB): three
/// displaced instructions, so a function whose first three name x16 or x17 (which the
/// patch clobbers), or hold a call before the last, or into which a branch lands, is
/// skipped with that reason.
fn replan_far(
    elf: &object::File,
    targets: &std::collections::BTreeSet<u64>,
    choice: &mut ModuleChoice,
    because: &str,
) {
    choice.far_because = Some(because.to_string());
    let reach = glass_patch::aarch64::Reach::Page;
    for (function, _, lr_save) in std::mem::take(&mut choice.arm_patchable) {
        let Some(code) = function_bytes(elf, &function) else {
            choice.skipped.push((function, SkipReason::NoCode));
            continue;
        };
        match arm_plan(code, &function, reach, targets) {
            Ok(plan) => choice.arm_patchable.push((function, plan, lr_save)),
            Err(reason) => choice.skipped.push((function, reason)),
        }
    }
}

/// An AArch64 function's entry patch of `reach`, or why it has none: what the patch
/// displaces refused, or a branch of the module landing inside it.
fn arm_plan(
    code: &[u8],
    function: &Function,
    reach: glass_patch::aarch64::Reach,
    targets: &std::collections::BTreeSet<u64>,
) -> Result<glass_patch::aarch64::Plan, SkipReason> {
    let plan =
        glass_patch::aarch64::analyze(code, function.address, reach).map_err(SkipReason::Patch)?;
    match targets
        .range(function.address + 1..plan.patch_at + plan.reach.bytes())
        .next()
    {
        Some(&target) => Err(SkipReason::BranchIntoPatch { target }),
        None => Ok(plan),
    }
}

/// Whether the ELF's GNU property note marks it BTI-compatible, which makes the loader
/// map its code guarded (PROT_BTI): an indirect jump into it must then land on a
/// landing pad, so a trampoline's way back to the instruction after a patch must be a
/// direct B (glass_patch::aarch64::relocated_body's `guarded`).
fn bti_marked(bytes: &[u8]) -> bool {
    use object::read::elf::{ElfFile64, FileHeader, SectionHeader};
    let Ok(file) = ElfFile64::<object::Endianness>::parse(bytes) else {
        return false;
    };
    let endian = file.endian();
    let header = file.elf_header();
    let Ok(sections) = header.sections(endian, bytes) else {
        return false;
    };
    for section in sections.iter() {
        let Ok(Some(mut notes)) = section.notes(endian, bytes) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            let Some(mut properties) = note.gnu_properties(endian) else {
                continue;
            };
            while let Ok(Some(property)) = properties.next() {
                if property.pr_type() == object::elf::GNU_PROPERTY_AARCH64_FEATURE_1_AND
                    && property.data_u32(endian).is_ok_and(|features| {
                        features & object::elf::GNU_PROPERTY_AARCH64_FEATURE_1_BTI != 0
                    })
                {
                    return true;
                }
            }
        }
    }
    false
}

/// Functions too short for the entry jump are traced at their direct call sites instead:
/// each `call`/`jmp`/`jcc rel32` to them is sent to a trampoline holding a copy of the
/// whole function. Calls through pointers reach the original, untraced. A site inside
/// bytes another function's entry jump replaces keeps its original target (it runs
/// from that function's trampoline).
fn redirect_call_sites(
    elf: &object::File,
    all: &[Function],
    short: Vec<(Function, Plan, glass_patch::Reason)>,
    choice: &mut ModuleChoice,
) {
    if short.is_empty() {
        return;
    }
    let wanted = short.iter().map(|(f, _, _)| f.address).collect();
    let mut sites = glass_patch::direct_sites(elf, all, &wanted);
    let replaced: Vec<(u64, u64)> = choice
        .patchable
        .iter()
        .map(|(_, plan, _)| (plan.patch_at, plan.patch_at + plan.overwritten))
        .collect();
    for (function, plan, too_short) in short {
        let usable: Vec<DirectSite> = sites
            .remove(&function.address)
            .unwrap_or_default()
            .into_iter()
            .filter(|site| {
                !replaced
                    .iter()
                    .any(|&(start, end)| site.at < end && site.at + site.len as u64 > start)
            })
            .collect();
        if usable.is_empty() {
            choice
                .skipped
                .push((function, SkipReason::TooShortNoCallSite(too_short)));
        } else {
            choice.redirected.push((function, plan, usable));
        }
    }
}

/// GOT slots the module's calls to shared-library functions go through (lazy PLT slots
/// and `-fno-plt` GLOB_DAT slots), for the named functions.
pub(super) fn got_slots(elf: &object::File, names: &[String]) -> Vec<(String, u64)> {
    use object::{ObjectSymbol, ObjectSymbolTable, RelocationFlags, RelocationTarget};
    let Some(symbols) = elf.dynamic_symbol_table() else {
        return Vec::new();
    };
    let Some(relocations) = elf.dynamic_relocations() else {
        return Vec::new();
    };
    let mut slots = Vec::new();
    for (offset, relocation) in relocations {
        let RelocationFlags::Elf { r_type } = relocation.flags() else {
            continue;
        };
        let (jump_slot, glob_dat) = match elf.architecture() {
            object::Architecture::Aarch64 => (
                object::elf::R_AARCH64_JUMP_SLOT,
                object::elf::R_AARCH64_GLOB_DAT,
            ),
            _ => (
                object::elf::R_X86_64_JUMP_SLOT,
                object::elf::R_X86_64_GLOB_DAT,
            ),
        };
        if r_type != jump_slot && r_type != glob_dat {
            continue;
        }
        let RelocationTarget::Symbol(index) = relocation.target() else {
            continue;
        };
        let Ok(symbol) = symbols.symbol_by_index(index) else {
            continue;
        };
        if symbol.is_definition() || symbol.kind() != object::SymbolKind::Text {
            // GLOB_DAT of data, or of a function this module defines itself.
            if r_type != jump_slot {
                continue;
            }
        }
        let Ok(name) = symbol.name() else { continue };
        let name = name.split('@').next().unwrap_or(name);
        if names.iter().any(|p| glob_match(p, name)) && !slots.iter().any(|(_, o)| *o == offset) {
            slots.push((name.to_string(), offset));
        }
    }
    slots
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C library this test runs with.
    fn libc() -> String {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|path| path.rsplit('/').next().unwrap().starts_with("libc.so"))
            .expect("this test links the C library")
            .to_string()
    }

    #[test]
    fn a_function_matches_by_any_of_its_names_and_keeps_the_one_asked_for() {
        let choice = read_module(
            Path::new(&libc()),
            &["puts".into(), "malloc".into()],
            &[],
            false,
            false,
        )
        .unwrap();
        let mut names: Vec<&str> = choice
            .patchable
            .iter()
            .map(|(f, _, _)| f.name.as_str())
            .chain(choice.skipped.iter().map(|(f, _)| f.name.as_str()))
            .collect();
        names.sort();
        // puts is a weak alias of _IO_puts, malloc one name of __libc_malloc.
        assert_eq!(names, ["malloc", "puts"]);
        assert_eq!(choice.matched, 2);
        assert!(choice.go_g_offset.is_none());
    }

    #[test]
    fn a_name_that_must_never_be_patched_protects_its_aliases() {
        // _setjmp and setjmp are one function in some C libraries, separate in others:
        // whichever names match, each is refused.
        let choice =
            read_module(Path::new(&libc()), &["*setjmp".into()], &[], false, false).unwrap();
        assert!(choice.patchable.is_empty(), "{:?}", choice.patchable);
        assert!(choice
            .skipped
            .iter()
            .all(|(_, reason)| matches!(reason, SkipReason::NeverPatched(_))));
    }
}
