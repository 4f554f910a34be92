//! Errors of failed verbs calls: the call's name and the errno text.

use std::os::raw::c_int;

use crate::com::Error;

/// The text of the calling thread's `errno`.
pub(super) fn errno_text() -> String {
    std::io::Error::last_os_error().to_string()
}

/// The error of verbs call `call` that returned `rc`.
pub(super) fn verbs_error(call: &str, rc: c_int) -> Error {
    // Verbs calls return an errno value (or -1 with errno set).
    let text = if rc > 0 {
        std::io::Error::from_raw_os_error(rc).to_string()
    } else {
        errno_text()
    };
    Error::Transport(format!("{call} failed: {text}"))
}
