//! `menps env`: every environment variable the workspace reads, its value
//! and where the value comes from (the environment, or the default).

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use ct_config::vars;

/// Prints the table; exits with 1 if a variable is set to a value its
/// reader would refuse (the reason follows the table), 2 on arguments.
pub fn run(args: &[OsString]) -> ExitCode {
    if let Some(a) = args.first() {
        eprintln!(
            "menps env: takes no arguments (got {:?})",
            a.to_string_lossy()
        );
        return ExitCode::from(2);
    }
    let (table, bad) = render();
    let mut out = std::io::stdout().lock();
    // A closed pipe (`menps env | head`) is not worth a panic.
    let _ = out.write_all(table.as_bytes());
    if bad.is_empty() {
        ExitCode::SUCCESS
    } else {
        for e in &bad {
            eprintln!("menps env: {e}");
        }
        ExitCode::from(1)
    }
}

/// The table (one line per variable of `ct_config::vars::ALL`) and the
/// errors of the variables set to unusable values.
fn render() -> (String, Vec<ct_config::Error>) {
    let rows: Vec<_> = vars::ALL
        .iter()
        .map(|v| {
            let (value, source, check) = v.current();
            (v, value, source, check)
        })
        .collect();
    let name_w = rows.iter().map(|r| r.0.name.len()).max().unwrap_or(0);
    let value_w = rows
        .iter()
        .map(|r| r.1.chars().count())
        .max()
        .unwrap_or(0)
        .min(40);
    let mut s = format!(
        "{:name_w$}  {:value_w$}  {:11}  READ BY\n",
        "VARIABLE", "VALUE", "SOURCE"
    );
    let mut bad = Vec::new();
    for (v, value, source, check) in rows {
        let mark = if check.is_err() { "  (invalid)" } else { "" };
        s += &format!(
            "{:name_w$}  {:value_w$}  {:11}  {}{mark}\n",
            v.name,
            value,
            source.to_string(),
            v.owner
        );
        if let Err(e) = check {
            bad.push(e);
        }
    }
    (s, bad)
}
