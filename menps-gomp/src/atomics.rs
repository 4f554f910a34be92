//! Locked instructions of the program on DSM memory.
//!
//! GCC compiles `reduction` clauses and `#pragma omp atomic` to locked
//! instructions on the shared variable (`lock add`, a `lock cmpxchg` loop
//! for `double`, `lock xadd` for a capture …). With the DSM, each process
//! holds its own copy of a page, so such an instruction is atomic on that
//! copy only: two processes adding to one `sum` would each publish their
//! own total, and the DSM would see a write-write race at the next barrier.
//!
//! In a job of several processes, the runtime therefore finds every locked
//! instruction of the executable's `.text` at start-up (decoding it with
//! `iced-x86`) and replaces its first byte with a breakpoint (`int3`). The
//! breakpoint's handler decodes the original instruction, computes its
//! memory operand from the interrupted registers, and performs it: on DSM
//! memory as a compare-and-swap loop of relaxed DSM atomics on the aligned
//! 64-bit word that holds the operand (transactions on the coherent copy of
//! its block, under the block's global lock: atomic across processes; what
//! they write is published like other writes, at the next barrier or lock
//! release, which is when OpenMP makes an `atomic`'s or a reduction's
//! result visible); elsewhere as a native atomic. It then writes the results
//! (the destination register of `xadd`, `xchg` and `cmpxchg`, and the
//! arithmetic flags) into the interrupted registers and resumes after the
//! instruction. Results are exact, whatever the operator and type: the
//! operation happens once, on one copy.
//!
//! Each emulated instruction costs a trap and a DSM atomic (microseconds):
//! cheap for reductions (one per thread and region), slow for an `atomic`
//! inside a hot loop. Locked instructions in shared libraries (libc's own
//! locks, say) are left alone: they must not operate on DSM memory.
//!
//! # Fences: `#pragma omp flush`
//!
//! GCC compiles `flush` (and `__sync_synchronize`) to a locked no-op on the
//! stack, `lock orq $0,(%rsp)`, with no call into the runtime; other
//! compilers emit `mfence`. Both are fences of one processor's memory
//! only: a thread waiting for a flag another process sets would spin on
//! its stale copy for ever. They are patched too, and their handler runs
//! a DSM flush ([`menps_dsm::dsm::Dsm::flush`]): this process's writes are
//! published, and those other processes published by flushing are
//! acquired. A flush that neither published nor acquired anything is a
//! wait loop's: the thread backs off as every waiting thread of the runtime
//! does (menps-omp's `Waiter`, on the workspace's one back-off: processor
//! hints, then yielding the user-level thread and the processor; a worker
//! thread never sleeps), so a waiter does not take the core of the process
//! it waits for.
//!
//! In a job of one process, fences are patched only when the team has more
//! threads than the process has workers: a wait loop could then hold the
//! worker that the thread it waits for needs, so the handler yields the
//! user-level thread after the fence.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use menps_dsm::dsm::allocator::RuntimeGuard;
use menps_dsm::dsm::team::TeamConfig;
use menps_omp::internals::Waiter;

use crate::die;
use menps_omp::Error;

/// A patched instruction.
struct Patch {
    addr: usize,
    instr: Instruction,
    /// Whether it is a fence (`mfence`, or a locked no-op).
    fence: bool,
}

/// Which instructions [`install`] patches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Patching {
    /// Locked instructions and fences (a job of several processes).
    All,
    /// Fences only (one process with more team threads than workers).
    Fences,
}

/// The patched instructions, by address.
static PATCHES: OnceLock<Vec<Patch>> = OnceLock::new();

/// `.text` of the executable (absolute address and size), from its section
/// headers.
fn text_section(bias: usize) -> Option<(usize, usize)> {
    let _rt = RuntimeGuard::enter();
    let file = std::fs::read("/proc/self/exe").ok()?;
    let u16_at = |o: usize| Some(u16::from_le_bytes(file.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(file.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(file.get(o..o + 8)?.try_into().ok()?));
    if file.get(..4)? != b"\x7fELF" || *file.get(4)? != 2 {
        return None;
    }
    let shoff = u64_at(0x28)? as usize;
    let shentsize = u16_at(0x3a)? as usize;
    let shnum = u16_at(0x3c)? as usize;
    let shstrndx = u16_at(0x3e)? as usize;
    let sh = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(sh(shstrndx) + 0x18)? as usize;
    for i in 0..shnum {
        let name_off = u32_at(sh(i))? as usize;
        let name = file.get(strtab + name_off..)?;
        if name.starts_with(b".text\0") {
            let addr = u64_at(sh(i) + 0x10)? as usize;
            let size = u64_at(sh(i) + 0x20)? as usize;
            return Some((bias + addr, size));
        }
    }
    None
}

/// Whether `i` is a locked read-modify-write of memory (with a `lock`
/// prefix, or `xchg` with memory, which locks implicitly).
fn is_locked_rmw(i: &Instruction) -> bool {
    let mem = (0..i.op_count()).any(|k| i.op_kind(k) == OpKind::Memory);
    mem && (i.has_lock_prefix() || i.mnemonic() == Mnemonic::Xchg)
}

/// Whether `i` is a fence: `mfence`, or a locked read-modify-write that
/// changes nothing (`lock or $0`, `lock add $0` …: GCC's full barrier).
fn is_fence(i: &Instruction) -> bool {
    if i.mnemonic() == Mnemonic::Mfence {
        return true;
    }
    let zero_imm = matches!(
        i.op_kind(1),
        OpKind::Immediate8
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate8to16
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64
    ) && i.immediate(1) == 0;
    is_locked_rmw(i)
        && matches!(
            i.mnemonic(),
            Mnemonic::Or | Mnemonic::Add | Mnemonic::Sub | Mnemonic::Xor
        )
        && zero_imm
}

/// Finds and patches the executable's locked instructions and fences (or
/// its fences only), and installs the breakpoint handler.
pub(crate) fn install(exe: &crate::image::Executable, what: Patching) -> Result<(), Error> {
    let Some((text, size)) = text_section(exe.bias) else {
        return Err(Error::Config(
            "cannot find the executable's .text section (to handle its locked instructions)".into(),
        ));
    };
    let patches = {
        let _rt = RuntimeGuard::enter();
        // SAFETY: `.text` of the running executable is mapped readable.
        let code = unsafe { core::slice::from_raw_parts(text as *const u8, size) };
        let mut d = Decoder::with_ip(64, code, text as u64, DecoderOptions::NONE);
        let mut out = Vec::new();
        let mut i = Instruction::default();
        while d.can_decode() {
            d.decode_out(&mut i);
            if i.is_invalid() {
                continue;
            }
            let fence = is_fence(&i);
            if fence || (what == Patching::All && is_locked_rmw(&i)) {
                out.push(Patch {
                    addr: i.ip() as usize,
                    instr: i,
                    fence,
                });
            }
        }
        out
    };
    if patches.is_empty() {
        return Ok(());
    }
    // The handler first, then the breakpoints.
    // SAFETY: installs a SIGTRAP handler of this module.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_trap as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGTRAP, &sa, core::ptr::null_mut()) != 0 {
            return Err(Error::Config("cannot install the SIGTRAP handler".into()));
        }
    }
    let page = 4096usize;
    let lo = patches[0].addr & !(page - 1);
    let hi = (patches[patches.len() - 1].addr + 1).next_multiple_of(page);
    // SAFETY: makes the executable's own code pages writable for the time
    // of the patching (no other thread of the program runs yet), writes one
    // byte per patched instruction, and restores read+execute.
    unsafe {
        if libc::mprotect(
            lo as *mut c_void,
            hi - lo,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
        ) != 0
        {
            return Err(Error::Config(format!(
                "cannot patch the executable's locked instructions: mprotect: {}",
                std::io::Error::last_os_error()
            )));
        }
        for p in &patches {
            (p.addr as *mut u8).write_volatile(0xcc);
        }
        libc::mprotect(
            lo as *mut c_void,
            hi - lo,
            libc::PROT_READ | libc::PROT_EXEC,
        );
    }
    let _ = PATCHES.set(patches);
    Ok(())
}

/// The patch at `addr`, if any.
fn patch_at(addr: usize) -> Option<&'static Patch> {
    let p = PATCHES.get()?;
    p.binary_search_by_key(&addr, |p| p.addr)
        .ok()
        .map(|i| &p[i])
}

/// The SIGTRAP handler.
unsafe extern "C" fn on_trap(_sig: c_int, _info: *mut libc::siginfo_t, uctx: *mut c_void) {
    // SAFETY: the kernel's ucontext of this signal.
    let rip =
        unsafe { (*uctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_RIP as usize] }
            as usize;
    let Some(patch) = patch_at(rip.wrapping_sub(1)) else {
        // Not one of ours (a breakpoint of the program itself): die as
        // SIGTRAP does by default.
        // SAFETY: restores the default action and raises the signal again.
        unsafe {
            libc::signal(libc::SIGTRAP, libc::SIG_DFL);
            libc::raise(libc::SIGTRAP);
        }
        return;
    };
    // SAFETY: `uctx` is this handler's; the emulation runs on the
    // interrupted stack (a user-level thread's, with room like any call),
    // and nothing here needs a destructor.
    let _ = unsafe {
        ct_context::trap::run_on_interrupted_stack_with(uctx, move |uc| {
            let _errno = crate::errno::KeepErrno::new();
            if patch.fence {
                flush(uc, patch)
            } else {
                emulate(uc, patch)
            }
        })
    };
}

std::thread_local! {
    /// The back-off of wait loops that flush (per OS thread: a loop's
    /// state, taken out while it waits).
    static FLUSH_WAIT: core::cell::Cell<Waiter> = core::cell::Cell::new(Waiter::new());
}

/// Performs the patched fence: a DSM flush in a job of several processes
/// (backing off when it changed nothing), a yield in one process; resumes
/// after it.
fn flush(uc: *mut libc::ucontext_t, patch: &Patch) {
    core::sync::atomic::fence(Ordering::SeqCst);
    // SAFETY: the relocated frame of the interrupted code.
    let program_sp = unsafe { (*uc).uc_mcontext.gregs[libc::REG_RSP as usize] } as usize;
    match menps_omp::internals::runtime().filter(|rt| rt.dsm.nprocs() > 1) {
        Some(rt) => {
            let productive = {
                let _rt = RuntimeGuard::enter();
                rt.dsm
                    .flush_from(program_sp)
                    .unwrap_or_else(|e| die(format_args!("flush: {e}")))
            };
            let mut w = FLUSH_WAIT.take();
            if productive {
                w = Waiter::new();
            } else {
                w.wait();
            }
            FLUSH_WAIT.set(w);
        }
        None => ct_worker::yield_now_in::<TeamConfig>(),
    }
    // SAFETY: the relocated frame of the interrupted code, ours to change.
    let frame = unsafe { &mut (*uc).uc_mcontext.gregs };
    frame[libc::REG_RIP as usize] = (patch.addr + patch.instr.len()) as i64;
}

/// An instruction for a message: its mnemonic and address.
fn describe(i: &Instruction) -> String {
    format!("`{:?}` at {:#x}", i.mnemonic(), i.ip())
}

/// `gregs` index of a 64-bit general-purpose register.
fn greg(r: Register) -> Option<usize> {
    use libc::*;
    let i = match r {
        Register::RAX => REG_RAX,
        Register::RBX => REG_RBX,
        Register::RCX => REG_RCX,
        Register::RDX => REG_RDX,
        Register::RSI => REG_RSI,
        Register::RDI => REG_RDI,
        Register::RBP => REG_RBP,
        Register::RSP => REG_RSP,
        Register::R8 => REG_R8,
        Register::R9 => REG_R9,
        Register::R10 => REG_R10,
        Register::R11 => REG_R11,
        Register::R12 => REG_R12,
        Register::R13 => REG_R13,
        Register::R14 => REG_R14,
        Register::R15 => REG_R15,
        Register::RIP => REG_RIP,
        _ => return None,
    };
    Some(i as usize)
}

fn is_high_byte(r: Register) -> bool {
    matches!(r, Register::AH | Register::BH | Register::CH | Register::DH)
}

/// The value of register `r` (any width) in `g`.
fn read_reg(g: &[i64; 23], r: Register) -> u64 {
    let full = r.full_register();
    let v = greg(full).map_or_else(
        || die(format_args!("locked instruction: register {r:?}")),
        |i| g[i] as u64,
    );
    if is_high_byte(r) {
        return (v >> 8) & 0xff;
    }
    match r.size() {
        1 => v & 0xff,
        2 => v & 0xffff,
        4 => v & 0xffff_ffff,
        _ => v,
    }
}

/// Writes `v` to register `r` as the processor would (32-bit writes clear
/// the upper half; 8- and 16-bit writes keep the rest).
fn write_reg(g: &mut [i64; 23], r: Register, v: u64) {
    let i = greg(r.full_register())
        .unwrap_or_else(|| die(format_args!("locked instruction: register {r:?}")));
    let old = g[i] as u64;
    let new = if is_high_byte(r) {
        (old & !0xff00) | ((v & 0xff) << 8)
    } else {
        match r.size() {
            1 => (old & !0xff) | (v & 0xff),
            2 => (old & !0xffff) | (v & 0xffff),
            4 => v & 0xffff_ffff,
            _ => v,
        }
    };
    g[i] = new as i64;
}

const CF: u64 = 1;
const PF: u64 = 1 << 2;
const AF: u64 = 1 << 4;
const ZF: u64 = 1 << 6;
const SF: u64 = 1 << 7;
const OF: u64 = 1 << 11;
const ARITH: u64 = CF | PF | AF | ZF | SF | OF;

/// ZF, SF and PF of a result of `bits` bits.
fn szp(r: u64, bits: u32) -> u64 {
    let mask = mask(bits);
    let mut f = 0;
    if r & mask == 0 {
        f |= ZF;
    }
    if (r >> (bits - 1)) & 1 == 1 {
        f |= SF;
    }
    if (r as u8).count_ones().is_multiple_of(2) {
        f |= PF;
    }
    f
}

fn mask(bits: u32) -> u64 {
    if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// Flags of `a + b + c` (`c` the carry in) on `bits` bits, and the sum.
fn add_flags(a: u64, b: u64, c: u64, bits: u32) -> (u64, u64) {
    let m = mask(bits);
    let wide = u128::from(a & m) + u128::from(b & m) + u128::from(c);
    let r = (wide as u64) & m;
    let mut f = szp(r, bits);
    if wide >> bits != 0 {
        f |= CF;
    }
    if ((a ^ r) & (b ^ r)) >> (bits - 1) & 1 == 1 {
        f |= OF;
    }
    if (a ^ b ^ r) & 0x10 != 0 {
        f |= AF;
    }
    (r, f)
}

/// Flags of `a - b - c` on `bits` bits, and the difference.
fn sub_flags(a: u64, b: u64, c: u64, bits: u32) -> (u64, u64) {
    let m = mask(bits);
    let r = (a & m).wrapping_sub(b & m).wrapping_sub(c) & m;
    let mut f = szp(r, bits);
    if u128::from(a & m) < u128::from(b & m) + u128::from(c) {
        f |= CF;
    }
    if ((a ^ b) & (a ^ r)) >> (bits - 1) & 1 == 1 {
        f |= OF;
    }
    if (a ^ b ^ r) & 0x10 != 0 {
        f |= AF;
    }
    (r, f)
}

/// What one execution of the instruction does to the old memory value:
/// the new value (`None`: no store), the value for the register operand
/// (if it gets one), and the flags (`None`: unchanged) with the mask of
/// flags it sets.
struct Effect {
    store: Option<u64>,
    reg: Option<u64>,
    flags: Option<(u64, u64)>,
}

/// The effect of instruction `i` on memory value `old` (`bits` wide), with
/// the interrupted registers `g`.
fn effect(i: &Instruction, g: &[i64; 23], old: u64, bits: u32) -> Effect {
    let m = mask(bits);
    let cf_in = (g[libc::REG_EFL as usize] as u64) & CF;
    // The second operand: a register or an immediate.
    let src = || -> u64 {
        match i.op_kind(1) {
            OpKind::Register => read_reg(g, i.op1_register()),
            OpKind::Immediate8 | OpKind::Immediate16 | OpKind::Immediate32 => i.immediate(1) & m,
            OpKind::Immediate8to16
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64 => i.immediate(1) & m,
            other => die(format_args!(
                "locked instruction {}: operand {other:?}",
                describe(i)
            )),
        }
    };
    let arith = |(r, f): (u64, u64)| Effect {
        store: Some(r),
        reg: None,
        flags: Some((f, ARITH)),
    };
    let logic = |r: u64| Effect {
        store: Some(r & m),
        reg: None,
        flags: Some((szp(r & m, bits), ARITH)),
    };
    match i.mnemonic() {
        Mnemonic::Add => arith(add_flags(old, src(), 0, bits)),
        Mnemonic::Adc => arith(add_flags(old, src(), cf_in, bits)),
        Mnemonic::Sub => arith(sub_flags(old, src(), 0, bits)),
        Mnemonic::Sbb => arith(sub_flags(old, src(), cf_in, bits)),
        Mnemonic::And => logic(old & src()),
        Mnemonic::Or => logic(old | src()),
        Mnemonic::Xor => logic(old ^ src()),
        Mnemonic::Inc => {
            let (r, f) = add_flags(old, 1, 0, bits);
            Effect {
                store: Some(r),
                reg: None,
                flags: Some((f, ARITH & !CF)),
            }
        }
        Mnemonic::Dec => {
            let (r, f) = sub_flags(old, 1, 0, bits);
            Effect {
                store: Some(r),
                reg: None,
                flags: Some((f, ARITH & !CF)),
            }
        }
        Mnemonic::Neg => {
            let (r, f) = sub_flags(0, old, 0, bits);
            arith((r, f))
        }
        Mnemonic::Not => Effect {
            store: Some(!old & m),
            reg: None,
            flags: None,
        },
        Mnemonic::Xadd => {
            let (r, f) = add_flags(old, read_reg(g, i.op1_register()), 0, bits);
            Effect {
                store: Some(r),
                reg: Some(old),
                flags: Some((f, ARITH)),
            }
        }
        Mnemonic::Xchg => {
            let other = if i.op_kind(0) == OpKind::Register {
                i.op0_register()
            } else {
                i.op1_register()
            };
            Effect {
                store: Some(read_reg(g, other)),
                reg: Some(old),
                flags: None,
            }
        }
        Mnemonic::Cmpxchg => {
            let acc_reg = match bits {
                8 => Register::AL,
                16 => Register::AX,
                32 => Register::EAX,
                _ => Register::RAX,
            };
            let acc = read_reg(g, acc_reg);
            let (_, f) = sub_flags(acc, old, 0, bits);
            if acc == old {
                Effect {
                    store: Some(read_reg(g, i.op1_register())),
                    reg: None,
                    flags: Some((f, ARITH)),
                }
            } else {
                Effect {
                    store: None,
                    reg: Some(old),
                    flags: Some((f, ARITH)),
                }
            }
        }
        Mnemonic::Bts | Mnemonic::Btr | Mnemonic::Btc => {
            let bit = src();
            if bit >= u64::from(bits) {
                die(format_args!(
                    "locked instruction {}: a bit offset beyond the operand",
                    describe(i)
                ));
            }
            let b = 1u64 << bit;
            let new = match i.mnemonic() {
                Mnemonic::Bts => old | b,
                Mnemonic::Btr => old & !b,
                _ => old ^ b,
            };
            Effect {
                store: Some(new),
                reg: None,
                flags: Some((u64::from(old & b != 0), CF)),
            }
        }
        _ => die(format_args!(
            "the locked instruction {} is not supported on DSM memory",
            describe(i)
        )),
    }
}

/// Performs the patched instruction with the interrupted registers in `uc`
/// and resumes after it.
fn emulate(uc: *mut libc::ucontext_t, patch: &Patch) {
    let i = &patch.instr;
    // SAFETY: the relocated frame of the interrupted code, ours to change.
    let frame = unsafe { &mut (*uc).uc_mcontext.gregs };
    let regs: [i64; 23] = *frame;
    let g = &regs;
    let mem_op = (0..i.op_count())
        .find(|&k| i.op_kind(k) == OpKind::Memory)
        .unwrap_or_else(|| {
            die(format_args!(
                "locked instruction {} without a memory operand",
                describe(i)
            ))
        });
    let addr = i
        .virtual_address(mem_op, 0, |r, _, _| match r {
            Register::None | Register::ES | Register::CS | Register::SS | Register::DS => Some(0),
            r => greg(r.full_register()).map(|_| read_reg(g, r)),
        })
        .unwrap_or_else(|| {
            die(format_args!(
                "locked instruction {}: cannot compute its address",
                describe(i)
            ))
        }) as usize;
    let bytes = i.memory_size().size();
    if !matches!(bytes, 1 | 2 | 4 | 8) {
        die(format_args!(
            "the locked instruction {} ({bytes} bytes) is not supported",
            describe(i)
        ));
    }
    let (word, shift) = (addr & !7, (addr & 7) * 8);
    if (addr & 7) + bytes > 8 {
        die(format_args!(
            "the locked instruction {} accesses {addr:#x}, across two 8-byte words",
            describe(i)
        ));
    }
    let bits = (bytes * 8) as u32;
    let field_mask = mask(bits) << shift;
    let field = |w: u64| (w & field_mask) >> shift;
    let put = |w: u64, v: u64| (w & !field_mask) | ((v << shift) & field_mask);
    let rt = menps_omp::internals::runtime();
    let dsm = rt
        .filter(|rt| rt.dsm.block_state(word as *const u8).is_some())
        .map(|rt| rt.dsm);
    let eff = match dsm {
        Some(dsm) => {
            let _rt = RuntimeGuard::enter();
            // A guess; the compare-and-swap corrects it.
            // SAFETY: DSM memory of the program (readable, faults resolve).
            let mut cur = unsafe { (word as *const u64).read_volatile() };
            loop {
                let e = effect(i, g, field(cur), bits);
                let Some(v) = e.store else {
                    // A failed compare: the value read is the answer, but it
                    // must be the home's, not a stale local copy.
                    let home = dsm.load_relaxed(word as *const u64).unwrap_or_else(|e| {
                        die(format_args!("locked instruction on DSM memory: {e}"))
                    });
                    if home == cur {
                        break e;
                    }
                    cur = home;
                    continue;
                };
                match dsm
                    .compare_exchange_relaxed(word as *mut u64, cur, put(cur, v))
                    .unwrap_or_else(|e| die(format_args!("locked instruction on DSM memory: {e}")))
                {
                    Ok(_) => break e,
                    Err(actual) => cur = actual,
                }
            }
        }
        None => {
            // SAFETY: process-private memory the instruction addresses,
            // 8-byte aligned, accessed atomically by every emulation.
            let a = unsafe { AtomicU64::from_ptr(word as *mut u64) };
            let mut cur = a.load(Ordering::SeqCst);
            loop {
                let e = effect(i, g, field(cur), bits);
                let Some(v) = e.store else { break e };
                match a.compare_exchange(cur, put(cur, v), Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => break e,
                    Err(actual) => cur = actual,
                }
            }
        }
    };
    if let Some(v) = eff.reg {
        let r = match i.mnemonic() {
            Mnemonic::Cmpxchg => match bits {
                8 => Register::AL,
                16 => Register::AX,
                32 => Register::EAX,
                _ => Register::RAX,
            },
            Mnemonic::Xchg if i.op_kind(0) == OpKind::Register => i.op0_register(),
            _ => i.op1_register(),
        };
        write_reg(frame, r, v);
    }
    if let Some((f, which)) = eff.flags {
        let efl = libc::REG_EFL as usize;
        frame[efl] = ((frame[efl] as u64 & !which) | (f & which)) as i64;
    }
    frame[libc::REG_RIP as usize] = (patch.addr + i.len()) as i64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_of_adds_and_subs() {
        assert_eq!(add_flags(0xff, 1, 0, 8), (0, CF | ZF | PF | AF));
        assert_eq!(add_flags(0x7f, 1, 0, 8).1 & OF, OF);
        assert_eq!(sub_flags(0, 1, 0, 32), (0xffff_ffff, CF | SF | PF | AF));
        assert_eq!(sub_flags(5, 5, 0, 64).1 & ZF, ZF);
        assert_eq!(sub_flags(0x8000_0000, 1, 0, 32).1 & OF, OF);
    }

    #[test]
    fn sub_registers_read_and_write_like_the_processor() {
        let mut g = [0i64; 23];
        g[libc::REG_RAX as usize] = 0x1122_3344_5566_7788;
        assert_eq!(read_reg(&g, Register::AL), 0x88);
        assert_eq!(read_reg(&g, Register::AH), 0x77);
        assert_eq!(read_reg(&g, Register::EAX), 0x5566_7788);
        write_reg(&mut g, Register::AX, 0xabcd);
        assert_eq!(g[libc::REG_RAX as usize] as u64, 0x1122_3344_5566_abcd);
        write_reg(&mut g, Register::EAX, 1);
        assert_eq!(g[libc::REG_RAX as usize], 1);
    }

    #[test]
    fn fences_are_told_from_locked_operations() {
        // lock orq $0,(%rsp); mfence; lock addl $1,(%rax); lock orl $0x10,(%rbx); lock addq $0,8(%rdi)
        let code = [
            0xf0, 0x48, 0x83, 0x0c, 0x24, 0x00, 0x0f, 0xae, 0xf0, 0xf0, 0x83, 0x00, 0x01, 0xf0,
            0x83, 0x0b, 0x10, 0xf0, 0x48, 0x83, 0x47, 0x08, 0x00,
        ];
        let mut d = Decoder::with_ip(64, &code, 0x1000, DecoderOptions::NONE);
        let fences: Vec<(u64, bool)> = d.iter().map(|i| (i.ip(), is_fence(&i))).collect();
        assert_eq!(
            fences,
            [
                (0x1000, true),
                (0x1006, true),
                (0x1009, false),
                (0x100d, false),
                (0x1011, true)
            ]
        );
    }

    #[test]
    fn locked_instructions_are_found() {
        // lock add %rax,(%rbx); mov %rax,%rbx; xchg %rcx,(%rdx); lock cmpxchg %ecx,(%rdi)
        let code = [
            0xf0, 0x48, 0x01, 0x03, 0x48, 0x89, 0xc3, 0x48, 0x87, 0x0a, 0xf0, 0x0f, 0xb1, 0x0f,
        ];
        let mut d = Decoder::with_ip(64, &code, 0x1000, DecoderOptions::NONE);
        let found: Vec<u64> = d.iter().filter(is_locked_rmw).map(|i| i.ip()).collect();
        assert_eq!(found, [0x1000, 0x1007, 0x100a]);
    }
}
