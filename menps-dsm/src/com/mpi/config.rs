//! Settings of the `mpi` backend: the `MENPS_MPI_*` variables (through
//! `ct-config`), and the judgement of OpenMPI's `OMPI_MCA_osc` setting (see
//! the [module docs](super) for why some values crash).

use std::time::Duration;

use ct_config::vars;

use super::WindowFlavor;
use crate::com::{Error, Result};

/// Names of the environment variables this backend reads.
pub mod env {
    /// OpenMPI's one-sided component selection.
    pub const OMPI_OSC: &str = ct_config::vars::OMPI_MCA_OSC.name;
    /// `0`/`1`: offload RMA.
    pub const OFFLOAD: &str = ct_config::vars::MENPS_MPI_OFFLOAD.name;
    /// Progress-thread interval in microseconds (`0`: none).
    pub const PROGRESS_US: &str = ct_config::vars::MENPS_MPI_PROGRESS_US.name;
    /// `onesided` / `messages` / `auto`: how RMA reaches other processes.
    pub const RMA: &str = ct_config::vars::MENPS_MPI_RMA.name;
    /// `0`: skip the `OMPI_MCA_osc` check.
    pub const OSC_CHECK: &str = ct_config::vars::MENPS_MPI_OSC_CHECK.name;
    /// `0`: never re-execute before `MPI_Init`.
    pub const REEXEC: &str = ct_config::vars::MENPS_MPI_REEXEC.name;
    /// `shared` / `create` / `auto`: how windows are made
    /// ([`WindowFlavor`](super::WindowFlavor)).
    pub const WINDOWS: &str = ct_config::vars::MENPS_MPI_WINDOWS.name;
    /// Set in the environment of the re-executed process.
    pub const REEXECED: &str = "MENPS_MPI_REEXECED";
}

/// The `OMPI_MCA_osc` value the backend sets when none is given.
pub const RECOMMENDED_OSC: &str = "sm,ucx";

/// Settings of [`MpiCom`](super::MpiCom).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpiConfig {
    /// Offload RMA to `ct-delegate`'s [`Offloader`](ct_delegate::Offloader) (`Some(true)`), make
    /// direct calls (`Some(false)`), or choose (`None`: offload for
    /// user-level threads when the job spans several machines; see the
    /// [module docs](super)).
    pub offload: Option<bool>,
    /// Interval of the progress thread (`None`: no thread).
    pub progress_interval: Option<Duration>,
    /// How windows are made (`None`: [`WindowFlavor::Shared`] when every
    /// process runs on this machine, [`WindowFlavor::Created`] otherwise).
    pub windows: Option<WindowFlavor>,
    /// RMA as requests the target serves (`Some(true)`, see `served`), as
    /// MPI one-sided operations (`Some(false)`), or chosen (`None`:
    /// requests when the windows are [`WindowFlavor::Created`] and this
    /// machine has no RDMA device, i.e. when `osc ucx` would emulate
    /// one-sided operations over TCP).
    pub served_rma: Option<bool>,
    /// Refuse `OMPI_MCA_osc` values known to crash or fail.
    pub osc_check: bool,
    /// Allow re-executing the process before `MPI_Init` (to set
    /// `OMPI_MCA_osc` and `ADDR_NO_RANDOMIZE`).
    pub reexec: bool,
}

impl Default for MpiConfig {
    fn default() -> Self {
        MpiConfig {
            offload: None,
            progress_interval: Some(Duration::from_millis(1)),
            windows: None,
            served_rma: None,
            osc_check: true,
            reexec: true,
        }
    }
}

fn bad_var(e: ct_config::Error) -> Error {
    Error::BadConfig(e.to_string())
}

impl MpiConfig {
    /// The defaults with the `MENPS_MPI_*` variables applied.
    pub fn from_env() -> Result<Self> {
        let d = MpiConfig::default();
        Ok(MpiConfig {
            offload: vars::MENPS_MPI_OFFLOAD
                .flag()
                .map_err(bad_var)?
                .or(d.offload),
            progress_interval: match vars::MENPS_MPI_PROGRESS_US.duration().map_err(bad_var)? {
                None => d.progress_interval,
                Some(Duration::ZERO) => None,
                Some(t) => Some(t),
            },
            windows: match vars::MENPS_MPI_WINDOWS.choice().map_err(bad_var)? {
                None => d.windows,
                Some(name) => WindowFlavor::parse(name).ok_or_else(|| {
                    Error::BadConfig(format!("{}={name:?}: unknown flavour", env::WINDOWS))
                })?,
            },
            served_rma: match vars::MENPS_MPI_RMA.choice().map_err(bad_var)? {
                None | Some("auto") => d.served_rma,
                Some("messages") => Some(true),
                Some("onesided") => Some(false),
                Some(other) => {
                    return Err(Error::BadConfig(format!(
                        "{}={other:?}: use onesided, messages or auto",
                        env::RMA
                    )));
                }
            },
            osc_check: vars::MENPS_MPI_OSC_CHECK
                .flag()
                .map_err(bad_var)?
                .unwrap_or(d.osc_check),
            reexec: vars::MENPS_MPI_REEXEC
                .flag()
                .map_err(bad_var)?
                .unwrap_or(d.reexec),
        })
    }
}

/// Judges an `OMPI_MCA_osc` value: `Ok` if it cannot select a component
/// known to crash (`rdma`, whose `MPI_Compare_and_swap` segfaults on one
/// machine in OpenMPI 4.1) or to fail (`pt2pt`, which refuses
/// `MPI_THREAD_MULTIPLE`), and leaves `sm` or `ucx`; otherwise an
/// [`Error::BadConfig`] naming the fix. `None` (unset) is fine: the backend
/// sets [`RECOMMENDED_OSC`].
pub fn check_osc_setting(value: Option<&str>) -> Result<()> {
    const ALL: [&str; 5] = ["rdma", "sm", "ucx", "pt2pt", "monitoring"];
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    let (exclude, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let named: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let selected: Vec<&str> = if exclude {
        ALL.iter().copied().filter(|c| !named.contains(c)).collect()
    } else {
        named.clone()
    };
    let bad: Vec<&str> = selected
        .iter()
        .copied()
        .filter(|c| matches!(*c, "rdma" | "pt2pt"))
        .collect();
    let usable = selected.iter().any(|c| matches!(*c, "sm" | "ucx"));
    if bad.is_empty() && usable {
        return Ok(());
    }
    let why = if bad.contains(&"rdma") {
        "OpenMPI 4.1's `osc rdma` component crashes (SIGSEGV) in MPI_Compare_and_swap on one \
         machine (open-mpi/ompi#11349)"
    } else if bad.contains(&"pt2pt") {
        "OpenMPI's `osc pt2pt` component refuses MPI_THREAD_MULTIPLE, which this backend needs"
    } else {
        "it selects neither `sm` nor `ucx`, the one-sided components that work"
    };
    Err(Error::BadConfig(format!(
        "{}={v:?} cannot be used: {why}. Fix: set {}={RECOMMENDED_OSC} (or leave it unset: \
         menps then sets it), e.g. `mpirun -x {}={RECOMMENDED_OSC} ...`; {}=0 skips this check",
        env::OMPI_OSC,
        env::OMPI_OSC,
        env::OMPI_OSC,
        env::OSC_CHECK
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn osc_settings_are_judged() {
        for ok in [
            None,
            Some(""),
            Some("sm,ucx"),
            Some("sm"),
            Some("ucx"),
            Some("^rdma,pt2pt"),
        ] {
            assert_eq!(check_osc_setting(ok), Ok(()), "{ok:?}");
        }
        for bad in ["rdma", "pt2pt", "^pt2pt", "sm,rdma", "^sm,ucx", "foo"] {
            let e = check_osc_setting(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("OMPI_MCA_osc=sm,ucx") && e.contains(bad),
                "{bad}: {e}"
            );
        }
        assert!(
            check_osc_setting(Some("rdma"))
                .unwrap_err()
                .to_string()
                .contains("MPI_Compare_and_swap")
        );
    }
}
