//! x86-64's part of injection: registers, the launch mode's `syscall`, and calls that
//! return to a landing that restores the thread by itself (see the parent module).

use super::*;

impl StoppedProcess {
    pub(super) fn registers(&self) -> io::Result<libc::user_regs_struct> {
        crate::attach::registers(self.tid)
    }

    pub(super) fn set_registers(&self, regs: &libc::user_regs_struct) -> io::Result<()> {
        crate::attach::set_registers(self.tid, regs)
    }

    /// Runs one system call by writing `syscall` at the thread's instruction pointer and
    /// stepping over it; returns its result (negative: -errno). Only for the launch
    /// mode's process, whose only thread is this one: in a running process another
    /// thread could execute the written bytes.
    pub(super) fn syscall_at_pc(&self, number: u64, args: [u64; 6]) -> io::Result<i64> {
        let saved = self.registers()?;
        let at = saved.rip;
        let code = self.read(at, 2)?;
        self.write(at, &[0x0f, 0x05])?;
        let mut regs = saved;
        regs.rax = number;
        regs.orig_rax = u64::MAX;
        regs.rdi = args[0];
        regs.rsi = args[1];
        regs.rdx = args[2];
        regs.r10 = args[3];
        regs.r8 = args[4];
        regs.r9 = args[5];
        let run = self.set_registers(&regs).and_then(|()| {
            ptrace(libc::PTRACE_SINGLESTEP, self.tid, 0, 0)
                .map_err(io::Error::from_raw_os_error)?;
            loop {
                let status = wait_stop(self.tid).map_err(|e| io::Error::other(e.to_string()))?;
                if libc::WIFSTOPPED(status)
                    && (status >> 16) == 0
                    && libc::WSTOPSIG(status) == libc::SIGTRAP
                {
                    break;
                }
                // A signal arrived instead of the step: keep it pending for later.
                ptrace(libc::PTRACE_SINGLESTEP, self.tid, 0, 0)
                    .map_err(io::Error::from_raw_os_error)?;
            }
            Ok(self.registers()?.rax as i64)
        });
        self.write(at, &code)?;
        self.set_registers(&saved)?;
        run
    }

    /// Calls `function` in the stopped thread with up to six integer arguments, as if
    /// the thread had called it where it stopped (below its red zone, stack aligned),
    /// and returns its result, with the thread's registers (general, x87/SSE/AVX) as
    /// they were. Signals that arrive during the call are delivered to it.
    ///
    /// The call returns to the landing (see [`landing_code`]) with the thread's state
    /// saved just above its return address; glass, watching the thread's system calls,
    /// stops it at the landing's `getpid` and puts its registers back itself. A glass
    /// that dies during the call leaves a thread that finishes the call, restores its
    /// own state at the landing and runs on as if nothing had happened. Before a landing
    /// exists (the first call in a process maps it) the call returns to address 0.
    ///
    /// Gives up after `limit`: with a landing the thread is left to finish the call on
    /// its own (it restores itself when it returns) and takes no other call; without
    /// one its registers are put back, the call's frames abandoned.
    pub fn call(&self, function: u64, args: &[CallArg], limit: Duration) -> io::Result<u64> {
        if self.busy.get() {
            return Err(io::Error::other(
                "the thread is still in an injected call that did not return",
            ));
        }
        let original = resumable(self.registers()?);
        let landing = self.landing.get();
        let xstate = match landing {
            0 => None,
            _ => Some(read_xstate(self.tid, xstate_kind())?),
        };
        let mut regs = original;
        // Past the red zone of whatever the thread was running.
        let mut sp = (original.rsp - 128) & !15;
        let mut values = Vec::new();
        for arg in args {
            match arg {
                CallArg::Value(v) => values.push(*v),
                CallArg::Bytes(bytes) => {
                    sp = (sp - bytes.len() as u64) & !15;
                    self.write(sp, bytes)?;
                    values.push(sp);
                }
            }
        }
        if let Some(xstate) = &xstate {
            sp = (sp - (CONTEXT_XSTATE + xstate.len()) as u64) & !63;
            self.write(sp, &landing_context(&original, xstate))?;
        }
        let registers = [
            &mut regs.rdi,
            &mut regs.rsi,
            &mut regs.rdx,
            &mut regs.rcx,
            &mut regs.r8,
            &mut regs.r9,
        ];
        for (register, value) in registers.into_iter().zip(values) {
            *register = value;
        }
        // The return address; at a function's first instruction rsp + 8 is 16-byte
        // aligned, and the landing finds its context at rsp once the call returned.
        sp -= 8;
        self.write(sp, &landing.to_le_bytes())?;
        regs.rsp = sp;
        regs.rip = function;
        regs.rax = 0;
        regs.orig_rax = u64::MAX;
        regs.eflags &= !TRAP_FLAG;
        self.set_registers(&regs)?;
        let outcome = self.run_call(landing, Instant::now() + limit);
        if matches!(outcome, Err(CallEnd::TimedOut(_))) && landing != 0 {
            self.busy.set(true);
        } else if !matches!(outcome, Err(CallEnd::Ended(_))) {
            self.set_registers(&original)?;
            if let Some(xstate) = &xstate {
                write_xstate(self.tid, xstate_kind(), xstate)?;
            }
        }
        outcome.map_err(CallEnd::into_error)
    }

    /// Runs the thread until the call it was set up for returns: its result.
    fn run_call(&self, landing: u64, deadline: Instant) -> Result<u64, CallEnd> {
        // With a landing, every system call stops the thread (at its entry and exit):
        // the landing's is how glass learns that the call returned.
        let request = match landing {
            0 => libc::PTRACE_CONT,
            _ => libc::PTRACE_SYSCALL,
        };
        let io = CallEnd::Faulted;
        let mut signal = 0;
        let mut first = true;
        loop {
            let Some(status) =
                self.resume_in_call(request, std::mem::take(&mut signal), &mut first, deadline)?
            else {
                continue;
            };
            let stop = libc::WSTOPSIG(status);
            if stop == libc::SIGTRAP | 0x80 {
                let regs = self.registers().map_err(io)?;
                if landing != 0 && regs.rip == landing + LANDING_CATCH && regs.orig_rax == GETPID {
                    return self.read_u64(regs.rsp).map_err(io);
                }
                continue;
            }
            if (status >> 16) != 0 {
                continue;
            }
            if stop == libc::SIGSEGV && landing == 0 {
                let regs = self.registers().map_err(io)?;
                if regs.rip == 0 {
                    return Ok(regs.rax);
                }
            }
            if matches!(
                stop,
                libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE
            ) {
                let regs = self.registers().map_err(io)?;
                return Err(CallEnd::Faulted(io::Error::other(format!(
                    "the injected call faulted (signal {stop} at {:#x})",
                    regs.rip
                ))));
            }
            signal = stop as usize;
        }
    }
}

const TRAP_FLAG: u64 = 0x100;
const GETPID: u64 = libc::SYS_getpid as u64;

/// A stopped thread's registers as the kernel would resume it, with no system call
/// left for the kernel to restart: stopped in an interrupted system call that is to be
/// restarted (rax -ERESTARTSYS, -ERESTARTNOINTR, -ERESTARTNOHAND or
/// -ERESTART_RESTARTBLOCK, orig_rax the call), the instruction pointer goes back to the
/// 2-byte `syscall` and rax gets the call's number (restart_syscall's for the last),
/// exactly what the kernel does when the thread resumes with no signal handler to run.
/// Registers written back in that form cannot be restarted a second time, wherever the
/// thread was stopped in between (an injected call, the landing, a syscall stop).
pub fn resumable(mut regs: libc::user_regs_struct) -> libc::user_regs_struct {
    const RESTART_SYSCALL: u64 = 219;
    if (regs.orig_rax as i64) >= 0 {
        match regs.rax as i64 {
            -514..=-512 => {
                regs.rax = regs.orig_rax;
                regs.rip = regs.rip.wrapping_sub(2);
            }
            -516 => {
                regs.rax = RESTART_SYSCALL;
                regs.rip = regs.rip.wrapping_sub(2);
            }
            _ => {}
        }
    }
    regs.orig_rax = u64::MAX;
    regs
}

/// How the thread's x87/SSE/AVX state is read and restored: XSAVE's layout where the
/// CPU has it, else FXSAVE's.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum XstateKind {
    Xsave,
    Fxsave,
}

pub fn xstate_kind() -> XstateKind {
    if std::arch::is_x86_feature_detected!("xsave") {
        XstateKind::Xsave
    } else {
        XstateKind::Fxsave
    }
}

const NT_PRFPREG: usize = 2;
const NT_X86_XSTATE: usize = 0x202;

fn regset(kind: XstateKind) -> usize {
    match kind {
        XstateKind::Xsave => NT_X86_XSTATE,
        XstateKind::Fxsave => NT_PRFPREG,
    }
}

fn read_xstate(tid: i32, kind: XstateKind) -> io::Result<Vec<u8>> {
    let mut buffer = vec![0u8; 1 << 14];
    let mut iov = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    ptrace(
        libc::PTRACE_GETREGSET,
        tid,
        regset(kind),
        &mut iov as *mut _ as usize,
    )
    .map_err(io::Error::from_raw_os_error)?;
    buffer.truncate(iov.iov_len);
    Ok(buffer)
}

fn write_xstate(tid: i32, kind: XstateKind, state: &[u8]) -> io::Result<()> {
    let mut copy = state.to_vec();
    let mut iov = libc::iovec {
        iov_base: copy.as_mut_ptr().cast(),
        iov_len: copy.len(),
    };
    ptrace(
        libc::PTRACE_SETREGSET,
        tid,
        regset(kind),
        &mut iov as *mut _ as usize,
    )
    .map_err(io::Error::from_raw_os_error)?;
    Ok(())
}

/// The landing's context, at the stack pointer when the call returns:
/// the result (written by the landing), the 15 general registers, an `iretq` frame
/// (rip, cs, rflags, rsp, ss), and at CONTEXT_XSTATE (64-byte aligned) the x87/SSE/AVX
/// state as ptrace gave it (the standard, uncompacted XSAVE layout, or FXSAVE's).
const CONTEXT_REGISTERS: usize = 8;
const CONTEXT_IRET: usize = 128;
const CONTEXT_XSTATE: usize = 192;
/// The general registers in the context, by their x86 encoding number (rsp, 4, is the
/// iretq frame's).
const RESTORED: [u8; 15] = [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

fn landing_context(regs: &libc::user_regs_struct, xstate: &[u8]) -> Vec<u8> {
    let by_number = |n: u8| match n {
        0 => regs.rax,
        1 => regs.rcx,
        2 => regs.rdx,
        3 => regs.rbx,
        5 => regs.rbp,
        6 => regs.rsi,
        7 => regs.rdi,
        8 => regs.r8,
        9 => regs.r9,
        10 => regs.r10,
        11 => regs.r11,
        12 => regs.r12,
        13 => regs.r13,
        14 => regs.r14,
        _ => regs.r15,
    };
    let mut context = vec![0u8; CONTEXT_XSTATE + xstate.len()];
    for (i, &n) in RESTORED.iter().enumerate() {
        let at = CONTEXT_REGISTERS + 8 * i;
        context[at..at + 8].copy_from_slice(&by_number(n).to_le_bytes());
    }
    let frame = [
        regs.rip,
        regs.cs,
        regs.eflags & !TRAP_FLAG,
        regs.rsp,
        regs.ss,
    ];
    for (i, word) in frame.iter().enumerate() {
        let at = CONTEXT_IRET + 8 * i;
        context[at..at + 8].copy_from_slice(&word.to_le_bytes());
    }
    context[CONTEXT_XSTATE..].copy_from_slice(xstate);
    context
}

/// Where glass stops a thread in the landing: just after its `syscall`.
const LANDING_CATCH: u64 = 11;

/// The code injected calls return to, with rsp at their context:
///
/// ```text
///  0  mov [rsp], rax              the result
///  4  mov eax, 39                 getpid: glass, tracing the thread's system calls,
///  9  syscall                     stops it here (LANDING_CATCH) and restores it itself
/// 11  mov eax, -1; mov edx, -1    (reached only when glass died during the call)
///     xrstor64 [rsp+192]          the x87/SSE/AVX state (fxrstor64 without XSAVE)
///     mov r, [rsp+8+8i]           the 15 general registers but rsp
///     add rsp, 128
///     iretq                       rip, rflags and rsp at once
/// ```
///
/// Written by hand rather than assembled at run time: 23 fixed instructions, decoded
/// back in the tests.
pub fn landing_code(kind: XstateKind) -> Vec<u8> {
    let mut code = vec![0x48, 0x89, 0x04, 0x24, 0xb8, 39, 0, 0, 0, 0x0f, 0x05];
    debug_assert_eq!(code.len() as u64, LANDING_CATCH);
    let disp32 = |code: &mut Vec<u8>, value: usize| {
        code.extend_from_slice(&(value as u32).to_le_bytes());
    };
    // [rsp + disp32] is ModRM mod=10 rm=100 with SIB 0x24.
    match kind {
        XstateKind::Xsave => {
            code.extend_from_slice(&[0xb8, 0xff, 0xff, 0xff, 0xff, 0xba, 0xff, 0xff, 0xff, 0xff]);
            code.extend_from_slice(&[0x48, 0x0f, 0xae, 0x80 | (5 << 3) | 4, 0x24]);
        }
        XstateKind::Fxsave => {
            code.extend_from_slice(&[0x48, 0x0f, 0xae, 0x80 | (1 << 3) | 4, 0x24])
        }
    }
    disp32(&mut code, CONTEXT_XSTATE);
    for (i, &n) in RESTORED.iter().enumerate() {
        let rex = 0x48 | if n >= 8 { 0x04 } else { 0 };
        code.extend_from_slice(&[rex, 0x8b, 0x80 | ((n & 7) << 3) | 4, 0x24]);
        disp32(&mut code, CONTEXT_REGISTERS + 8 * i);
    }
    code.extend_from_slice(&[0x48, 0x81, 0xc4]);
    disp32(&mut code, CONTEXT_IRET);
    code.extend_from_slice(&[0x48, 0xcf]);
    code
}

/// Nothing is kept between calls on x86-64 (see the AArch64 `Saved`).
pub(super) type Saved = ();

/// `int3`, written at the entry point by the launch mode; its trap leaves the
/// instruction pointer just past it.
pub(super) const BREAKPOINT: &[u8] = &[0xcc];
pub(super) const PC_AFTER_BREAKPOINT: u64 = 1;

pub(super) fn pc(regs: &libc::user_regs_struct) -> u64 {
    regs.rip
}

pub(super) fn set_pc(regs: &mut libc::user_regs_struct, pc: u64) {
    regs.rip = pc;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(code: &[u8]) -> Vec<String> {
        let decoder = iced_x86::Decoder::new(64, code, iced_x86::DecoderOptions::NONE);
        let mut formatter = iced_x86::IntelFormatter::new();
        decoder
            .into_iter()
            .map(|instruction| {
                let mut text = String::new();
                iced_x86::Formatter::format(&mut formatter, &instruction, &mut text);
                text
            })
            .collect()
    }

    #[test]
    fn the_landing_saves_the_result_stops_at_getpid_then_restores_everything() {
        for kind in [XstateKind::Xsave, XstateKind::Fxsave] {
            let code = landing_code(kind);
            let text = decode(&code);
            assert_eq!(
                text[..3],
                ["mov [rsp],rax", "mov eax,27h", "syscall"],
                "{kind:?}"
            );
            // glass stops the thread at the syscall's end.
            let catch = decode(&code[..LANDING_CATCH as usize]);
            assert_eq!(catch.len(), 3);
            let restore = match kind {
                XstateKind::Xsave => {
                    assert_eq!(text[3..5], ["mov eax,0FFFFFFFFh", "mov edx,0FFFFFFFFh"]);
                    &text[5]
                }
                XstateKind::Fxsave => &text[3],
            };
            let wanted = match kind {
                XstateKind::Xsave => "xrstor64 [rsp+0C0h]",
                XstateKind::Fxsave => "fxrstor64 [rsp+0C0h]",
            };
            assert_eq!(restore, wanted);
            let loads: Vec<&String> = text.iter().filter(|t| t.starts_with("mov r")).collect();
            // The 15 general registers but rsp, each from its slot of the context.
            assert_eq!(loads.len(), 15, "{text:?}");
            assert!(!loads.iter().any(|t| t.starts_with("mov rsp")));
            for (i, name) in ["rax", "rcx", "rdx", "rbx", "rbp", "rsi", "rdi"]
                .iter()
                .enumerate()
            {
                let slot = CONTEXT_REGISTERS + 8 * [0, 1, 2, 3, 4, 5, 6][i];
                assert!(
                    loads.contains(&&format!("mov {name},[rsp+{slot:X}h]"))
                        || loads.contains(&&format!("mov {name},[rsp+{slot}]")),
                    "{name} at {slot}: {loads:?}"
                );
            }
            assert_eq!(text[text.len() - 2], "add rsp,80h");
            assert_eq!(text[text.len() - 1], "iretq");
        }
    }

    #[test]
    fn the_context_holds_the_registers_in_the_landings_order() {
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        regs.rax = 1;
        regs.rbx = 3;
        regs.r15 = 15;
        regs.rip = 0x401000;
        regs.cs = 0x33;
        regs.eflags = 0x246 | TRAP_FLAG;
        regs.rsp = 0x7fff0000;
        regs.ss = 0x2b;
        let context = landing_context(&regs, &[0xaa; 64]);
        let word = |at: usize| u64::from_le_bytes(context[at..at + 8].try_into().unwrap());
        assert_eq!(word(CONTEXT_REGISTERS), 1);
        assert_eq!(word(CONTEXT_REGISTERS + 8 * 3), 3);
        assert_eq!(word(CONTEXT_REGISTERS + 8 * 14), 15);
        assert_eq!(
            [0, 1, 2, 3, 4].map(|i| word(CONTEXT_IRET + 8 * i)),
            [0x401000, 0x33, 0x246, 0x7fff0000, 0x2b]
        );
        assert_eq!(&context[CONTEXT_XSTATE..], &[0xaa; 64]);
    }

    #[test]
    fn a_restartable_system_call_is_put_in_its_restarted_form_once() {
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        regs.rip = 0x1002;
        regs.orig_rax = 230;
        regs.rax = (-516i64) as u64;
        let once = resumable(regs);
        assert_eq!((once.rip, once.rax, once.orig_rax), (0x1000, 219, u64::MAX));
        assert_eq!(resumable(once).rip, 0x1000);
        regs.rax = (-512i64) as u64;
        let sys = resumable(regs);
        assert_eq!((sys.rip, sys.rax), (0x1000, 230));
        // Finished (or interrupted without a restart): left as it is.
        regs.rax = (-4i64) as u64;
        let eintr = resumable(regs);
        assert_eq!((eintr.rip, eintr.rax as i64), (0x1002, -4));
    }
}
