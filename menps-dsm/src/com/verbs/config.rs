//! Settings of the `verbs` backend: which adapter, port and GID index, from
//! the `MENPS_VERBS_*` variables (through `ct-config`).

use ct_config::vars;

use crate::com::{Error, Result};

/// Names of the environment variables this backend reads.
pub mod env {
    /// Adapter name.
    pub const DEVICE: &str = ct_config::vars::MENPS_VERBS_DEVICE.name;
    /// Port number.
    pub const PORT: &str = ct_config::vars::MENPS_VERBS_PORT.name;
    /// GID index.
    pub const GID_INDEX: &str = ct_config::vars::MENPS_VERBS_GID_INDEX.name;
}

/// Settings of [`VerbsCom`](super::VerbsCom).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Adapter name (`None`: the first).
    pub device: Option<String>,
    /// Port number (from 1).
    pub port: u8,
    /// GID table index.
    pub gid_index: u8,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        VerbsConfig {
            device: None,
            port: 1,
            gid_index: 0,
        }
    }
}

impl VerbsConfig {
    /// The defaults with the `MENPS_VERBS_*` variables applied.
    pub fn from_env() -> Result<Self> {
        let d = VerbsConfig::default();
        let bad = |e: ct_config::Error| Error::BadConfig(e.to_string());
        let byte = |v: &ct_config::Var, d: u8| -> Result<u8> {
            // The variables' ranges (1..=255, 0..=255) fit in a byte.
            Ok(v.count()
                .map_err(bad)?
                .map_or(d, |n| u8::try_from(n).unwrap_or(u8::MAX)))
        };
        Ok(VerbsConfig {
            device: vars::MENPS_VERBS_DEVICE.text().map_err(bad)?.or(d.device),
            port: byte(&vars::MENPS_VERBS_PORT, d.port)?,
            gid_index: byte(&vars::MENPS_VERBS_GID_INDEX, d.gid_index)?,
        })
    }
}
