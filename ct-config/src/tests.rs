//! Table-driven tests of the parsers, the error messages and the list.

use std::time::Duration;

use crate::parse::{self, Unit};
use crate::{Error, Kind, Problem, Source, Var, pick, vars};

#[test]
fn sizes() {
    const K: u64 = 1 << 10;
    const M: u64 = 1 << 20;
    const G: u64 = 1 << 30;
    let ok: &[(&str, u64, u64)] = &[
        ("4096", 1, 4096),
        ("0", 1, 0),
        (" 4096 ", 1, 4096),
        ("512B", 1, 512),
        ("512b", 1, 512),
        ("64k", 1, 64 * K),
        ("64K", 1, 64 * K),
        ("64kb", 1, 64 * K),
        ("64KB", 1, 64 * K),
        ("64KiB", 1, 64 * K),
        ("64kib", 1, 64 * K),
        ("64 k", 1, 64 * K),
        ("1M", 1, M),
        ("1m", 1, M),
        ("1MiB", 1, M),
        ("1MB", 1, M),
        ("2G", 1, 2 * G),
        ("2gib", 1, 2 * G),
        ("1T", 1, 1 << 40),
        ("1TiB", 1, 1 << 40),
        // OMP_STACKSIZE: a bare number is KiB, B means bytes.
        ("512", K, 512 * K),
        ("65536B", K, 65536),
        ("1M", K, M),
    ];
    for &(s, bare, want) in ok {
        assert_eq!(parse::size(s, bare), Some(want), "{s:?} (bare unit {bare})");
    }
    let bad = [
        "",
        " ",
        "k",
        "-1",
        "+1",
        "1.5M",
        "12q",
        "1Mi",
        "1iB",
        "1 MiBs",
        "1kk",
        "0x10",
        "18446744073709551616",
        "16777216T",
    ];
    for s in bad {
        assert_eq!(parse::size(s, 1), None, "{s:?}");
    }
}

#[test]
fn counts() {
    let ok: &[(&str, u64, u64, u64)] = &[
        ("0", 0, 10, 0),
        ("10", 0, 10, 10),
        (" 7 ", 1, 255, 7),
        ("255", 0, 255, 255),
        ("18446744073709551615", 0, u64::MAX, u64::MAX),
    ];
    for &(s, min, max, want) in ok {
        assert_eq!(parse::count(s, min, max), Some(want), "{s:?}");
    }
    let bad: &[(&str, u64, u64)] = &[
        ("", 0, 10),
        ("11", 0, 10),
        ("0", 1, 10),
        ("256", 0, 255),
        ("-1", 0, 10),
        ("+1", 0, 10),
        ("1k", 0, u64::MAX),
        ("1.0", 0, 10),
        ("1 2", 0, 10),
        ("18446744073709551616", 0, u64::MAX),
    ];
    for &(s, min, max) in bad {
        assert_eq!(parse::count(s, min, max), None, "{s:?} in {min}..={max}");
    }
}

#[test]
fn durations() {
    let ok: &[(&str, Option<Unit>, Duration)] = &[
        ("500us", None, Duration::from_micros(500)),
        ("10ms", None, Duration::from_millis(10)),
        ("2s", None, Duration::from_secs(2)),
        ("1.5s", None, Duration::from_millis(1500)),
        ("250ns", None, Duration::from_nanos(250)),
        ("0s", None, Duration::ZERO),
        (" 10 ms ", None, Duration::from_millis(10)),
        ("2000", Some(Unit::Millis), Duration::from_millis(2000)),
        ("120", Some(Unit::Secs), Duration::from_secs(120)),
        ("0.5", Some(Unit::Secs), Duration::from_millis(500)),
        ("1000", Some(Unit::Micros), Duration::from_millis(1)),
        ("3s", Some(Unit::Millis), Duration::from_secs(3)),
    ];
    for &(s, bare, want) in ok {
        assert_eq!(parse::duration(s, bare), Some(want), "{s:?}");
    }
    let bad: &[(&str, Option<Unit>)] = &[
        ("", Some(Unit::Secs)),
        ("10", None),
        ("ms", None),
        (".5s", None),
        ("5.s", None),
        ("1.2.3s", None),
        ("-1s", None),
        ("10MS", None),
        ("10 min", None),
        ("10sec", None),
        ("1e3s", None),
        ("99999999999s", None),
    ];
    for &(s, bare) in bad {
        assert_eq!(parse::duration(s, bare), None, "{s:?}");
    }
}

#[test]
fn rates() {
    let ok: &[(&str, u64)] = &[
        ("10Gbit", 10_000_000_000),
        ("100Gbit", 100_000_000_000),
        ("800Mbit", 800_000_000),
        ("800mbit", 800_000_000),
        (" 2.5Gbit/s ", 2_500_000_000),
        ("25Gbps", 25_000_000_000),
        ("1 kbit", 1000),
        ("9600bit", 9600),
        ("1Tbit", 1_000_000_000_000),
    ];
    for &(s, bits) in ok {
        assert_eq!(parse::bit_rate(s), Some(bits), "{s:?}");
    }
    for s in [
        "", "10", "10G", "10GB", "10GiB", "fast", "0Gbit", "Gbit", "1.Gbit", "1..5Gbit", "-1Gbit",
        "10Xbit", "1e3Gbit", "10Gbit/h",
    ] {
        assert_eq!(parse::bit_rate(s), None, "{s:?}");
    }
    let v = test_var("CT_TEST_RATE", Kind::Rate);
    set("CT_TEST_RATE", "100Gbit");
    assert_eq!(v.rate(), Ok(Some(100_000_000_000)));
    set("CT_TEST_RATE", "100");
    let e = v.rate().unwrap_err().to_string();
    assert!(
        e.starts_with("CT_TEST_RATE=\"100\" is not valid: expected a link rate"),
        "{e}"
    );
}

#[test]
fn booleans() {
    for s in [
        "1", "true", "TRUE", "True", "yes", "YES", "on", "On", " on ",
    ] {
        assert_eq!(parse::boolean(s), Some(true), "{s:?}");
    }
    for s in ["0", "false", "FALSE", "no", "No", "off", "OFF", " 0 "] {
        assert_eq!(parse::boolean(s), Some(false), "{s:?}");
    }
    for s in [
        "", "2", "t", "f", "y", "n", "enable", "disabled", "-1", "10",
    ] {
        assert_eq!(parse::boolean(s), None, "{s:?}");
    }
}

#[test]
fn choices() {
    let names = &["floating", "fixed"];
    assert_eq!(parse::choice("fixed", names), Some("fixed"));
    assert_eq!(parse::choice(" Fixed ", names), Some("fixed"));
    assert_eq!(parse::choice("FLOATING", names), Some("floating"));
    assert_eq!(parse::choice("float", names), None);
    assert_eq!(parse::choice("", names), None);
}

/// Sets `name` for one test (each test uses its own names).
fn set(name: &str, value: &str) {
    // SAFETY: each test sets only variables no other test reads, and the
    // standard library serialises its own environment accesses.
    unsafe { std::env::set_var(name, value) };
}

fn test_var(name: &'static str, kind: Kind) -> Var {
    Var {
        name,
        kind,
        default: "d",
        owner: "test",
        help: "test",
    }
}

#[test]
fn every_error_message() {
    let size = test_var("CTCFG_T_SIZE", Kind::Size { bare_unit: 1 });
    let kib = test_var("CTCFG_T_KIB", Kind::Size { bare_unit: 1024 });
    let count = test_var("CTCFG_T_COUNT", Kind::Count { min: 1, max: 8 });
    let unbounded = test_var(
        "CTCFG_T_COUNT_U",
        Kind::Count {
            min: 0,
            max: u64::MAX,
        },
    );
    let dur = test_var(
        "CTCFG_T_DUR",
        Kind::Duration {
            bare: Some(Unit::Millis),
        },
    );
    let dur_unit = test_var("CTCFG_T_DUR_U", Kind::Duration { bare: None });
    let flag = test_var("CTCFG_T_BOOL", Kind::Bool);
    let choice = test_var("CTCFG_T_CHOICE", Kind::Choice(&["a", "b"]));
    let text = test_var("CTCFG_T_TEXT", Kind::Text);
    let custom = test_var("CTCFG_T_CUSTOM", Kind::Custom("an odd number"));
    let size_forms = "a size in bytes such as 4096, 64k, 1M, 2G or 1MiB (binary multiples \
                      k/M/G/T, case-insensitive, optionally followed by B or iB)";
    let table: &[(&Var, &str, String)] = &[
        (
            &size,
            "12q",
            format!("CTCFG_T_SIZE=\"12q\" is not valid: expected {size_forms}"),
        ),
        (
            &kib,
            "1.5M",
            "CTCFG_T_KIB=\"1.5M\" is not valid: expected a size such as 512K, 1M, 2G or 65536B \
             (a bare number counts 1024-byte units; binary multiples k/M/G/T, case-insensitive)"
                .into(),
        ),
        (
            &count,
            "9",
            "CTCFG_T_COUNT=\"9\" is not valid: expected a whole number from 1 to 8".into(),
        ),
        (
            &unbounded,
            "x",
            "CTCFG_T_COUNT_U=\"x\" is not valid: expected a whole number of at least 0".into(),
        ),
        (
            &dur,
            "soon",
            "CTCFG_T_DUR=\"soon\" is not valid: expected a duration such as 500us, 10ms, 2s or \
             1.5s (units ns, us, ms, s); a bare number is in ms"
                .into(),
        ),
        (
            &dur_unit,
            "10",
            "CTCFG_T_DUR_U=\"10\" is not valid: expected a duration such as 500us, 10ms, 2s or \
             1.5s (units ns, us, ms, s)"
                .into(),
        ),
        (
            &flag,
            "maybe",
            "CTCFG_T_BOOL=\"maybe\" is not valid: expected one of 1, 0, true, false, yes, no, \
             on, off"
                .into(),
        ),
        (
            &choice,
            "c",
            "CTCFG_T_CHOICE=\"c\" is not valid: expected one of a, b".into(),
        ),
        (
            &size,
            "  ",
            format!(
                "CTCFG_T_SIZE is set but empty: expected {size_forms} (or unset it for the \
                 default)"
            ),
        ),
        (
            &text,
            "",
            "CTCFG_T_TEXT is set but empty: expected a non-empty value (or unset it for the \
             default)"
                .into(),
        ),
    ];
    for (var, value, want) in table {
        set(var.name, value);
        let got = match var.kind {
            Kind::Size { .. } => var.size().map(drop),
            Kind::Count { .. } => var.count().map(drop),
            Kind::Duration { .. } => var.duration().map(drop),
            Kind::Rate => var.rate().map(drop),
            Kind::Bool => var.flag().map(drop),
            Kind::Choice(_) => var.choice().map(drop),
            Kind::Text | Kind::Custom(_) => var.text().map(drop),
        };
        assert_eq!(
            got.unwrap_err().to_string(),
            *want,
            "{}={value:?}",
            var.name
        );
        assert!(var.check(value).is_err());
    }
    // A custom syntax: the crate's parser decides, the message is the kind's.
    set(custom.name, "4");
    let e = custom
        .parse_with(|s| s.parse::<u32>().ok().filter(|n| n % 2 == 1))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "CTCFG_T_CUSTOM=\"4\" is not valid: expected an odd number"
    );
    set(custom.name, "5");
    assert_eq!(
        custom.parse_with(|s| s.parse::<u32>().ok().filter(|n| n % 2 == 1)),
        Ok(Some(5))
    );
    // Not UTF-8.
    {
        use std::os::unix::ffi::OsStrExt;
        let v = std::ffi::OsStr::from_bytes(b"\xff");
        // SAFETY: as in `set`.
        unsafe { std::env::set_var(text.name, v) };
        assert_eq!(
            text.text().unwrap_err(),
            Error {
                var: "CTCFG_T_TEXT",
                problem: Problem::NotUnicode,
                expected: "a non-empty value".into(),
            }
        );
        assert_eq!(
            text.text().unwrap_err().to_string(),
            "CTCFG_T_TEXT is not valid UTF-8: expected a non-empty value"
        );
    }
}

#[test]
fn typed_reads() {
    let v = test_var("CTCFG_R_SIZE", Kind::Size { bare_unit: 1 });
    assert_eq!(v.size(), Ok(None));
    set(v.name, " 2M ");
    assert_eq!(v.size(), Ok(Some(2 << 20)));
    let v = test_var(
        "CTCFG_R_DUR",
        Kind::Duration {
            bare: Some(Unit::Secs),
        },
    );
    set(v.name, "1.5");
    assert_eq!(v.duration(), Ok(Some(Duration::from_millis(1500))));
    let v = test_var("CTCFG_R_BOOL", Kind::Bool);
    set(v.name, "false");
    assert_eq!(v.flag(), Ok(Some(false)));
    let v = test_var("CTCFG_R_CHOICE", Kind::Choice(&["shm", "mpi"]));
    set(v.name, "MPI");
    assert_eq!(v.choice(), Ok(Some("mpi")));
    let v = test_var("CTCFG_R_TEXT", Kind::Text);
    set(v.name, "  /tmp/x  ");
    assert_eq!(v.text(), Ok(Some("/tmp/x".into())));
    assert_eq!(v.current(), ("/tmp/x".into(), Source::Environment, Ok(())));
    let v = test_var("CTCFG_R_UNSET", Kind::Bool);
    assert_eq!(v.current(), ("d".into(), Source::Default, Ok(())));
    let v = test_var("CTCFG_R_BAD", Kind::Bool);
    set(v.name, "2");
    let (value, source, check) = v.current();
    assert_eq!((value.as_str(), source), ("2", Source::Environment));
    assert!(check.is_err());
}

#[test]
fn builder_beats_environment_beats_default() {
    let v = test_var("CTCFG_P_COUNT", Kind::Count { min: 1, max: 100 });
    set(v.name, "7");
    assert_eq!(pick(Some(3), || v.count(), || 1), Ok((3, Source::Builder)));
    assert_eq!(pick(None, || v.count(), || 1), Ok((7, Source::Environment)));
    // A bad environment value does not matter when the builder decides.
    set(v.name, "x");
    assert_eq!(pick(Some(3), || v.count(), || 1), Ok((3, Source::Builder)));
    assert!(pick(None, || v.count(), || 1).is_err());
    let unset = test_var("CTCFG_P_UNSET", Kind::Count { min: 1, max: 100 });
    assert_eq!(pick(None, || unset.count(), || 1), Ok((1, Source::Default)));
}

#[test]
fn the_list_is_consistent() {
    for (i, v) in vars::ALL.iter().enumerate() {
        assert!(
            vars::ALL[..i].iter().all(|w| w.name != v.name),
            "{} listed twice",
            v.name
        );
        assert_eq!(vars::find(v.name), Some(v));
        // Defaults that are values must be valid values.
        let literal = !v.default.contains(' ') && !v.default.starts_with('(');
        if literal && !matches!(v.kind, Kind::Text | Kind::Custom(_)) && v.default != "auto" {
            assert!(
                v.check(v.default).is_ok(),
                "{}'s default {:?}",
                v.name,
                v.default
            );
        }
    }
}

#[test]
fn the_readme_table_lists_every_variable() {
    let readme = include_str!("../../README.md");
    let table = readme
        .split("## Environment variables")
        .nth(1)
        .expect("the README has an Environment variables section");
    let table = table.split("\n## ").next().unwrap_or(table);
    for v in vars::ALL {
        assert!(
            table.contains(&format!("`{}`", v.name)),
            "{} is missing from the README's table",
            v.name
        );
    }
}
