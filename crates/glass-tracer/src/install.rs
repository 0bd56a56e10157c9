//! Writing the instrumentation into the stopped target: a trampoline region within
//! ±2 GiB of each module, its trampolines, then the entry jumps and GOT hooks. Every
//! check that can refuse a function runs before anything of it is written, so a function
//! is patched whole or not at all.

use glass_patch::return_sites::SitePlan;
use glass_patch::{trampoline, DirectSite, Function, Plan};
use glass_target::inject::StoppedProcess;
use glass_target::procfs::Mapping;

use super::select::{ModuleChoice, SkipReason};

/// A function (or library call) glass instrumented, at its runtime address.
#[derive(Debug, Clone)]
pub struct Installed {
    pub id: u32,
    pub module: String,
    pub address: u64,
    pub size: u64,
    pub name: String,
    /// How its calls are timed.
    pub probe: Probe,
}

/// How a function's calls are timed: each way has its own guarantees (README's trace
/// section, docs/architecture.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// glass_enter takes over the return address; the exit stub times the return.
    ReturnAddress,
    /// Go: a probe at the entry and at each `ret`, return addresses left alone.
    ReturnSites,
    /// Too short for the jump: a copy of the whole function, reached from its direct
    /// call sites, with the return-address probe.
    CallSites,
    /// A library call, through its GOT slot, with the return-address probe.
    LibraryCall,
    /// A guest's function: the call-style trampoline calls it.
    Call,
}

impl Probe {
    pub fn name(self) -> &'static str {
        match self {
            Probe::ReturnAddress => "return address",
            Probe::ReturnSites => "return sites",
            Probe::CallSites => "call sites",
            Probe::LibraryCall => "library call",
            Probe::Call => "call",
        }
    }
}

pub struct Outcome {
    pub installed: Vec<Installed>,
    pub skipped: Vec<crate::Skip>,
    /// The patches still to write: (address, new bytes, the bytes there now).
    pub patches: Vec<(u64, Vec<u8>, Vec<u8>)>,
    /// The trampolines: (start, length); empty if nothing was patched.
    pub region: (u64, u64),
    /// Where a thread stopped strictly inside bytes a patch replaces is moved to:
    /// (address, the same place in the trampoline's relocated copy).
    pub moves: Vec<(u64, u64)>,
}

/// Writes the patches [`prepare`] made (every thread stopped): the module is patched
/// whole or not at all, and only where its bytes are still what `prepare` read.
pub fn commit(process: &StoppedProcess, outcome: &Outcome) -> std::io::Result<Undo> {
    let expected: Vec<(u64, &[u8])> = outcome
        .patches
        .iter()
        .map(|(address, _, original)| (*address, original.as_slice()))
        .collect();
    let patches: Vec<(u64, &[u8])> = outcome
        .patches
        .iter()
        .map(|(address, bytes, _)| (*address, bytes.as_slice()))
        .collect();
    write_patches(process, &patches, Some(&expected))?;
    Ok(Undo {
        restore: outcome
            .patches
            .iter()
            .map(|(address, _, original)| (*address, original.clone()))
            .collect(),
        region: outcome.region,
        moves: outcome.moves.clone(),
    })
}

/// Writes `patches` (address, bytes), those starting in the same page at once: one read
/// and one write of /proc/PID/mem per page rather than per patch (each access costs
/// microseconds, and the target is stopped meanwhile; a page never straddles two
/// mappings). The bytes between patches are written back as read, which is only safe
/// with every thread stopped. With `expected` (the bytes each place must hold now),
/// nothing is written unless all of them match; a failed write undoes the earlier ones.
fn write_patches(
    process: &StoppedProcess,
    patches: &[(u64, &[u8])],
    expected: Option<&[(u64, &[u8])]>,
) -> std::io::Result<()> {
    const PAGE: u64 = 4096;
    let mut order: Vec<usize> = (0..patches.len()).collect();
    order.sort_by_key(|&i| patches[i].0);
    let mut spans: Vec<(u64, u64, Vec<usize>)> = Vec::new();
    for i in order {
        let (address, bytes) = patches[i];
        let end = address + bytes.len() as u64;
        match spans.last_mut() {
            Some((start, span_end, members)) if address / PAGE == *start / PAGE => {
                *span_end = (*span_end).max(end);
                members.push(i);
            }
            _ => spans.push((address, end, vec![i])),
        }
    }
    let mut buffers = Vec::with_capacity(spans.len());
    let mut originals = Vec::with_capacity(spans.len());
    for (start, end, members) in &spans {
        let mut buffer = process.read(*start, (end - start) as usize)?;
        originals.push(buffer.clone());
        if let Some(expected) = expected {
            for &i in members {
                let (address, original) = expected[i];
                let at = (address - start) as usize;
                if &buffer[at..at + original.len()] != original {
                    return Err(std::io::Error::other(format!(
                        "the code at {address:#x} changed while glass prepared its patch"
                    )));
                }
            }
        }
        for &i in members {
            let (address, bytes) = patches[i];
            let at = (address - start) as usize;
            buffer[at..at + bytes.len()].copy_from_slice(bytes);
        }
        buffers.push(buffer);
    }
    for (done, ((start, _, _), buffer)) in spans.iter().zip(&buffers).enumerate() {
        if let Err(e) = process.write(*start, buffer) {
            for ((start, _, _), original) in spans.iter().zip(&originals).take(done) {
                let _ = process.write(*start, original);
            }
            return Err(e);
        }
    }
    Ok(())
}

/// How to take one module's instrumentation out again.
pub struct Undo {
    pub restore: Vec<(u64, Vec<u8>)>,
    pub region: (u64, u64),
    /// (original, trampoline) places: backwards, they take a thread out of the
    /// trampolines.
    pub moves: Vec<(u64, u64)>,
}

/// Puts back every byte `undo` lists, latest first. The trampolines stay mapped: a
/// thread may still be on its way back through one.
pub fn uninstall(process: &StoppedProcess, undo: &[Undo]) -> std::io::Result<()> {
    let restore: Vec<(u64, &[u8])> = undo
        .iter()
        .flat_map(|module| module.restore.iter())
        .map(|(address, original)| (*address, original.as_slice()))
        .collect();
    write_patches(process, &restore, None)
}

/// The bytes of the process that patching `choice` (loaded at `bias`) may overwrite:
/// (start, length) of each entry patch and redirected call site. A thread stopped at an
/// instruction boundary strictly inside one of them must be moved out first.
pub fn overwritten_ranges(choice: &ModuleChoice, bias: u64) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = choice
        .patchable
        .iter()
        .map(|(_, plan, _)| (plan.patch_at.wrapping_add(bias), plan.overwritten))
        .collect();
    for (_, plan, _) in &choice.arm_patchable {
        ranges.push((plan.patch_at.wrapping_add(bias), plan.reach.bytes()));
    }
    for (_, plan, _) in &choice.site_patchable {
        ranges.extend(
            plan.overwritten()
                .into_iter()
                .map(|(at, len)| (at.wrapping_add(bias), len)),
        );
    }
    for (_, _, sites) in &choice.redirected {
        ranges.extend(
            sites
                .iter()
                .map(|site| (site.at.wrapping_add(bias), site.len as u64)),
        );
    }
    ranges
}

/// The load bias of `choice` in the target: where its file's segments were mapped,
/// minus where the file says they go.
pub fn load_bias(choice: &ModuleChoice, mappings: &[Mapping]) -> Option<u64> {
    let canonical = std::fs::canonicalize(&choice.path).ok()?;
    let mapping = mappings
        .iter()
        .find(|m| std::fs::canonicalize(&m.path).ok().as_ref() == Some(&canonical))?;
    glass_target::procfs::load_bias(mapping, &choice.segments)
}

/// Room one function's trampoline may need: the relocated instructions plus the
/// push, the call, an emulated call and the jump back.
fn trampoline_room(relocated_len: usize) -> u64 {
    (relocated_len as u64 + 64).next_multiple_of(16)
}

/// The probe runtime's entries in the target.
#[derive(Debug, Clone, Copy)]
pub struct Probes {
    /// `glass_enter`: records the entry and takes over the return address.
    pub enter: u64,
    /// `glass_site_enter` and `glass_site_exit`: Go's return-site probes, which key each
    /// record by goroutine.
    pub site_enter: u64,
    pub site_exit: u64,
    /// `glass_site_return`: native code's return-site probe (its entry is `enter`, told
    /// by the id's `SITE_ID_BIT` to leave the return address alone).
    pub site_return: u64,
}

/// Bytes at the start of a module's trampoline region: the probes' addresses, which
/// trampolines call through (`call [rip + slot]`).
const SLOTS: usize = 32;

/// Builds and writes the trampolines of `choice` (unreachable until the patches are
/// written: the threads may run meanwhile) and returns the patches, for [`commit`].
pub fn prepare(
    process: &StoppedProcess,
    probes: Probes,
    choice: &ModuleChoice,
    bias: u64,
    first_id: u32,
) -> std::io::Result<Outcome> {
    let mut outcome = Outcome {
        installed: Vec::new(),
        skipped: Vec::new(),
        patches: Vec::new(),
        region: (0, 0),
        moves: Vec::new(),
    };
    for (function, reason) in &choice.skipped {
        outcome.skipped.push(crate::Skip {
            module: choice.path.clone(),
            address: function.address.wrapping_add(bias),
            name: function.name.clone(),
            reason: reason.clone(),
        });
    }
    let count = choice.patchable.len()
        + choice.arm_patchable.len()
        + choice.site_patchable.len()
        + choice.redirected.len()
        + choice.libcalls.len();
    if count == 0 {
        return Ok(outcome);
    }
    let room = region_room(choice);
    let (low, high) = choice.segments.iter().filter(|s| s.2 > 0).fold(
        (u64::MAX, 0),
        |(lo, hi), &(_, address, size)| {
            (
                lo.min(address.wrapping_add(bias)),
                hi.max(address.wrapping_add(bias) + size),
            )
        },
    );
    // Where a trampoline must lie for the patch's jump to reach it: rel32 on x86-64, B's
    // ±128 MiB on AArch64, adrp's ±4 GiB where the module's code is too far apart for B
    // (select's far plans; ±2 GiB asked, as on x86-64).
    let reach = if choice.arm_patchable.is_empty() || choice.far_patches() {
        1 << 31
    } else {
        1 << 27
    };
    let region = process.map_code_near(low, high, room, reach)?;
    let mut code = Vec::with_capacity(room as usize);
    for probe in [
        probes.enter,
        probes.site_enter,
        probes.site_exit,
        probes.site_return,
    ] {
        code.extend_from_slice(&probe.to_le_bytes());
    }
    code.resize(SLOTS, 0xcc);
    let mut building = Building {
        process,
        module: &choice.path,
        bias,
        region,
        code,
        patches: Vec::new(),
        id: first_id,
        outcome,
        go: choice.go_g_offset.is_some(),
        enter: probes.enter,
        guarded: choice.bti_guarded,
    };
    for (function, file_plan, padding) in &choice.patchable {
        building.entry(function, file_plan, *padding);
    }
    for (function, file_plan, lr_save) in &choice.arm_patchable {
        building.arm_entry(function, file_plan, *lr_save);
    }
    for (function, file_plan, padding) in &choice.site_patchable {
        building.sites_function(function, file_plan, *padding);
    }
    // Functions too short for the jump: a copy in the trampoline, reached from each
    // direct call site (whose displacement is rewritten).
    for (function, file_plan, sites) in &choice.redirected {
        building.redirect(function, file_plan, sites);
    }
    // Library calls: the GOT slot gets a trampoline that enters the probe and jumps on
    // to what the slot held (LD_BIND_NOW made that the function itself).
    for (name, slot) in &choice.libcalls {
        building.libcall(name, *slot)?;
    }
    let Building {
        code,
        patches,
        mut outcome,
        ..
    } = building;
    process.write(region, &code)?;
    outcome.region = (region, room.next_multiple_of(4096));
    for (address, bytes) in patches {
        let original = process.read(address, bytes.len())?;
        outcome.patches.push((address, bytes, original));
    }
    Ok(outcome)
}

/// Room for every trampoline of `choice`, after the slot holding the probe's entry.
fn region_room(choice: &ModuleChoice) -> u64 {
    SLOTS as u64
        + choice
            .site_patchable
            .iter()
            .map(|(_, plan, _)| {
                trampoline_room(plan.entry.relocated_len + 16)
                    + plan
                        .returns
                        .iter()
                        .map(|site| trampoline_room(site.overwritten as usize + 16))
                        .sum::<u64>()
            })
            .sum::<u64>()
        + choice
            .patchable
            .iter()
            .map(|(_, plan, _)| trampoline_room(plan.relocated_len))
            .sum::<u64>()
        + choice
            .arm_patchable
            .iter()
            .map(|(_, plan, _)| {
                glass_patch::aarch64::entry_trampoline_room(plan).next_multiple_of(16)
            })
            .sum::<u64>()
        + choice
            .redirected
            .iter()
            .map(|(_, plan, _)| trampoline_room(plan.relocated_len))
            .sum::<u64>()
        + choice.libcalls.len() as u64 * 64
}

/// One module's trampolines as they are built: their code (written at `region` in one
/// go, the probe's entry in its first slot), the patches that will lead to them, and
/// what was installed or skipped.
struct Building<'a> {
    process: &'a StoppedProcess,
    module: &'a str,
    bias: u64,
    region: u64,
    code: Vec<u8>,
    /// (address, new bytes).
    patches: Vec<(u64, Vec<u8>)>,
    /// The next function's id.
    id: u32,
    outcome: Outcome,
    /// The module was built by Go (see `glass_patch::return_sites`).
    go: bool,
    /// `glass_enter`, which AArch64 trampolines load from a literal of their own.
    enter: u64,
    /// The module is BTI-guarded (select's `bti_guarded`).
    guarded: bool,
}

impl Building<'_> {
    /// Where the next trampoline goes.
    fn next_at(&self) -> u64 {
        self.region + self.code.len() as u64
    }

    /// The slot that holds the probe's entry.
    fn enter_slot(&self) -> u64 {
        self.region
    }

    /// The slots of the return-site probes' entry and exit, and the id the entry
    /// pushes: Go's own pair, or, for native code, `glass_enter` told by the id to keep
    /// the return address, and `glass_site_return`.
    fn site_slots(&self) -> (u64, u64, u32) {
        match self.go {
            true => (self.region + 8, self.region + 16, self.id),
            false => (
                self.region,
                self.region + 24,
                self.id | 1 << glass_probe_abi::SITE_ID_BIT,
            ),
        }
    }

    /// Whether the ids a record can carry are all taken: then `function` is skipped.
    fn out_of_ids(&mut self, function: &Function) -> bool {
        let out = self.id >= glass_probe_abi::MAX_FUNCTIONS;
        if out {
            let reason = SkipReason::Trampoline(format!(
                "more functions than a record can name ({})",
                glass_probe_abi::MAX_FUNCTIONS
            ));
            self.skip(function, function.address.wrapping_add(self.bias), reason);
        }
        out
    }

    fn skip(&mut self, function: &Function, address: u64, reason: SkipReason) {
        self.outcome.skipped.push(crate::Skip {
            module: self.module.to_string(),
            address,
            name: function.name.clone(),
            reason,
        });
    }

    /// Adds a trampoline's bytes (aligned to 16) and counts what it instruments.
    fn install(&mut self, trampoline: &[u8], address: u64, size: u64, name: String, probe: Probe) {
        self.code.extend_from_slice(trampoline);
        self.code.resize(self.code.len().next_multiple_of(16), 0xcc);
        self.outcome.installed.push(Installed {
            id: self.id,
            module: self.module.to_string(),
            address,
            size,
            name,
            probe,
        });
        self.id += 1;
    }

    /// `analyse` of the function's code as the target holds it, and of the `padding`
    /// bytes after it.
    fn in_memory<T>(
        &self,
        function: &Function,
        padding: u64,
        analyse: impl Fn(&[u8], &[u8]) -> Option<T>,
    ) -> Option<T> {
        let runtime_address = function.address.wrapping_add(self.bias);
        let bytes = self
            .process
            .read(runtime_address, (function.size + padding) as usize)
            .ok()?;
        let (code, padding) = bytes.split_at(function.size as usize);
        analyse(code, padding)
    }

    /// A function reached through a jump written over its entry.
    fn entry(&mut self, function: &Function, file_plan: &Plan, padding: u64) {
        if self.out_of_ids(function) {
            return;
        }
        let runtime_address = function.address.wrapping_add(self.bias);
        // Analyse again where the code runs: the relocation needs the real addresses,
        // and the code in memory must be what the file says (it is not if something
        // else, or an earlier glass, already patched it).
        let plan = self
            .in_memory(function, padding, |code, padding| {
                glass_patch::analyze_with_padding(code, runtime_address, padding).ok()
            })
            .filter(|plan| {
                plan.displaced == file_plan.displaced
                    && plan.patch_at == file_plan.patch_at.wrapping_add(self.bias)
            });
        let Some(plan) = plan else {
            return self.skip(function, runtime_address, SkipReason::CodeDiffers);
        };
        let at = self.next_at();
        let built = trampoline::build_with_moves(&plan, self.id, at, self.enter_slot()).and_then(
            |(bytes, moves)| trampoline::entry_patch(&plan, at).map(|patch| (bytes, moves, patch)),
        );
        match built {
            Ok((bytes, moves, patch)) => {
                self.outcome.moves.extend(moves);
                self.patches.push((plan.patch_at, patch));
                self.install(
                    &bytes,
                    runtime_address,
                    function.size,
                    function.name.clone(),
                    Probe::ReturnAddress,
                );
            }
            Err(reason) => self.skip(function, runtime_address, SkipReason::Trampoline(reason)),
        }
    }

    /// An AArch64 function reached through a B written over its entry (after its landing
    /// pad), to a trampoline that calls `glass_enter` (glass_patch::aarch64).
    fn arm_entry(
        &mut self,
        function: &Function,
        file_plan: &glass_patch::aarch64::Plan,
        lr_save: u64,
    ) {
        if self.out_of_ids(function) {
            return;
        }
        let runtime_address = function.address.wrapping_add(self.bias);
        // Analysed again where the code runs (see `entry`).
        let plan = self
            .in_memory(function, 0, |code, _| {
                glass_patch::aarch64::analyze(code, runtime_address, file_plan.reach).ok()
            })
            .filter(|plan| {
                plan.displaced == file_plan.displaced
                    && plan.patch_at == file_plan.patch_at.wrapping_add(self.bias)
            });
        let Some(plan) = plan else {
            return self.skip(function, runtime_address, SkipReason::CodeDiffers);
        };
        let at = self.next_at();
        // Pages of a BTI-guarded module accept an indirect jump only onto a landing pad:
        // the way back must then be a direct B (a far plan's trampoline beyond B's reach
        // is refused with that reason).
        // The probe keeps where the function saves x30 beside its id (0: not known, or
        // too far for the field: the exception hooks then search the frame).
        let lr_save = if lr_save < 1 << glass_probe_abi::LR_SAVE_BITS {
            lr_save
        } else {
            0
        };
        let word = self.id as u64 | lr_save << glass_probe_abi::LR_SAVE_SHIFT;
        let built =
            glass_patch::aarch64::entry_trampoline(&plan, word, at, self.enter, self.guarded)
                .and_then(|(bytes, moves)| {
                    glass_patch::aarch64::patch_words(&plan, at).map(|patch| (bytes, moves, patch))
                });
        match built {
            Ok((bytes, moves, patch)) => {
                self.outcome.moves.extend(moves);
                self.patches
                    .push((plan.patch_at, glass_patch::aarch64::to_bytes(&patch)));
                self.install(
                    &bytes,
                    runtime_address,
                    function.size,
                    function.name.clone(),
                    Probe::ReturnAddress,
                );
            }
            Err(reason) => self.skip(function, runtime_address, SkipReason::Trampoline(reason)),
        }
    }

    /// A Go function: a jump over its entry and over each of its returns, each to a
    /// trampoline of its own, all written or none.
    fn sites_function(&mut self, function: &Function, file_plan: &SitePlan, padding: u64) {
        if self.out_of_ids(function) {
            return;
        }
        let runtime_address = function.address.wrapping_add(self.bias);
        let go = self.go;
        // Analyse again where the code runs (see `entry`), and require the same patches.
        let expected: Vec<(u64, u64)> = file_plan
            .overwritten()
            .into_iter()
            .map(|(at, len)| (at.wrapping_add(self.bias), len))
            .collect();
        let plan = self
            .in_memory(function, padding, |code, padding| {
                glass_patch::return_sites::plan(code, runtime_address, padding, &|_, _| None, go)
                    .ok()
            })
            .filter(|plan| plan.overwritten() == expected);
        let Some(plan) = plan else {
            return self.skip(function, runtime_address, SkipReason::CodeDiffers);
        };
        let (enter_slot, exit_slot, pushed_id) = self.site_slots();
        let mut code = Vec::new();
        let mut moves = Vec::new();
        let mut patches = Vec::new();
        let base = self.next_at();
        let built = (|| -> Result<(), String> {
            let mut place = |bytes: Vec<u8>, more: trampoline::Moves, from: u64, len: u64| {
                let at = base + code.len() as u64;
                let rel = i32::try_from(at as i64 - (from + 5) as i64)
                    .map_err(|_| format!("trampoline {at:#x} is out of reach of {from:#x}"))?;
                let mut patch = vec![0xe9];
                patch.extend_from_slice(&rel.to_le_bytes());
                patch.resize(len as usize, 0xcc);
                patches.push((from, patch));
                moves.extend(more);
                code.extend_from_slice(&bytes);
                code.resize(code.len().next_multiple_of(16), 0xcc);
                Ok::<u64, String>(base + code.len() as u64)
            };
            let (bytes, more) =
                trampoline::build_site_entry(&plan.entry, pushed_id, base, enter_slot, exit_slot)?;
            let mut next = place(bytes, more, plan.entry.patch_at, plan.entry.overwritten)?;
            for site in &plan.returns {
                let (bytes, more) =
                    glass_patch::return_sites::return_trampoline(site, pushed_id, next, exit_slot)?;
                next = place(bytes, more, site.at, site.overwritten)?;
            }
            Ok(())
        })();
        if let Err(reason) = built {
            return self.skip(function, runtime_address, SkipReason::Trampoline(reason));
        }
        self.outcome.moves.extend(moves);
        self.patches.extend(patches);
        self.install(
            &code,
            runtime_address,
            function.size,
            function.name.clone(),
            Probe::ReturnSites,
        );
    }

    /// A function too short for the entry jump, copied whole into its trampoline and
    /// reached from its direct call sites.
    fn redirect(&mut self, function: &Function, file_plan: &Plan, sites: &[DirectSite]) {
        if self.out_of_ids(function) {
            return;
        }
        let runtime_address = function.address.wrapping_add(self.bias);
        let plan = self
            .process
            .read(runtime_address, function.size as usize)
            .ok()
            .and_then(|code| glass_patch::whole_function_plan(&code, runtime_address).ok())
            .filter(|plan| plan.displaced == file_plan.displaced);
        let Some(plan) = plan else {
            return self.skip(function, runtime_address, SkipReason::CodeDiffers);
        };
        let at = self.next_at();
        let Ok(bytes) = trampoline::build(&plan, self.id, at, self.enter_slot()) else {
            return;
        };
        let mut rewrites = Vec::new();
        for site in sites {
            let site_at = site.at.wrapping_add(self.bias);
            let Ok(current) = self.process.read(site_at, site.len as usize) else {
                continue;
            };
            let end = site_at + site.len as u64;
            let rel = i32::try_from(at as i64 - end as i64);
            if glass_patch::branch_at(&current, site_at)
                == Some((runtime_address, site.len as usize))
            {
                if let Ok(rel) = rel {
                    rewrites.push((end - 4, rel.to_le_bytes().to_vec()));
                }
            }
        }
        if rewrites.is_empty() {
            let too_short = glass_patch::Reason::TooShort {
                size: function.size,
            };
            return self.skip(
                function,
                runtime_address,
                SkipReason::TooShortNoCallSite(too_short),
            );
        }
        self.patches.extend(rewrites);
        self.install(
            &bytes,
            runtime_address,
            function.size,
            function.name.clone(),
            Probe::CallSites,
        );
    }

    /// A library call, through a trampoline its GOT slot is pointed at.
    fn libcall(&mut self, name: &str, slot: u64) -> std::io::Result<()> {
        let slot = slot.wrapping_add(self.bias);
        let target = self.process.read_u64(slot)?;
        let at = self.next_at();
        if cfg!(target_arch = "aarch64") {
            let bytes = glass_patch::aarch64::got_trampoline(self.id as u64, self.enter, target);
            self.patches.push((slot, at.to_le_bytes().to_vec()));
            self.install(&bytes, target, 0, format!("{name}@plt"), Probe::LibraryCall);
            return Ok(());
        }
        let original = at + 24;
        let mut bytes = vec![0x68];
        bytes.extend_from_slice(&self.id.to_le_bytes());
        // call [rip + enter_slot]
        bytes.extend_from_slice(&[0xff, 0x15]);
        bytes.extend_from_slice(
            &((self.enter_slot() as i64 - (at + 11) as i64) as i32).to_le_bytes(),
        );
        // jmp [rip + original]
        bytes.extend_from_slice(&[0xff, 0x25]);
        bytes.extend_from_slice(&((original as i64 - (at + 17) as i64) as i32).to_le_bytes());
        bytes.resize(24, 0xcc);
        bytes.extend_from_slice(&target.to_le_bytes());
        self.patches.push((slot, at.to_le_bytes().to_vec()));
        self.install(&bytes, target, 0, format!("{name}@plt"), Probe::LibraryCall);
        Ok(())
    }
}
