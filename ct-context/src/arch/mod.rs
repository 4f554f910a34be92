//! Architecture-specific code: context switching, and resuming code
//! interrupted by a signal from a relocated signal frame. Everything above
//! this module is portable; a new architecture adds files here and a policy
//! in [`crate::policy`].

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_64;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) mod x86_64_sigframe;
