//! The command line of `menps run`, parsed with `lexopt`: options in any
//! of the usual spellings (`-n 4`, `-n4`, `--nprocs 4`, `--nprocs=4`), up to
//! the program (or `--`); everything after the program is its own. An
//! option the launcher does not know — a typo — is an error naming the
//! options it does know, never skipped and never taken for the program.

use std::ffi::OsString;
use std::time::Duration;

use lexopt::Arg::{Long, Short, Value};
use menps_dsm::launch::JobConfig;

/// The options of `menps run`, for messages.
const OPTIONS: &str = "-n/--nprocs, --backend, --prefix-output, --grace-ms, --timeout, -h/--help";

/// What the command line of `menps run` asks for.
#[derive(Debug)]
pub enum Run {
    /// `-h` / `--help`.
    Help,
    /// Start a job of `program` with `args` under `config`.
    Job {
        /// The options applied over the configuration passed in.
        config: JobConfig,
        /// The program to start.
        program: OsString,
        /// Its arguments.
        args: Vec<OsString>,
    },
}

/// Parses the arguments of `menps run` (after `run`) over `config` (the
/// defaults with the environment applied: options win). `Err` holds the
/// message for the user.
pub fn parse_run(args: Vec<OsString>, mut config: JobConfig) -> Result<Run, String> {
    let mut p = lexopt::Parser::from_args(args);
    let program = loop {
        let arg = p.next().map_err(|e| e.to_string())?;
        match arg {
            None => return Err("missing program".into()),
            Some(Short('h') | Long("help")) => return Ok(Run::Help),
            Some(Short('n') | Long("nprocs")) => {
                config.nprocs = value(&mut p, "-n")?
                    .parse()
                    .map_err(|_| "-n needs a positive integer".to_string())?;
            }
            Some(Long("backend")) => {
                config.backend = value(&mut p, "--backend")?
                    .parse()
                    .map_err(|e: menps_dsm::com::Error| e.to_string())?;
            }
            Some(Long("prefix-output")) => config.prefix_output = true,
            Some(Long("grace-ms")) => {
                let ms: u64 = value(&mut p, "--grace-ms")?
                    .parse()
                    .map_err(|_| "--grace-ms needs milliseconds".to_string())?;
                config.grace = Duration::from_millis(ms);
            }
            Some(Long("timeout")) => match value(&mut p, "--timeout")?.parse::<f64>() {
                Ok(t) if t > 0.0 && t < 1e9 => config.timeout = Some(Duration::from_secs_f64(t)),
                _ => return Err("--timeout needs a positive number of seconds".into()),
            },
            Some(Value(program)) => break program,
            Some(Short(c)) => return Err(format!("unknown option -{c} (options: {OPTIONS})")),
            Some(Long(name)) => {
                return Err(format!("unknown option --{name} (options: {OPTIONS})"));
            }
        }
    };
    // Everything after the program is the program's, options included.
    let args = p.raw_args().map_err(|e| e.to_string())?.collect::<Vec<_>>();
    Ok(Run::Job {
        config,
        program,
        args,
    })
}

/// The value of the option just seen, as UTF-8.
fn value(p: &mut lexopt::Parser, name: &str) -> Result<String, String> {
    p.value()
        .map_err(|_| format!("{name} needs a value"))?
        .into_string()
        .map_err(|v| format!("{name}: not valid UTF-8: {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Run, String> {
        parse_run(
            args.iter().map(OsString::from).collect(),
            JobConfig::default(),
        )
    }

    fn job(args: &[&str]) -> (JobConfig, OsString, Vec<OsString>) {
        match parse(args) {
            Ok(Run::Job {
                config,
                program,
                args,
            }) => (config, program, args),
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn every_spelling_of_an_option() {
        for a in [
            &["-n", "3", "prog"][..],
            &["-n3", "prog"],
            &["--nprocs", "3", "prog"],
            &["--nprocs=3", "--", "prog"],
        ] {
            assert_eq!(job(a).0.nprocs, 3, "{a:?}");
        }
        let (c, prog, args) = job(&[
            "--prefix-output",
            "--grace-ms=250",
            "--timeout",
            "1.5",
            "./p",
            "--nprocs",
            "-x",
        ]);
        assert!(c.prefix_output);
        assert_eq!(c.grace, Duration::from_millis(250));
        assert_eq!(c.timeout, Some(Duration::from_secs_f64(1.5)));
        assert_eq!(prog, "./p");
        // The program's own options stay its own.
        assert_eq!(args, ["--nprocs", "-x"]);
    }

    #[test]
    fn typos_are_rejected() {
        let e = parse(&["--nprocz", "2", "prog"]).unwrap_err();
        assert!(
            e.starts_with("unknown option --nprocz (options: -n/--nprocs"),
            "{e}"
        );
        let e = parse(&["-m", "2", "prog"]).unwrap_err();
        assert!(e.starts_with("unknown option -m "), "{e}");
        let e = parse(&["--prefix-output=yes", "prog"]).unwrap_err();
        assert!(e.contains("prefix-output"), "{e}");
        assert_eq!(
            parse(&["-n", "x", "p"]).unwrap_err(),
            "-n needs a positive integer"
        );
        assert_eq!(parse(&["-n"]).unwrap_err(), "-n needs a value");
        assert_eq!(parse(&["-n", "2"]).unwrap_err(), "missing program");
        assert!(matches!(parse(&["-h"]), Ok(Run::Help)));
    }
}
