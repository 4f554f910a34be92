//! Architecture-specific context switching. Everything above this module is
//! portable; a new architecture adds a file here and a policy in
//! [`crate::policy`].

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_64;
