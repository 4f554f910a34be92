//! `threadprivate`: each team thread its own thread-local storage.
//!
//! GCC compiles a `threadprivate` variable to a thread-local one (`__thread`)
//! of the executable, read and written at a fixed offset from the thread
//! pointer (`%fs`). Team threads are user-level threads: several run on one
//! OS thread, one after the other, and a thread may move between OS threads,
//! so with the OS threads' thread-local storage they would share and swap
//! their copies.
//!
//! When the executable has thread-local storage (a `PT_TLS` segment), each
//! team thread gets a thread-local area of its own, the one of a *carrier*:
//! an OS thread created for that purpose that never runs (it waits for
//! ever), whose area libc set up as for any thread. A team thread runs with
//! `%fs` pointing to its carrier's thread control block (switched with
//! `wrfsbase`, or `arch_prctl` where the processor lacks it), so the
//! program's thread-locals — and libc's, such as `errno` — are its own.
//! Thread-locals of shared libraries reached through their dynamic thread
//! vector (this runtime's own state, among others) stay the worker's: the
//! carrier's vector pointer is set to the worker's at every switch, and
//! copied back when the thread leaves.
//!
//! Carriers belong to team thread numbers: thread `k` of a team uses
//! carrier `k` (thread 0 the carrier of the thread that started the
//! region, `main`'s being carrier 0), so that a thread's `threadprivate`
//! values persist from one region to the next, as OpenMP specifies for
//! teams of the same size. In a job of several processes, carrier 0's area
//! is DSM memory, pinned on process 0: `copyin` of an array makes the other
//! threads copy `main`'s values from its thread-local area, wherever they
//! run. Explicit tasks that run deferred, on a thread of their own, see the
//! thread-locals of the OS thread that runs them. With the runtime linked
//! into the executable (`libmenps_gomp.a`) there are no carriers: the
//! runtime's own thread-locals are then in the executable's block too.
//! `threadprivate` then behaves as on OS threads shared by several team
//! threads.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use ct_worker::UltThread;
use menps_dsm::dsm::allocator::RuntimeGuard;
use menps_dsm::dsm::team::SwitchExtension;

use crate::die;
use menps_omp::internals::ProgramDsm;

/// Bits of a thread's hook word holding its carrier's number + 1 (the
/// DSM's allocator uses the low 32 bits, the team `main`'s mark bit 32).
const SHIFT: u32 = 40;
const MASK: usize = 0xffff << SHIFT;

/// Carriers a process can have (team threads per process at most).
const MAX_CARRIERS: usize = 4096;

/// Stack of a carrier (it never runs; its thread-local area sits at the
/// top of it).
const CARRIER_STACK: usize = 64 * 1024;

/// Whether team threads get carriers (the executable has thread-locals).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Whether `rdfsbase`/`wrfsbase` may be used.
static FSGSBASE: AtomicBool = AtomicBool::new(false);

/// Per carrier number: its thread control block (0: not created yet).
fn carriers() -> &'static [AtomicUsize] {
    static C: OnceLock<Box<[AtomicUsize]>> = OnceLock::new();
    C.get_or_init(|| (0..MAX_CARRIERS).map(|_| AtomicUsize::new(0)).collect())
}

/// Workers a process can have with carriers.
const MAX_WORKERS: usize = 1024;

/// Worker `w`'s slot: the thread control block of its OS thread (0: not
/// seen yet). A hook must not panic: more workers end the process with a
/// message.
#[inline]
fn worker_slot(w: usize) -> &'static AtomicUsize {
    static W: OnceLock<Box<[AtomicUsize]>> = OnceLock::new();
    W.get_or_init(|| (0..MAX_WORKERS).map(|_| AtomicUsize::new(0)).collect())
        .get(w)
        .unwrap_or_else(|| {
            die(format_args!(
                "threadprivate: more than {MAX_WORKERS} workers in one process"
            ))
        })
}

/// Serialises carrier creation.
static CREATING: Mutex<()> = Mutex::new(());

/// Carrier 0's stack in a job of several processes: DSM memory (address,
/// size), pinned on process 0.
static SHARED_STACK: OnceLock<(usize, usize)> = OnceLock::new();

#[inline]
fn read_fs() -> usize {
    if FSGSBASE.load(Ordering::Relaxed) {
        let v: usize;
        // SAFETY: `rdfsbase` reads the FS base; the kernel enabled it
        // (HWCAP2_FSGSBASE, checked in `install`).
        unsafe {
            core::arch::asm!("rdfsbase {}", out(reg) v, options(nomem, nostack, preserves_flags))
        };
        v
    } else {
        let mut v = 0usize;
        // SAFETY: ARCH_GET_FS writes the FS base to `v`.
        unsafe { libc::syscall(libc::SYS_arch_prctl, 0x1003, &mut v as *mut usize) };
        v
    }
}

#[inline]
fn write_fs(v: usize) {
    if FSGSBASE.load(Ordering::Relaxed) {
        // SAFETY: `v` is the thread control block of a live thread-local
        // area (a carrier's, or the worker's own); see `install`.
        unsafe { core::arch::asm!("wrfsbase {}", in(reg) v, options(nostack, preserves_flags)) };
    } else {
        // SAFETY: ARCH_SET_FS with a valid thread control block, as above.
        unsafe { libc::syscall(libc::SYS_arch_prctl, 0x1002, v) };
    }
}

/// The dynamic thread vector pointer of the thread control block `tcb`
/// (glibc's `tcbhead_t`: the block itself, then the vector).
#[inline]
fn dtv_slot(tcb: usize) -> *mut usize {
    (tcb + 8) as *mut usize
}

/// The carrier number + 1 of a hook word (0: none).
#[inline]
fn carrier_bits(word: usize) -> usize {
    (word & MASK) >> SHIFT
}

/// The worker's own thread control block (recorded the first time; only
/// called while no carrier is installed on this worker's OS thread).
#[inline]
fn worker_tcb(worker: usize) -> usize {
    let slot = worker_slot(worker);
    match slot.load(Ordering::Relaxed) {
        0 => {
            let fs = read_fs();
            slot.store(fs, Ordering::Relaxed);
            fs
        }
        v => v,
    }
}

/// Switches this OS thread to carrier `tcb` for a team thread entering on
/// `worker`.
#[inline]
fn install_carrier(worker: usize, tcb: usize) {
    let own = worker_tcb(worker);
    // SAFETY: both blocks are live thread control blocks; the carrier's is
    // used by one team thread at a time (the one entering).
    unsafe { dtv_slot(tcb).write(dtv_slot(own).read()) };
    if read_fs() != tcb {
        write_fs(tcb);
    }
}

/// Switches this OS thread back from carrier `tcb` to the worker's own
/// area.
#[inline]
fn remove_carrier(worker: usize, tcb: usize) {
    let own = worker_slot(worker).load(Ordering::Relaxed);
    if own == 0 {
        return;
    }
    // SAFETY: as in `install_carrier`; the vector may have been replaced
    // while the carrier was installed (libc grows it when a library with
    // thread-locals is loaded), so the worker takes the current one.
    unsafe { dtv_slot(own).write(dtv_slot(tcb).read()) };
    if read_fs() == tcb {
        write_fs(own);
    }
}

/// The switch extension of the team's threads.
struct Switch;

impl SwitchExtension for Switch {
    #[inline]
    fn entering(&self, worker: usize, thread: UltThread<'_>) {
        match carrier_bits(thread.data()) {
            0 => {
                // A thread without a carrier runs on the worker's own area
                // (the thread that left may have had one, and its `left`
                // comes after this call).
                let own = worker_slot(worker).load(Ordering::Relaxed);
                if own != 0 && read_fs() != own {
                    write_fs(own);
                }
            }
            c => install_carrier(worker, carriers()[c - 1].load(Ordering::Acquire)),
        }
    }

    #[inline]
    fn left(&self, worker: usize, thread: UltThread<'_>) {
        let c = carrier_bits(thread.data());
        if c != 0 {
            remove_carrier(worker, carriers()[c - 1].load(Ordering::Acquire));
        }
    }
}

/// Installs per-thread thread-local storage if the executable has any
/// (every process, before `main` runs). In a job of several processes,
/// carrier 0 (`main`'s) gets its area in DSM memory (collective).
pub(crate) fn install(exe: &crate::image::Executable, dsm: &'static ProgramDsm) {
    let Some(tls_size) = exe.tls else {
        return;
    };
    // Linked into the executable (`libmenps_gomp.a`, or a Rust program
    // with this crate), the runtime's own thread-locals sit in the
    // executable's block, at fixed offsets from `%fs`: a carrier would
    // hide them. Only the shared library reaches its own through the
    // dynamic thread vector.
    if exe.contains(install as *const () as usize) {
        return;
    }
    // SAFETY: getauxval reads the auxiliary vector.
    let hwcap2 = unsafe { libc::getauxval(libc::AT_HWCAP2) };
    FSGSBASE.store(hwcap2 & 2 != 0, Ordering::Relaxed);
    if dsm.nprocs() > 1 {
        let size = (CARRIER_STACK + tls_size).next_multiple_of(64 * 1024);
        let stack = dsm
            .alloc_segment(size, 4096)
            .unwrap_or_else(|e| die(format_args!("threadprivate: {e}")));
        if dsm.rank() == 0 {
            // The thread-local area and the carrier's few frames are at the
            // top: pinned, they never fault (libc touches them anywhere).
            let pinned = (16 * 1024 + tls_size.next_multiple_of(4096)).min(size);
            // SAFETY: the top `pinned` bytes of the segment just allocated.
            let top = unsafe { stack.add(size - pinned) };
            dsm.pin(top, pinned)
                .unwrap_or_else(|e| die(format_args!("threadprivate: {e}")));
        }
        let _ = SHARED_STACK.set((stack as usize, size));
    }
    ACTIVE.store(true, Ordering::Release);
    if !menps_dsm::dsm::team::set_switch_extension(&Switch) {
        die("threadprivate: another switch extension is installed");
    }
}

/// The carrier's thread: waits for ever, all signals blocked.
extern "C" fn carrier_main(_: *mut libc::c_void) -> *mut libc::c_void {
    loop {
        // SAFETY: pause(2) only waits.
        unsafe { libc::pause() };
    }
}

/// Carrier `n`'s thread control block, created on first use.
fn carrier(n: usize) -> usize {
    let slot = carriers().get(n).unwrap_or_else(|| {
        die(format_args!(
            "threadprivate: more than {MAX_CARRIERS} threads"
        ))
    });
    let tcb = slot.load(Ordering::Acquire);
    if tcb != 0 {
        return tcb;
    }
    let _rt = RuntimeGuard::enter();
    let _one = CREATING.lock().unwrap_or_else(|e| e.into_inner());
    let tcb = slot.load(Ordering::Acquire);
    if tcb != 0 {
        return tcb;
    }
    // SAFETY: an attribute object set up and destroyed here; the new
    // thread runs `carrier_main` with every signal blocked; its stack is
    // either glibc's or carrier 0's DSM segment (mapped and, at the top,
    // pinned; the carrier never returns, so the stack is never freed).
    let tcb = unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        match SHARED_STACK.get() {
            Some(&(addr, size)) if n == 0 => {
                libc::pthread_attr_setstack(&mut attr, addr as *mut libc::c_void, size);
            }
            _ => {
                libc::pthread_attr_setstacksize(&mut attr, CARRIER_STACK);
            }
        }
        let mut all: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut t: libc::pthread_t = 0;
        let r = libc::pthread_create(&mut t, &attr, carrier_main, core::ptr::null_mut());
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        if r != 0 {
            die(format_args!(
                "threadprivate: cannot create a thread-local area for team thread {n}: {}",
                std::io::Error::from_raw_os_error(r)
            ));
        }
        // glibc: a thread's handle is its thread control block.
        t as usize
    };
    slot.store(tcb, Ordering::Release);
    tcb
}

/// The running thread's carrier number + 1 (0: none).
pub(crate) fn current() -> usize {
    if !ACTIVE.load(Ordering::Acquire) {
        return 0;
    }
    carrier_bits(ct_worker::current_thread_data().unwrap_or(0))
}

/// Makes the running user-level thread use carrier `n` (`main`: 0; team
/// thread `k`: `k`, thread 0 its starter's) until [`leave`].
pub(crate) fn enter(n: usize) {
    if !ACTIVE.load(Ordering::Acquire) {
        return;
    }
    let tcb = carrier(n);
    let Some(worker) = ct_worker::current_worker_index() else {
        die("threadprivate: a team thread outside the team's workers");
    };
    let word = ct_worker::current_thread_data().unwrap_or(0);
    debug_assert_eq!(carrier_bits(word), 0, "a thread entered a carrier twice");
    // The worker's own area is the one installed now (no carrier yet).
    worker_tcb(worker);
    ct_worker::set_current_thread_data((word & !MASK) | ((n + 1) << SHIFT));
    install_carrier(worker, tcb);
}

/// Ends [`enter`]: the thread runs on its worker's own area again.
pub(crate) fn leave() {
    if !ACTIVE.load(Ordering::Acquire) {
        return;
    }
    let word = ct_worker::current_thread_data().unwrap_or(0);
    let c = carrier_bits(word);
    if c == 0 {
        return;
    }
    let Some(worker) = ct_worker::current_worker_index() else {
        die("threadprivate: a team thread outside the team's workers");
    };
    remove_carrier(worker, carriers()[c - 1].load(Ordering::Acquire));
    ct_worker::set_current_thread_data(word & !MASK);
}
