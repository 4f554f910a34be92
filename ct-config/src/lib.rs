//! One way to configure the workspace: one parser for environment variables
//! and one list of them.
//!
//! Every crate of the workspace that can be configured has a builder (or a
//! configuration struct) and reads `CT_*`, `MENPS_*` and `OMP_*` variables,
//! always with the same precedence ([`pick`]):
//!
//! 1. a value given to the **builder** by the program wins (the variable is
//!    then not read at all);
//! 2. otherwise the **environment** variable, if set;
//! 3. otherwise the **default**.
//!
//! Values are read with one set of rules ([`parse`]); leading and trailing
//! whitespace is ignored:
//!
//! | kind | accepted |
//! |---|---|
//! | size | `4096`, `64k`, `1M`, `2G`, `1MiB`, `64kb`, `512B`: binary multiples `k`/`M`/`G`/`T` (2^10 .. 2^40), letters case-insensitive, optionally followed by `B` or `iB` |
//! | count | decimal digits, within the variable's range |
//! | duration | `500us`, `10ms`, `2s`, `1.5s` (units `ns`, `us`, `ms`, `s`, lower case); a bare number is in the unit the variable's name ends with (`MENPS_GRACE_MS=2000`) |
//! | rate | `10Gbit`, `100Gbit`, `800Mbit`, `2.5Gbit/s`, `25Gbps` (bits per second; decimal multiples `k`/`M`/`G`/`T`, case-insensitive; a unit is required) |
//! | boolean | `1`, `true`, `yes`, `on` / `0`, `false`, `no`, `off` (case-insensitive) |
//! | choice | one of the variable's names (case-insensitive) |
//!
//! A variable that is set but empty, not UTF-8, or not of its kind is an
//! [`Error`] that names the variable and the accepted forms:
//!
//! ```
//! use ct_config::vars;
//! // SAFETY: nothing else in this example reads the environment.
//! unsafe { std::env::set_var("CT_STACK_SIZE", "64q") };
//! let e = vars::CT_STACK_SIZE.size().unwrap_err();
//! assert!(e.to_string().starts_with("CT_STACK_SIZE=\"64q\" is not valid: expected a size"));
//! unsafe { std::env::set_var("CT_STACK_SIZE", "64k") };
//! assert_eq!(vars::CT_STACK_SIZE.size().unwrap(), Some(65536));
//! ```
//!
//! [`vars::ALL`] lists every variable the workspace reads, with its kind,
//! default and reader; the README's table lists the same names, and
//! `menps env` prints each one's value and where it came from.

pub mod parse;
mod var;
pub mod vars;

pub use parse::Unit;
pub use var::{Error, Kind, Problem, Source, Var, pick};

#[cfg(test)]
mod tests;
