//! `trap::run_on_interrupted_stack`: a fault hook resolves a fault by running
//! ordinary code on the faulting thread's own stack, and the faulting code
//! then resumes exactly (registers, flags, FPU and vector state, stack
//! pointer), with the signal mask and alternate stack of the OS thread it
//! resumes on.
//!
//! Every scenario installs a fault hook and changes signal state, so each
//! runs in a child process (an ignored test of this binary, started by its
//! parent test).
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use std::hint::black_box;
use std::ops::Range;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ct_context::trap::{self, InterruptedOnAltStack};
use ct_context::{Coroutine, CoroutineResult, DefaultPolicy, MmapStack, Stack, Yielder};

/// The value the resolver leaves at the start of a page it unprotects.
const MARKER: u64 = 0x5eed_f00d_dead_beef;
/// MXCSR with all exceptions masked and rounding toward zero.
const MXCSR_TOWARD_ZERO: u32 = 0x7f80;
/// MXCSR with all exceptions masked and rounding up.
const MXCSR_UP: u32 = 0x5f80;
/// The sticky exception flags of MXCSR.
const MXCSR_FLAGS: u32 = 0x3f;
/// The default MXCSR.
const MXCSR_DEFAULT: u32 = 0x1f80;
/// x87 control word: exceptions masked, 64-bit precision, rounding up.
const X87_UP: u16 = 0x0b7f;
/// x87 control word: exceptions masked, 64-bit precision, rounding down.
const X87_DOWN: u16 = 0x077f;
/// The default x87 control word.
const X87_DEFAULT: u16 = 0x037f;
/// The environment variable that tells an ignored test it runs as a child.
const CHILD_ENV: &str = "CT_CONTEXT_SIGFRAME_CHILD";

// --- The fault hook and its resolver. -------------------------------------------

/// Pages whose faults the hook claims: `REGION .. REGION + REGION_LEN`.
static REGION: AtomicUsize = AtomicUsize::new(0);
static REGION_LEN: AtomicUsize = AtomicUsize::new(0);
static PAGE: AtomicUsize = AtomicUsize::new(0);
/// The interrupted stack pointer of the last claimed fault.
static FAULT_SP: AtomicUsize = AtomicUsize::new(0);
/// The address of a local of the hook (where the handler runs).
static HOOK_LOCAL: AtomicUsize = AtomicUsize::new(0);
/// The address of a local of the resolver (where the relocated call runs).
static RESOLVER_LOCAL: AtomicUsize = AtomicUsize::new(0);
/// `trap::fault_is_write` of the last claimed fault.
static LAST_WRITE: AtomicBool = AtomicBool::new(false);
/// Faults resolved on the interrupted stack.
static RESOLVED: AtomicUsize = AtomicUsize::new(0);
/// Faults for which `run_on_interrupted_stack` returned.
static REFUSED: AtomicUsize = AtomicUsize::new(0);
/// If non-zero, the address of the `Yielder` the resolver suspends with
/// (once) before resolving.
static PARK_WITH: AtomicUsize = AtomicUsize::new(0);

type Co = Coroutine<(), (), Report, MmapStack, DefaultPolicy>;
type CoYielder = Yielder<(), (), DefaultPolicy>;

/// Makes `page` readable and writable and leaves `MARKER` at its start.
/// Async-signal-safe.
fn unprotect(page: usize) {
    // SAFETY: `page` is a page of the test's own mapping.
    let rc = unsafe {
        libc::mprotect(
            page as *mut libc::c_void,
            PAGE.load(Ordering::Relaxed),
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    assert_eq!(rc, 0);
    // SAFETY: the page is now writable and 8-byte aligned.
    unsafe { (page as *mut u64).write_volatile(MARKER) };
}

/// The fault hook: claims faults in `REGION` and resolves them on the
/// interrupted stack; if that is refused (a fault on the alternate stack),
/// resolves them right here.
unsafe fn hook(_sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) -> bool {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    let base = REGION.load(Ordering::Acquire);
    if base == 0 || !(base..base + REGION_LEN.load(Ordering::Relaxed)).contains(&addr) {
        return false;
    }
    let page = addr & !(PAGE.load(Ordering::Relaxed) - 1);
    let here = 0u8;
    HOOK_LOCAL.store(&raw const here as usize, Ordering::Relaxed);
    // SAFETY: `uctx` is the kernel's live `ucontext` of this SIGSEGV.
    let sp = unsafe {
        (*uctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_RSP as usize] as usize
    };
    FAULT_SP.store(sp, Ordering::Relaxed);
    // SAFETY: as above.
    LAST_WRITE.store(unsafe { trap::fault_is_write(uctx) }, Ordering::Relaxed);
    // SAFETY: `uctx` is this handler's; the test stacks have room; nothing
    // here needs dropping; the resolver is migration-safe.
    let InterruptedOnAltStack =
        unsafe { trap::run_on_interrupted_stack(uctx, move || resolve(page)) };
    REFUSED.fetch_add(1, Ordering::Relaxed);
    unprotect(page);
    true
}

/// Runs on the faulting stack: records where it runs, parks if asked to,
/// does work that is not async-signal-safe, scrambles the FPU and vector
/// state (which the resumed code must not see), blocks `SIGUSR1` (which the
/// resumed code must see), then makes the access valid.
fn resolve(page: usize) {
    let here = 0u8;
    RESOLVER_LOCAL.store(&raw const here as usize, Ordering::Relaxed);
    let y = PARK_WITH.swap(0, Ordering::AcqRel);
    if y != 0 {
        // SAFETY: the coroutine body stored its live yielder; we run on its
        // stack, inside it.
        unsafe { (*(y as *const CoYielder)).suspend(()) };
    }
    // Allocating is not possible in a signal handler.
    let v: Vec<u64> = (0..64).collect();
    assert_eq!(black_box(v).iter().sum::<u64>(), 2016);
    scramble_fpu_and_vectors();
    block(libc::SIGUSR1);
    unprotect(page);
    RESOLVED.fetch_add(1, Ordering::Relaxed);
}

/// Overwrites every vector register (at full AVX width if the CPU has AVX),
/// MXCSR (rounding up) and the x87 control word (rounding down).
fn scramble_fpu_and_vectors() {
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX is available; only declared-clobbered registers change
        // (an xmm clobber covers the whole ymm register).
        unsafe {
            core::arch::asm!(
                "vcmpps ymm0, ymm0, ymm0, 15",
                "vcmpps ymm1, ymm1, ymm1, 15",
                "vcmpps ymm2, ymm2, ymm2, 15",
                "vcmpps ymm3, ymm3, ymm3, 15",
                "vcmpps ymm4, ymm4, ymm4, 15",
                "vcmpps ymm5, ymm5, ymm5, 15",
                "vcmpps ymm6, ymm6, ymm6, 15",
                "vcmpps ymm7, ymm7, ymm7, 15",
                "vcmpps ymm8, ymm8, ymm8, 15",
                "vcmpps ymm9, ymm9, ymm9, 15",
                "vcmpps ymm10, ymm10, ymm10, 15",
                "vcmpps ymm11, ymm11, ymm11, 15",
                "vcmpps ymm12, ymm12, ymm12, 15",
                "vcmpps ymm13, ymm13, ymm13, 15",
                "vcmpps ymm14, ymm14, ymm14, 15",
                "vcmpps ymm15, ymm15, ymm15, 15",
                clobber_abi("C"),
            )
        };
    }
    let (mx, cw) = (MXCSR_UP, X87_DOWN);
    // SAFETY: only registers the asm declares clobbered change, plus the
    // rounding modes (valid control values).
    unsafe {
        core::arch::asm!(
            "pcmpeqd xmm0, xmm0", "pcmpeqd xmm1, xmm1", "pcmpeqd xmm2, xmm2",
            "pcmpeqd xmm3, xmm3", "pcmpeqd xmm4, xmm4", "pcmpeqd xmm5, xmm5",
            "pcmpeqd xmm6, xmm6", "pcmpeqd xmm7, xmm7", "pcmpeqd xmm8, xmm8",
            "pcmpeqd xmm9, xmm9", "pcmpeqd xmm10, xmm10", "pcmpeqd xmm11, xmm11",
            "pcmpeqd xmm12, xmm12", "pcmpeqd xmm13, xmm13", "pcmpeqd xmm14, xmm14",
            "pcmpeqd xmm15, xmm15",
            "ldmxcsr [{mx}]",
            "fldcw [{cw}]",
            mx = in(reg) &mx,
            cw = in(reg) &cw,
            clobber_abi("C"),
        )
    };
}

/// Adds `sig` to the calling thread's signal mask.
fn block(sig: libc::c_int) {
    // SAFETY: plain signal-mask manipulation of the calling thread.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        assert_eq!(
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, core::ptr::null_mut()),
            0
        );
    }
}

/// Removes `sig` from the calling thread's signal mask.
fn unblock(sig: libc::c_int) {
    // SAFETY: as in `block`.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        assert_eq!(
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, core::ptr::null_mut()),
            0
        );
    }
}

/// Whether `sig` is in the calling thread's signal mask.
fn is_blocked(sig: libc::c_int) -> bool {
    // SAFETY: querying the calling thread's mask into a local.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        assert_eq!(
            libc::pthread_sigmask(libc::SIG_SETMASK, core::ptr::null(), &mut set),
            0
        );
        libc::sigismember(&set, sig) == 1
    }
}

/// The calling thread's alternate signal stack, if enabled.
fn alt_stack() -> Option<Range<usize>> {
    // SAFETY: querying into a local.
    let mut ss: libc::stack_t = unsafe { core::mem::zeroed() };
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { libc::sigaltstack(core::ptr::null(), &mut ss) }, 0);
    (ss.ss_flags & libc::SS_DISABLE == 0).then(|| ss.ss_sp as usize..ss.ss_sp as usize + ss.ss_size)
}

/// The calling OS thread's stack.
fn thread_stack() -> Range<usize> {
    // SAFETY: standard glibc queries into locals; the attribute object is
    // destroyed after use.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
        let (mut addr, mut size) = (core::ptr::null_mut(), 0usize);
        assert_eq!(libc::pthread_attr_getstack(&attr, &mut addr, &mut size), 0);
        libc::pthread_attr_destroy(&mut attr);
        addr as usize..addr as usize + size
    }
}

/// Maps `pages` inaccessible pages whose faults the hook claims, and
/// registers the hook.
fn setup(pages: usize) -> usize {
    let page = ct_context::stack::page_size();
    PAGE.store(page, Ordering::Relaxed);
    // SAFETY: a fresh anonymous mapping.
    let base = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            pages * page,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    REGION_LEN.store(pages * page, Ordering::Relaxed);
    REGION.store(base as usize, Ordering::Release);
    // SAFETY: the hook claims only faults in its region, which it makes valid.
    unsafe { trap::add_fault_hook(hook) }.unwrap();
    assert!(trap::ensure_alt_stack());
    base as usize
}

/// Makes `page` inaccessible again.
fn protect(page: usize) {
    // SAFETY: `page` is a page of the test's own mapping.
    let rc = unsafe {
        libc::mprotect(
            page as *mut libc::c_void,
            PAGE.load(Ordering::Relaxed),
            libc::PROT_NONE,
        )
    };
    assert_eq!(rc, 0);
}

// --- Observing the faulting code's registers. ------------------------------------

/// Register values around one access: what a probe loads before the access
/// and what it finds after it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Probe {
    /// xmm0..xmm15 before the access (offset 0).
    xmm_in: [u64; 32],
    /// r8..r15 before the access (offset 256).
    gpr_in: [u64; 8],
    /// xmm0..xmm15 after the access (offset 320).
    xmm_out: [u64; 32],
    /// r8..r15 after the access (offset 576).
    gpr_out: [u64; 8],
    /// rsp before and after the access (offsets 640, 648).
    rsp_before: u64,
    rsp_after: u64,
    /// The carry flag after the access; it was set just before (offset 656).
    carry: u64,
    /// MXCSR and the x87 control word after the access (offsets 664, 668).
    mxcsr: u32,
    x87cw: u16,
    _pad: u16,
    /// In: the value a write access stores; out: the value accessed
    /// (offset 672).
    value: u64,
    /// MXCSR (with its sticky exception flags) and the x87 control word
    /// just before the access (offsets 680, 684).
    mxcsr_before: u32,
    x87cw_before: u16,
    _pad2: u16,
    /// Words of the red zone (`rsp - 8`, `- 56`, `- 120`, `- 128`), written
    /// with r8..r11 before the access and read back after it (offset 688).
    red_zone: [u64; 4],
}

// The offsets the probe's assembly uses.
const _: () = {
    use core::mem::offset_of;
    assert!(offset_of!(Probe, gpr_in) == 256 && offset_of!(Probe, xmm_out) == 320);
    assert!(offset_of!(Probe, gpr_out) == 576 && offset_of!(Probe, rsp_before) == 640);
    assert!(offset_of!(Probe, rsp_after) == 648 && offset_of!(Probe, carry) == 656);
    assert!(offset_of!(Probe, mxcsr) == 664 && offset_of!(Probe, x87cw) == 668);
    assert!(offset_of!(Probe, value) == 672 && offset_of!(Probe, mxcsr_before) == 680);
    assert!(offset_of!(Probe, x87cw_before) == 684 && offset_of!(Probe, red_zone) == 688);
};

impl Probe {
    fn new(seed: u64) -> Self {
        let mut p = Probe {
            xmm_in: [0; 32],
            gpr_in: [0; 8],
            xmm_out: [0; 32],
            gpr_out: [0; 8],
            rsp_before: 0,
            rsp_after: 0,
            carry: 0,
            mxcsr: 0,
            x87cw: 0,
            _pad: 0,
            value: seed ^ 0x1234_5678,
            mxcsr_before: 0,
            x87cw_before: 0,
            _pad2: 0,
            red_zone: [0; 4],
        };
        for (i, w) in p.xmm_in.iter_mut().enumerate() {
            *w = seed
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(i as u32)
                ^ i as u64;
        }
        for (i, w) in p.gpr_in.iter_mut().enumerate() {
            *w = seed
                .wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
                .rotate_left(3 * i as u32)
                ^ i as u64;
        }
        p
    }

    /// Loads the input registers, sets the carry flag, reads (or writes)
    /// `*addr`, then records every register.
    fn run(&mut self, addr: *mut u64, write: bool) {
        // SAFETY: the asm reads and writes only `*self`, `*addr` (which
        // the caller arranges to fault and be resolved) and the 128 bytes
        // below the stack pointer, which the compiler leaves free for an asm
        // block that is not `nostack`; it declares every register it changes
        // clobbered.
        unsafe {
            core::arch::asm!(
                "mov [rdi + 640], rsp",
                "movdqu xmm0, [rdi + 0]", "movdqu xmm1, [rdi + 16]",
                "movdqu xmm2, [rdi + 32]", "movdqu xmm3, [rdi + 48]",
                "movdqu xmm4, [rdi + 64]", "movdqu xmm5, [rdi + 80]",
                "movdqu xmm6, [rdi + 96]", "movdqu xmm7, [rdi + 112]",
                "movdqu xmm8, [rdi + 128]", "movdqu xmm9, [rdi + 144]",
                "movdqu xmm10, [rdi + 160]", "movdqu xmm11, [rdi + 176]",
                "movdqu xmm12, [rdi + 192]", "movdqu xmm13, [rdi + 208]",
                "movdqu xmm14, [rdi + 224]", "movdqu xmm15, [rdi + 240]",
                "mov r8, [rdi + 256]", "mov r9, [rdi + 264]",
                "mov r10, [rdi + 272]", "mov r11, [rdi + 280]",
                "mov r12, [rdi + 288]", "mov r13, [rdi + 296]",
                "mov r14, [rdi + 304]", "mov r15, [rdi + 312]",
                "mov [rsp - 8], r8", "mov [rsp - 56], r9",
                "mov [rsp - 120], r10", "mov [rsp - 128], r11",
                "stmxcsr [rdi + 680]",
                "fnstcw [rdi + 684]",
                "mov rax, [rdi + 672]",
                "test rdx, rdx",
                "jz 3f",
                "stc",
                "mov [rsi], rax",
                "jmp 4f",
                "3:",
                "stc",
                "mov rax, [rsi]",
                "4:",
                "setc byte ptr [rdi + 656]",
                "mov [rdi + 672], rax",
                "mov [rdi + 648], rsp",
                "movdqu [rdi + 320], xmm0", "movdqu [rdi + 336], xmm1",
                "movdqu [rdi + 352], xmm2", "movdqu [rdi + 368], xmm3",
                "movdqu [rdi + 384], xmm4", "movdqu [rdi + 400], xmm5",
                "movdqu [rdi + 416], xmm6", "movdqu [rdi + 432], xmm7",
                "movdqu [rdi + 448], xmm8", "movdqu [rdi + 464], xmm9",
                "movdqu [rdi + 480], xmm10", "movdqu [rdi + 496], xmm11",
                "movdqu [rdi + 512], xmm12", "movdqu [rdi + 528], xmm13",
                "movdqu [rdi + 544], xmm14", "movdqu [rdi + 560], xmm15",
                "mov [rdi + 576], r8", "mov [rdi + 584], r9",
                "mov [rdi + 592], r10", "mov [rdi + 600], r11",
                "mov [rdi + 608], r12", "mov [rdi + 616], r13",
                "mov [rdi + 624], r14", "mov [rdi + 632], r15",
                "mov rax, [rsp - 8]", "mov [rdi + 688], rax",
                "mov rax, [rsp - 56]", "mov [rdi + 696], rax",
                "mov rax, [rsp - 120]", "mov [rdi + 704], rax",
                "mov rax, [rsp - 128]", "mov [rdi + 712], rax",
                "stmxcsr [rdi + 664]",
                "fnstcw [rdi + 668]",
                in("rdi") self as *mut Probe,
                in("rsi") addr,
                in("rdx") write as u64,
                out("r12") _, out("r13") _, out("r14") _, out("r15") _,
                clobber_abi("C"),
            )
        };
    }

    /// Checks that the access completed with every register as it was.
    fn check(&self, write: bool, mxcsr: u32, x87cw: u16) {
        assert_eq!(
            self.xmm_out, self.xmm_in,
            "vector registers changed across the fault"
        );
        assert_eq!(
            self.gpr_out, self.gpr_in,
            "general registers changed across the fault"
        );
        assert_eq!(
            self.rsp_after, self.rsp_before,
            "the stack pointer changed across the fault"
        );
        assert_eq!(
            self.red_zone,
            self.gpr_in[..4],
            "the red zone of the faulting code was overwritten"
        );
        assert_eq!(self.carry, 1, "the carry flag was lost across the fault");
        assert_eq!(
            self.mxcsr_before & !MXCSR_FLAGS,
            mxcsr,
            "the probe ran with the wrong MXCSR"
        );
        assert_eq!(self.x87cw_before, x87cw);
        assert_eq!(
            self.mxcsr, self.mxcsr_before,
            "MXCSR changed across the fault"
        );
        assert_eq!(
            self.x87cw, x87cw,
            "the x87 control word changed across the fault"
        );
        if !write {
            assert_eq!(
                self.value, MARKER,
                "the retried load must see the resolver's value"
            );
        }
    }
}

/// The full 256-bit ymm0..ymm15 before and after a read of `*addr` (which
/// the caller arranges to fault and be resolved). Needs AVX.
fn avx_probe(addr: *const u64, seed: u64) -> ([u64; 64], [u64; 64]) {
    let mut ins = [0u64; 64];
    for (i, w) in ins.iter_mut().enumerate() {
        *w = seed
            .wrapping_mul(0xff51_afd7_ed55_8ccd)
            .rotate_left(i as u32)
            | 1;
    }
    let mut outs = [0u64; 64];
    assert!(std::arch::is_x86_feature_detected!("avx"));
    // SAFETY: AVX is available; the asm reads `ins` and `*addr`, writes
    // `outs`, and declares the registers it changes clobbered (an xmm
    // clobber covers the whole ymm register).
    unsafe {
        core::arch::asm!(
            "vmovdqu ymm0, [rdi]", "vmovdqu ymm1, [rdi + 32]",
            "vmovdqu ymm2, [rdi + 64]", "vmovdqu ymm3, [rdi + 96]",
            "vmovdqu ymm4, [rdi + 128]", "vmovdqu ymm5, [rdi + 160]",
            "vmovdqu ymm6, [rdi + 192]", "vmovdqu ymm7, [rdi + 224]",
            "vmovdqu ymm8, [rdi + 256]", "vmovdqu ymm9, [rdi + 288]",
            "vmovdqu ymm10, [rdi + 320]", "vmovdqu ymm11, [rdi + 352]",
            "vmovdqu ymm12, [rdi + 384]", "vmovdqu ymm13, [rdi + 416]",
            "vmovdqu ymm14, [rdi + 448]", "vmovdqu ymm15, [rdi + 480]",
            "mov rax, [rsi]",
            "vmovdqu [rdx], ymm0", "vmovdqu [rdx + 32], ymm1",
            "vmovdqu [rdx + 64], ymm2", "vmovdqu [rdx + 96], ymm3",
            "vmovdqu [rdx + 128], ymm4", "vmovdqu [rdx + 160], ymm5",
            "vmovdqu [rdx + 192], ymm6", "vmovdqu [rdx + 224], ymm7",
            "vmovdqu [rdx + 256], ymm8", "vmovdqu [rdx + 288], ymm9",
            "vmovdqu [rdx + 320], ymm10", "vmovdqu [rdx + 352], ymm11",
            "vmovdqu [rdx + 384], ymm12", "vmovdqu [rdx + 416], ymm13",
            "vmovdqu [rdx + 448], ymm14", "vmovdqu [rdx + 480], ymm15",
            "vzeroupper",
            in("rdi") ins.as_ptr(),
            in("rsi") addr,
            in("rdx") outs.as_mut_ptr(),
            clobber_abi("C"),
        )
    };
    (ins, outs)
}

fn set_mxcsr(v: u32) {
    // SAFETY: loading a valid MXCSR value.
    unsafe { core::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack)) };
}

fn set_x87cw(v: u16) {
    // SAFETY: loading a valid x87 control word.
    unsafe { core::arch::asm!("fldcw [{}]", in(reg) &v, options(nostack)) };
}

/// Runs a probe on `page` with non-default rounding modes (toward zero for
/// SSE, up for x87) and a division live across the fault.
fn probe_with_rounding(page: usize, write: bool, seed: u64) -> (Probe, f64, f64) {
    // Each quotient is computed between the `black_box`es of its operands
    // and of its result, which keep it in place relative to the asm that
    // changes the rounding mode and to the probe.
    let third = black_box(black_box(1.0f64) / black_box(10.0f64));
    set_mxcsr(MXCSR_TOWARD_ZERO);
    set_x87cw(X87_UP);
    let before = black_box(black_box(1.0f64) / black_box(10.0f64));
    let mut p = Probe::new(seed);
    p.run(page as *mut u64, write);
    let after = black_box(black_box(1.0f64) / black_box(10.0f64));
    let live = black_box(before);
    set_mxcsr(MXCSR_DEFAULT);
    set_x87cw(X87_DEFAULT);
    assert_ne!(
        before.to_bits(),
        third.to_bits(),
        "rounding toward zero must differ from nearest"
    );
    (p, live, after)
}

// --- Child-process harness. -----------------------------------------------------

/// Runs the ignored test `name` of this binary in a child process and
/// asserts that it passed. A hang is killed after 60 s.
fn run_child(name: &str) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("child test {name} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child test {name} failed ({:?}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether this process is a child started by `run_child` (the ignored
/// tests do nothing when run by hand with `--ignored`, all in one process).
fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

// --- Scenarios. -----------------------------------------------------------------

#[test]
fn fault_on_os_thread_stack() {
    run_child("child_fault_on_os_thread_stack");
}

#[test]
#[ignore = "run in a child process by its parent test"]
fn child_fault_on_os_thread_stack() {
    if !is_child() {
        return;
    }
    let page = setup(1);
    let stack = thread_stack();
    let alt = alt_stack().expect("test threads have an alternate stack");
    for (round, write) in [(0u64, false), (1, true), (2, false)] {
        protect(page);
        assert!(!is_blocked(libc::SIGUSR1));
        let (p, live, after) = probe_with_rounding(page, write, round + 1);
        assert_eq!(RESOLVED.load(Ordering::Relaxed), round as usize + 1);
        assert_eq!(REFUSED.load(Ordering::Relaxed), 0);
        p.check(write, MXCSR_TOWARD_ZERO, X87_UP);
        assert_eq!(
            live.to_bits(),
            after.to_bits(),
            "the float computation was not intact"
        );
        assert_eq!(LAST_WRITE.load(Ordering::Relaxed), write, "fault_is_write");
        if write {
            // SAFETY: the page is readable now.
            let v = unsafe { (page as *const u64).read_volatile() };
            assert_eq!(
                v, p.value,
                "the retried store must land after the resolver's"
            );
        }
        let (sp, hook_local, local) = (
            FAULT_SP.load(Ordering::Relaxed),
            HOOK_LOCAL.load(Ordering::Relaxed),
            RESOLVER_LOCAL.load(Ordering::Relaxed),
        );
        assert!(
            alt.contains(&hook_local),
            "the hook runs on the alternate stack"
        );
        assert!(stack.contains(&sp));
        assert!(
            stack.contains(&local),
            "the resolver must run on the faulting thread's stack"
        );
        assert!(!alt.contains(&local));
        assert!(
            local < sp - 128 && local > sp - 64 * 1024,
            "resolver at {local:#x}, fault sp {sp:#x}"
        );
        assert!(
            is_blocked(libc::SIGUSR1),
            "the mask in force when the resolver returned must be kept"
        );
        unblock(libc::SIGUSR1);
    }
    // The upper halves of the ymm registers live in the extended part of
    // the saved FPU state, beyond the legacy 512-byte area.
    if std::arch::is_x86_feature_detected!("avx") {
        protect(page);
        let (ins, outs) = avx_probe(page as *const u64, 5);
        assert_eq!(RESOLVED.load(Ordering::Relaxed), 4);
        assert_eq!(outs, ins, "the AVX state changed across the fault");
        unblock(libc::SIGUSR1);
    } else {
        println!("no AVX: extended FPU state not checked");
    }
}

#[test]
fn fault_on_thread_without_alt_stack() {
    run_child("child_fault_on_thread_without_alt_stack");
}

#[test]
#[ignore = "run in a child process by its parent test"]
fn child_fault_on_thread_without_alt_stack() {
    if !is_child() {
        return;
    }
    let page = setup(1);
    std::thread::spawn(move || {
        let off = libc::stack_t {
            ss_sp: core::ptr::null_mut(),
            ss_flags: libc::SS_DISABLE,
            ss_size: 0,
        };
        // SAFETY: disabling this thread's alternate stack (std unmaps its
        // own at thread exit regardless).
        assert_eq!(unsafe { libc::sigaltstack(&off, core::ptr::null_mut()) }, 0);
        let stack = thread_stack();
        for (round, write) in [(0u64, true), (1, false)] {
            protect(page);
            let (p, live, after) = probe_with_rounding(page, write, round + 7);
            p.check(write, MXCSR_TOWARD_ZERO, X87_UP);
            assert_eq!(live.to_bits(), after.to_bits());
            let (sp, hook_local, local) = (
                FAULT_SP.load(Ordering::Relaxed),
                HOOK_LOCAL.load(Ordering::Relaxed),
                RESOLVER_LOCAL.load(Ordering::Relaxed),
            );
            assert!(
                stack.contains(&hook_local),
                "without an alternate stack the hook runs on the faulting stack"
            );
            assert!(
                local < hook_local - 4096,
                "the relocated call must lie below the handler's frames"
            );
            assert!(stack.contains(&local) && local < sp - 128);
            assert!(is_blocked(libc::SIGUSR1));
            unblock(libc::SIGUSR1);
            assert!(
                alt_stack().is_none(),
                "the alternate stack must stay disabled"
            );
        }
        assert_eq!(RESOLVED.load(Ordering::Relaxed), 2);
    })
    .join()
    .unwrap();
}

/// What the coroutine saw after its fault was resolved.
#[derive(Debug)]
struct Report {
    probe: Probe,
    live: f64,
    after: f64,
    alt: Option<Range<usize>>,
    usr1_blocked: bool,
    usr2_blocked: bool,
}

/// Moves a coroutine to another OS thread.
struct Migrating(Co);
// SAFETY: the coroutine's code keeps no reference to thread-local data
// across its suspension, and ct-context's switches do not depend on the OS
// thread; the coroutine is resumed by one thread at a time.
unsafe impl Send for Migrating {}

#[test]
fn fault_on_coroutine_stack_parks_and_migrates() {
    run_child("child_fault_on_coroutine_stack_parks_and_migrates");
}

#[test]
#[ignore = "run in a child process by its parent test"]
fn child_fault_on_coroutine_stack_parks_and_migrates() {
    if !is_child() {
        return;
    }
    let base = setup(2);
    let page_len = PAGE.load(Ordering::Relaxed);
    let (page, other_page) = (base, base + page_len);
    let stack = MmapStack::new(256 * 1024).unwrap();
    let region = stack.region();
    let mut co: Co = Coroutine::with_stack(stack, move |y: &CoYielder, ()| {
        PARK_WITH.store(y as *const CoYielder as usize, Ordering::Release);
        let (probe, live, after) = probe_with_rounding(page, false, 11);
        Report {
            probe,
            live,
            after,
            alt: alt_stack(),
            usr1_blocked: is_blocked(libc::SIGUSR1),
            usr2_blocked: is_blocked(libc::SIGUSR2),
        }
    })
    .unwrap();

    // The fault parks the coroutine from inside its resolver.
    assert!(matches!(co.resume(()), CoroutineResult::Yield(())));
    set_mxcsr(MXCSR_DEFAULT);
    set_x87cw(X87_DEFAULT);
    let (sp, local) = (
        FAULT_SP.load(Ordering::Relaxed),
        RESOLVER_LOCAL.load(Ordering::Relaxed),
    );
    assert!(
        region.contains(sp),
        "the fault happened on the coroutine's stack"
    );
    assert!(
        region.contains(local),
        "the resolver runs on the coroutine's stack"
    );
    assert!(local < sp - 128);
    assert_eq!(
        RESOLVED.load(Ordering::Relaxed),
        0,
        "the coroutine's fault is still pending"
    );
    let main_alt = alt_stack().unwrap();
    assert!(!is_blocked(libc::SIGUSR1) && !is_blocked(libc::SIGUSR2));

    // Meanwhile this OS thread takes and resolves a fault of its own, which
    // reuses its alternate stack (the kernel's frame of the pending fault
    // was there) with different register values.
    let (p, _, _) = probe_with_rounding(other_page, false, 12);
    p.check(false, MXCSR_TOWARD_ZERO, X87_UP);
    assert_eq!(RESOLVED.load(Ordering::Relaxed), 1);
    unblock(libc::SIGUSR1);

    // The coroutine resumes on another OS thread, with another alternate
    // stack and another signal mask.
    let m = Migrating(co);
    let (report, other_alt) = std::thread::spawn(move || {
        let mut m = m;
        assert!(trap::ensure_alt_stack());
        block(libc::SIGUSR2);
        let own_alt = alt_stack().unwrap();
        let r = m.0.resume(());
        set_mxcsr(MXCSR_DEFAULT);
        set_x87cw(X87_DEFAULT);
        drop(m);
        (r, own_alt)
    })
    .join()
    .unwrap();
    let CoroutineResult::Return(report) = report else {
        panic!("the coroutine must finish");
    };
    assert_eq!(RESOLVED.load(Ordering::Relaxed), 2);
    assert_eq!(REFUSED.load(Ordering::Relaxed), 0);
    report.probe.check(false, MXCSR_TOWARD_ZERO, X87_UP);
    assert_eq!(report.live.to_bits(), report.after.to_bits());
    assert_ne!(other_alt, main_alt);
    assert_eq!(
        report.alt,
        Some(other_alt),
        "the resumed code must keep the alternate stack of the OS thread it resumed on"
    );
    assert!(
        report.usr2_blocked,
        "the resumed code must keep the mask of the OS thread it resumed on"
    );
    assert!(report.usr1_blocked, "and what the resolver added to it");
    assert_eq!(alt_stack(), Some(main_alt));
}

static HANDLER_SAW: AtomicUsize = AtomicUsize::new(0);

extern "C" fn usr1_handler(
    _sig: libc::c_int,
    _info: *mut libc::siginfo_t,
    _uctx: *mut libc::c_void,
) {
    // SAFETY: the test's page; the access faults and the hook resolves it.
    let v = unsafe { (REGION.load(Ordering::Acquire) as *const u64).read_volatile() };
    HANDLER_SAW.store(v as usize, Ordering::Relaxed);
}

#[test]
fn fault_in_handler_on_alt_stack_is_refused() {
    run_child("child_fault_in_handler_on_alt_stack_is_refused");
}

#[test]
#[ignore = "run in a child process by its parent test"]
fn child_fault_in_handler_on_alt_stack_is_refused() {
    if !is_child() {
        return;
    }
    setup(1);
    let alt = alt_stack().unwrap();
    // SAFETY: installing a SIGUSR1 handler on the alternate stack in this
    // child process.
    unsafe {
        let mut act: libc::sigaction = core::mem::zeroed();
        act.sa_sigaction = usr1_handler as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut act.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGUSR1, &act, core::ptr::null_mut()),
            0
        );
        assert_eq!(libc::raise(libc::SIGUSR1), 0);
    }
    assert_eq!(
        REFUSED.load(Ordering::Relaxed),
        1,
        "a fault on the alternate stack cannot be relocated"
    );
    assert_eq!(RESOLVED.load(Ordering::Relaxed), 0);
    assert!(alt.contains(&FAULT_SP.load(Ordering::Relaxed)));
    assert_eq!(HANDLER_SAW.load(Ordering::Relaxed) as u64, MARKER);
}
