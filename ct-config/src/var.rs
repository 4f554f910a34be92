//! A variable's description, its typed reads, and precedence.

use std::ffi::OsString;
use std::fmt;
use std::time::Duration;

use crate::parse::{self, Unit};

/// What a variable holds, and so which parser reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A size ([`parse::size`]); a bare number counts `bare_unit` bytes.
    Size {
        /// Bytes of a bare number (1, or 1024 for `OMP_STACKSIZE`).
        bare_unit: u64,
    },
    /// A whole number in `min..=max` ([`parse::count`]).
    Count {
        /// Smallest value accepted.
        min: u64,
        /// Largest value accepted.
        max: u64,
    },
    /// A duration ([`parse::duration`]); a bare number is in `bare` units.
    Duration {
        /// Unit of a bare number (`None`: a unit is required).
        bare: Option<Unit>,
    },
    /// A link rate in bits per second ([`parse::bit_rate`]).
    Rate,
    /// A boolean ([`parse::boolean`]).
    Bool,
    /// One of the names ([`parse::choice`]).
    Choice(&'static [&'static str]),
    /// Any non-empty text (a path, a command, a device name).
    Text,
    /// A value with its own syntax, read by its crate with
    /// [`Var::parse_with`]; the string describes the accepted forms.
    Custom(&'static str),
}

impl Kind {
    /// The accepted forms, as error messages and `menps env` print them.
    pub fn forms(&self) -> String {
        match *self {
            Kind::Size { bare_unit: 1 } => "a size in bytes such as 4096, 64k, 1M, 2G or 1MiB \
                 (binary multiples k/M/G/T, case-insensitive, optionally followed by B or iB)"
                .into(),
            Kind::Size { bare_unit } => format!(
                "a size such as 512K, 1M, 2G or 65536B (a bare number counts {bare_unit}-byte \
                 units; binary multiples k/M/G/T, case-insensitive)"
            ),
            Kind::Count { min, max: u64::MAX } => format!("a whole number of at least {min}"),
            Kind::Count { min, max } => format!("a whole number from {min} to {max}"),
            Kind::Duration { bare } => format!(
                "a duration such as 500us, 10ms, 2s or 1.5s (units ns, us, ms, s){}",
                match bare {
                    Some(u) => format!("; a bare number is in {}", u.suffix()),
                    None => String::new(),
                }
            ),
            Kind::Rate => "a link rate such as 10Gbit, 100Gbit, 800Mbit or 2.5Gbit/s \
                 (units bit, kbit, Mbit, Gbit, Tbit or bps, kbps, Mbps, Gbps, Tbps; decimal \
                 multiples, case-insensitive; a unit is required)"
                .into(),
            Kind::Bool => "one of 1, 0, true, false, yes, no, on, off".into(),
            Kind::Choice(names) => format!("one of {}", names.join(", ")),
            Kind::Text => "a non-empty value".into(),
            Kind::Custom(forms) => forms.into(),
        }
    }

    /// Whether `value` is accepted (always true for [`Kind::Custom`], whose
    /// syntax only its crate knows).
    pub fn accepts(&self, value: &str) -> bool {
        match *self {
            Kind::Size { bare_unit } => parse::size(value, bare_unit).is_some(),
            Kind::Count { min, max } => parse::count(value, min, max).is_some(),
            Kind::Duration { bare } => parse::duration(value, bare).is_some(),
            Kind::Rate => parse::bit_rate(value).is_some(),
            Kind::Bool => parse::boolean(value).is_some(),
            Kind::Choice(names) => parse::choice(value, names).is_some(),
            Kind::Text | Kind::Custom(_) => !value.trim().is_empty(),
        }
    }
}

/// An environment variable of the workspace: its name, what it holds, its
/// default and who reads it. The whole list is [`crate::vars::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    /// The variable's name.
    pub name: &'static str,
    /// What it holds.
    pub kind: Kind,
    /// The default, as text (what applies when the variable is unset).
    pub default: &'static str,
    /// The crate that reads it.
    pub owner: &'static str,
    /// One line on what it does.
    pub help: &'static str,
}

/// Why a variable's value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The variable.
    pub var: &'static str,
    /// What is wrong with it.
    pub problem: Problem,
    /// The accepted forms ([`Kind::forms`]).
    pub expected: String,
}

/// What is wrong with a variable's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// Set, but empty or only whitespace.
    Empty,
    /// Not valid UTF-8.
    NotUnicode,
    /// Not one of the accepted forms (the value as given).
    Invalid(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Error {
            var,
            problem,
            expected,
        } = self;
        match problem {
            Problem::Empty => write!(
                f,
                "{var} is set but empty: expected {expected} (or unset it for the default)"
            ),
            Problem::NotUnicode => write!(f, "{var} is not valid UTF-8: expected {expected}"),
            Problem::Invalid(v) => write!(f, "{var}={v:?} is not valid: expected {expected}"),
        }
    }
}

impl std::error::Error for Error {}

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// Given to a builder by the program (wins over everything).
    Builder,
    /// Read from the environment (used when the builder gave nothing).
    Environment,
    /// The default (neither the builder nor the environment gave a value).
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Builder => "builder",
            Source::Environment => "environment",
            Source::Default => "default",
        })
    }
}

/// The workspace's precedence: the `builder` value if there is one (the
/// environment is then not read at all), else what `env` reads, else
/// `default()`. Returns the value and where it came from.
///
/// ```
/// use ct_config::{Source, pick};
/// let from_env = || Ok(Some(3));
/// assert_eq!(pick(Some(2), from_env, || 1).unwrap(), (2, Source::Builder));
/// assert_eq!(pick(None, from_env, || 1).unwrap(), (3, Source::Environment));
/// assert_eq!(pick(None, || Ok(None), || 1).unwrap(), (1, Source::Default));
/// ```
pub fn pick<T>(
    builder: Option<T>,
    env: impl FnOnce() -> Result<Option<T>, Error>,
    default: impl FnOnce() -> T,
) -> Result<(T, Source), Error> {
    if let Some(v) = builder {
        return Ok((v, Source::Builder));
    }
    Ok(match env()? {
        Some(v) => (v, Source::Environment),
        None => (default(), Source::Default),
    })
}

impl Var {
    /// The raw value, `None` if unset.
    pub fn raw(&self) -> Option<OsString> {
        std::env::var_os(self.name)
    }

    fn error(&self, problem: Problem) -> Error {
        Error {
            var: self.name,
            problem,
            expected: self.kind.forms(),
        }
    }

    /// Checks a value given as text against the variable's kind (for
    /// values that do not come from the environment, and for `menps env`).
    pub fn check(&self, value: &str) -> Result<(), Error> {
        if value.trim().is_empty() {
            Err(self.error(Problem::Empty))
        } else if self.kind.accepts(value) {
            Ok(())
        } else {
            Err(self.error(Problem::Invalid(value.to_owned())))
        }
    }

    /// The value, trimmed: `None` if unset, an error if empty or not UTF-8.
    pub fn text(&self) -> Result<Option<String>, Error> {
        match self.raw() {
            None => Ok(None),
            Some(v) => match v.into_string() {
                Err(_) => Err(self.error(Problem::NotUnicode)),
                Ok(s) if s.trim().is_empty() => Err(self.error(Problem::Empty)),
                Ok(s) => Ok(Some(s.trim().to_owned())),
            },
        }
    }

    /// The value read with `parse` (`None` from it: an error naming the
    /// variable and [`Kind::forms`]); `None` if unset.
    pub fn parse_with<T>(&self, parse: impl FnOnce(&str) -> Option<T>) -> Result<Option<T>, Error> {
        match self.text()? {
            None => Ok(None),
            Some(s) => match parse(&s) {
                Some(v) => Ok(Some(v)),
                None => Err(self.error(Problem::Invalid(s))),
            },
        }
    }

    /// A [`Kind::Size`] variable in bytes.
    pub fn size(&self) -> Result<Option<usize>, Error> {
        let Kind::Size { bare_unit } = self.kind else {
            panic!("{} is not a size", self.name)
        };
        self.parse_with(|s| parse::size(s, bare_unit).and_then(|n| usize::try_from(n).ok()))
    }

    /// A [`Kind::Count`] variable.
    pub fn count(&self) -> Result<Option<u64>, Error> {
        let Kind::Count { min, max } = self.kind else {
            panic!("{} is not a count", self.name)
        };
        self.parse_with(|s| parse::count(s, min, max))
    }

    /// A [`Kind::Count`] variable as a `usize`.
    pub fn count_usize(&self) -> Result<Option<usize>, Error> {
        let Kind::Count { min, max } = self.kind else {
            panic!("{} is not a count", self.name)
        };
        self.parse_with(|s| parse::count(s, min, max).and_then(|n| usize::try_from(n).ok()))
    }

    /// A [`Kind::Duration`] variable.
    pub fn duration(&self) -> Result<Option<Duration>, Error> {
        let Kind::Duration { bare } = self.kind else {
            panic!("{} is not a duration", self.name)
        };
        self.parse_with(|s| parse::duration(s, bare))
    }

    /// A [`Kind::Rate`] variable, in bits per second.
    pub fn rate(&self) -> Result<Option<u64>, Error> {
        assert!(self.kind == Kind::Rate, "{} is not a rate", self.name);
        self.parse_with(parse::bit_rate)
    }

    /// A [`Kind::Bool`] variable.
    pub fn flag(&self) -> Result<Option<bool>, Error> {
        assert!(self.kind == Kind::Bool, "{} is not a boolean", self.name);
        self.parse_with(parse::boolean)
    }

    /// A [`Kind::Choice`] variable: the chosen name as spelt in the list.
    pub fn choice(&self) -> Result<Option<&'static str>, Error> {
        let Kind::Choice(names) = self.kind else {
            panic!("{} is not a choice", self.name)
        };
        self.parse_with(|s| parse::choice(s, names))
    }

    /// What applies now, for display: the environment's value (checked
    /// against the kind) or the default text.
    pub fn current(&self) -> (String, Source, Result<(), Error>) {
        match self.text() {
            Ok(None) => (self.default.to_owned(), Source::Default, Ok(())),
            Ok(Some(v)) => {
                let ok = self.check(&v);
                (v, Source::Environment, ok)
            }
            Err(e) => (
                self.raw()
                    .map(|v| v.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                Source::Environment,
                Err(e),
            ),
        }
    }
}
