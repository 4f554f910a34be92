//! The value parsers: sizes, counts, durations, link rates, booleans and
//! choices.
//!
//! Each returns `None` for a value it does not accept; [`Var`](crate::Var)
//! turns that into an [`Error`](crate::Error) naming the variable and the
//! accepted forms. Leading and trailing whitespace is ignored everywhere.

use std::time::Duration;

/// Parses a size in bytes: decimal digits, then optionally a binary multiple
/// `k`, `M`, `G` or `T` (2^10, 2^20, 2^30, 2^40), optionally followed by `B`
/// or `iB`; or the digits followed by `B` alone (bytes). Letters are
/// case-insensitive (`64k`, `64K`, `64KiB` and `64kb` are all 65536: there
/// are no decimal multiples), and spaces may separate the number from its
/// unit. A bare number is a count of `bare_unit` bytes (1 for most
/// variables; 1024 for `OMP_STACKSIZE`, as the OpenMP standard says).
/// `None` for anything else, and on overflow.
pub fn size(s: &str, bare_unit: u64) -> Option<u64> {
    let s = s.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(digits_end);
    if digits.is_empty() {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let unit = unit.trim_start().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" => bare_unit,
        "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Parses a count: decimal digits only (no sign, no suffix), within
/// `min..=max`.
pub fn count(s: &str, min: u64, max: u64) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = s.parse().ok()?;
    (min..=max).contains(&n).then_some(n)
}

/// The unit of a duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Nanoseconds (`ns`).
    Nanos,
    /// Microseconds (`us`).
    Micros,
    /// Milliseconds (`ms`).
    Millis,
    /// Seconds (`s`).
    Secs,
}

impl Unit {
    fn nanos(self) -> f64 {
        match self {
            Unit::Nanos => 1.0,
            Unit::Micros => 1e3,
            Unit::Millis => 1e6,
            Unit::Secs => 1e9,
        }
    }

    /// The unit's suffix (`ns`, `us`, `ms`, `s`).
    pub fn suffix(self) -> &'static str {
        match self {
            Unit::Nanos => "ns",
            Unit::Micros => "us",
            Unit::Millis => "ms",
            Unit::Secs => "s",
        }
    }
}

/// Splits `s` (trimmed) into a decimal number — digits, optionally a `.`
/// and more digits — and what follows it (the unit, possibly empty or
/// starting with spaces). `None` if `s` does not start with such a number.
fn number_and_unit(s: &str) -> Option<(&str, &str)> {
    let s = s.trim();
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(num_end);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() || (num.contains('.') && frac.is_empty()) || frac.contains('.') {
        return None;
    }
    Some((num, unit))
}

/// Parses a duration: a decimal number (digits, optionally a `.` and more
/// digits) and a unit `ns`, `us`, `ms` or `s` (lower case; spaces may
/// separate them): `500us`, `10ms`, `2s`, `1.5s`. A bare number is in
/// `bare` units (the unit in the variable's name: `MENPS_GRACE_MS=2000`);
/// with `bare = None` a unit is required. At most about 30 years.
pub fn duration(s: &str, bare: Option<Unit>) -> Option<Duration> {
    let (num, unit) = number_and_unit(s)?;
    let unit = match unit.trim_start() {
        "" => bare?,
        "ns" => Unit::Nanos,
        "us" => Unit::Micros,
        "ms" => Unit::Millis,
        "s" => Unit::Secs,
        _ => return None,
    };
    let value: f64 = num.parse().ok()?;
    let nanos = value * unit.nanos();
    if !(0.0..1e18).contains(&nanos) {
        return None;
    }
    Some(Duration::from_nanos(nanos.round() as u64))
}

/// Parses a link rate in bits per second: a decimal number (digits,
/// optionally a `.` and more digits) and a unit `bit`, `kbit`, `Mbit`,
/// `Gbit` or `Tbit`, optionally followed by `/s` (`10Gbit`, `100Gbit`,
/// `800Mbit`, `2.5Gbit/s`); also `bps`, `kbps`, `Mbps`, `Gbps`, `Tbps`.
/// Multiples are decimal, as link rates are (`10Gbit` is 10^10 bit/s), and
/// case-insensitive; spaces may separate the number from its unit. A unit
/// is required, so that bits are never mistaken for bytes. `None` for
/// anything else, for 0, and past 10^18 bit/s.
pub fn bit_rate(s: &str) -> Option<u64> {
    let (num, unit) = number_and_unit(s)?;
    let unit = unit.trim_start().to_ascii_lowercase();
    let unit = unit.strip_suffix("/s").unwrap_or(&unit);
    let (prefix, rest) = unit.split_at(unit.find('b')?);
    if rest != "bit" && rest != "bps" {
        return None;
    }
    let mult = match prefix {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        _ => return None,
    };
    let value: f64 = num.parse().ok()?;
    let bits = value * mult;
    if !(1.0..=1e18).contains(&bits) {
        return None;
    }
    Some(bits.round() as u64)
}

/// Parses a boolean: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off`
/// (case-insensitive).
pub fn boolean(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Parses one of `names` (case-insensitive); returns the name as spelt in
/// `names`.
pub fn choice(s: &str, names: &[&'static str]) -> Option<&'static str> {
    let s = s.trim();
    names.iter().copied().find(|n| n.eq_ignore_ascii_case(s))
}
