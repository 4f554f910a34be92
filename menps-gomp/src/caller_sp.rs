//! Entry points that know where the program's frames end.
//!
//! A team barrier releases the calling thread's DSM stack: every block of
//! it that changed is published. Only the program's frames need be — the
//! runtime's own, below them, no other thread reads. Inside the runtime
//! the nearest mark is a local variable of the barrier's function, and the
//! frames above it still hold the registers the runtime saved on entry: a
//! loop counter the program keeps in a callee-saved register changes at
//! every barrier, so every barrier of a loop would publish a stack block
//! (a fast release, about a third of a barrier's cost at 2×1).
//!
//! The entry points defined by [`with_caller_sp!`] are a jump of two
//! instructions into their implementation, passing the caller's stack
//! pointer as it was before its `call` (the address just above the return
//! address): exactly where the program's frames end
//! ([`menps_dsm::dsm::Dsm::program_frames_end_at_call`]).

/// Defines the exported entry point `$name()` (no arguments; returns what
/// `$inner` returns, `$ret`) as a tail jump to `extern "C" fn $inner(caller_sp:
/// usize)`, which gets the caller's stack pointer before its `call`.
macro_rules! with_caller_sp {
    ($(#[$attr:meta])* $name:ident => $inner:path) => {
        $crate::caller_sp::with_caller_sp!($(#[$attr])* $name -> () => $inner);
    };
    ($(#[$attr:meta])* $name:ident -> $ret:ty => $inner:path) => {
        $(#[$attr])*
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> $ret {
            // At entry `[rsp]` is the return address, so the caller's
            // stack pointer before the call is `rsp + 8`. The jump keeps
            // the return address and the stack as they are: `$inner`
            // returns straight to the caller.
            core::arch::naked_asm!(
                "lea rdi, [rsp + 8]",
                "jmp {inner}",
                inner = sym $inner,
            )
        }
    };
}

pub(crate) use with_caller_sp;
