//! Before and around `MPI_Init`: the `OMPI_MCA_osc` check, the re-exec that
//! sets `OMPI_MCA_osc` and turns address randomisation off, and the MPI
//! library's name for messages.

use std::os::raw::c_int;

use ::mpi::ffi;
use ct_config::vars;

use super::config::{MpiConfig, RECOMMENDED_OSC, check_osc_setting, env};
use crate::com::{Error, Result};

/// Whether address-space randomisation is off for this process.
fn aslr_disabled() -> bool {
    std::fs::read_to_string("/proc/self/personality")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim(), 16).ok())
        .is_some_and(|p| p & libc::ADDR_NO_RANDOMIZE as u64 != 0)
}

/// Before `MPI_Init`: checks `OMPI_MCA_osc` and re-executes the process if
/// that is needed to set it (or to turn address randomisation off).
pub(super) fn prepare_process(cfg: &MpiConfig) -> Result<()> {
    // Set but empty counts as unset here: OpenMPI ignores it too.
    let osc = vars::OMPI_MCA_OSC.text().ok().flatten();
    if cfg.osc_check {
        check_osc_setting(osc.as_deref())?;
    }
    if std::env::var_os(env::REEXECED).is_some() {
        return Ok(());
    }
    let need_osc = osc.is_none();
    let need_aslr = !aslr_disabled();
    if !need_osc && !need_aslr {
        return Ok(());
    }
    if !cfg.reexec {
        if need_osc {
            return Err(Error::BadConfig(format!(
                "{} is not set and {}=0 forbids setting it by re-executing the process; \
                 set {}={RECOMMENDED_OSC} (OpenMPI 4.1's default one-sided component crashes \
                 in MPI_Compare_and_swap)",
                env::OMPI_OSC,
                env::REEXEC,
                env::OMPI_OSC
            )));
        }
        return Ok(());
    }
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let mut cmd = std::process::Command::new("/proc/self/exe");
    if let Some(a0) = args.next() {
        cmd.arg0(a0);
    }
    cmd.args(args).env(env::REEXECED, "1");
    if need_osc {
        cmd.env(env::OMPI_OSC, RECOMMENDED_OSC);
    }
    if need_aslr {
        // SAFETY: personality() only changes an attribute of this process
        // that takes effect at the next exec; 0xffffffff queries it.
        unsafe {
            let p = libc::personality(0xffff_ffff);
            if p != -1 {
                libc::personality((p | libc::ADDR_NO_RANDOMIZE) as libc::c_ulong);
            }
        }
    }
    let e = cmd.exec();
    Err(Error::BadConfig(format!(
        "cannot re-execute /proc/self/exe before MPI_Init ({e}); set {}={RECOMMENDED_OSC} and \
         {}=0 to avoid the re-exec",
        env::OMPI_OSC,
        env::REEXEC
    )))
}

/// The MPI library's version string (first line).
pub(super) fn library_version() -> String {
    let mut buf = vec![0u8; ffi::MPI_MAX_LIBRARY_VERSION_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer has room for the longest version string.
    let rc = unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr().cast(), &mut len) };
    if rc != 0 || len <= 0 {
        return "unknown MPI library".into();
    }
    buf.truncate(len as usize);
    String::from_utf8_lossy(&buf)
        .lines()
        .next()
        .unwrap_or("")
        .trim_end_matches(['\0', ','])
        .trim()
        .to_owned()
}

/// Whether this machine has an RDMA device (an entry in
/// `/sys/class/infiniband`, where the kernel lists InfiniBand, RoCE and
/// iWARP devices): without one, `osc ucx` emulates one-sided operations
/// over TCP.
pub(super) fn rdma_device_present() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}
