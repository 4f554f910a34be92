//! Loop schedules: which iterations of a work-sharing loop each thread runs.

use core::fmt;
use core::ops::Range;

use crate::error::Error;

/// How a work-sharing loop hands out its iterations (OpenMP's `schedule`
/// clause).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Schedule {
    /// One contiguous block per thread, sizes differing by at most one
    /// (`schedule(static)`). No communication at all.
    #[default]
    Static,
    /// Chunks of this many iterations dealt round-robin
    /// (`schedule(static, n)`). No communication at all.
    StaticChunk(usize),
    /// Chunks of this many iterations taken first-come first-served from a
    /// counter shared by the whole team (`schedule(dynamic, n)`).
    Dynamic(usize),
    /// Chunks that shrink with the iterations left (remaining / threads),
    /// never below this many (`schedule(guided, n)`).
    Guided(usize),
    /// The team's run-time schedule: `OMP_SCHEDULE`, or what
    /// [`set_schedule`](crate::set_schedule) set (`schedule(runtime)`).
    Runtime,
    /// The runtime's choice (`schedule(auto)`): static blocks.
    Auto,
}

impl Schedule {
    /// Parses OpenMP's `OMP_SCHEDULE` syntax: `static`, `dynamic`, `guided`
    /// or `auto`, optionally followed by `,chunk` and preceded by a
    /// `monotonic:` or `nonmonotonic:` modifier (accepted and ignored).
    pub fn parse(s: &str) -> Result<Schedule, String> {
        let t = s.trim().to_ascii_lowercase();
        let t = t
            .strip_prefix("nonmonotonic:")
            .or_else(|| t.strip_prefix("monotonic:"))
            .unwrap_or(&t);
        let (kind, chunk) = match t.split_once(',') {
            Some((k, c)) => {
                let c: usize = c
                    .trim()
                    .parse()
                    .map_err(|_| format!("{s:?}: the chunk size must be a positive integer"))?;
                if c == 0 {
                    return Err(format!("{s:?}: the chunk size must be at least 1"));
                }
                (k.trim(), Some(c))
            }
            None => (t.trim(), None),
        };
        match (kind, chunk) {
            ("static", None) => Ok(Schedule::Static),
            ("static", Some(c)) => Ok(Schedule::StaticChunk(c)),
            ("dynamic", c) => Ok(Schedule::Dynamic(c.unwrap_or(1))),
            ("guided", c) => Ok(Schedule::Guided(c.unwrap_or(1))),
            ("auto", None) => Ok(Schedule::Auto),
            ("auto", Some(_)) => Err(format!("{s:?}: `auto` takes no chunk size")),
            _ => Err(format!(
                "{s:?}: expected static, dynamic, guided or auto, with an optional ,chunk"
            )),
        }
    }

    /// The schedule with `Runtime` and `Auto` replaced (by `runtime`, and
    /// by static blocks), chunk sizes of 0 raised to 1.
    #[doc(hidden)]
    pub fn resolve(self, runtime: Schedule) -> Schedule {
        match self {
            Schedule::Runtime => runtime.resolve(Schedule::Static),
            Schedule::Auto => Schedule::Static,
            Schedule::StaticChunk(c) => Schedule::StaticChunk(c.max(1)),
            Schedule::Dynamic(c) => Schedule::Dynamic(c.max(1)),
            Schedule::Guided(c) => Schedule::Guided(c.max(1)),
            Schedule::Static => Schedule::Static,
        }
    }

    /// Packs a resolved schedule into one word (sent with a region).
    #[doc(hidden)]
    pub fn encode(self) -> u64 {
        let (k, c) = match self {
            Schedule::Static => (0, 0),
            Schedule::StaticChunk(c) => (1, c),
            Schedule::Dynamic(c) => (2, c),
            Schedule::Guided(c) => (3, c),
            Schedule::Runtime => (4, 0),
            Schedule::Auto => (5, 0),
        };
        (k << 56) | (c as u64 & ((1 << 56) - 1))
    }

    /// Inverse of [`Schedule::encode`].
    #[doc(hidden)]
    pub fn decode(w: u64) -> Schedule {
        let c = (w & ((1 << 56) - 1)) as usize;
        match w >> 56 {
            1 => Schedule::StaticChunk(c),
            2 => Schedule::Dynamic(c),
            3 => Schedule::Guided(c),
            4 => Schedule::Runtime,
            5 => Schedule::Auto,
            _ => Schedule::Static,
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Static => f.write_str("static"),
            Schedule::StaticChunk(c) => write!(f, "static,{c}"),
            Schedule::Dynamic(c) => write!(f, "dynamic,{c}"),
            Schedule::Guided(c) => write!(f, "guided,{c}"),
            Schedule::Runtime => f.write_str("runtime"),
            Schedule::Auto => f.write_str("auto"),
        }
    }
}

impl core::str::FromStr for Schedule {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Schedule::parse(s).map_err(Error::Config)
    }
}

/// The block of `range` that thread `tid` of `n` runs under static
/// scheduling: sizes differ by at most one, lower threads get the larger.
pub fn static_block(range: Range<usize>, tid: usize, n: usize) -> Range<usize> {
    let len = range.end.saturating_sub(range.start);
    let (q, r) = (len / n, len % n);
    let lo = range.start + tid * q + tid.min(r);
    let hi = lo + q + usize::from(tid < r);
    lo..hi
}

/// Guided chunk for `remaining` iterations and `n` threads, at least `min`.
pub fn guided_chunk(remaining: usize, n: usize, min: usize) -> usize {
    remaining.div_ceil(n).max(min).min(remaining)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_omp_schedule() {
        assert_eq!(Schedule::parse("static").unwrap(), Schedule::Static);
        assert_eq!(
            Schedule::parse(" STATIC , 4").unwrap(),
            Schedule::StaticChunk(4)
        );
        assert_eq!(Schedule::parse("dynamic").unwrap(), Schedule::Dynamic(1));
        assert_eq!(
            Schedule::parse("nonmonotonic:dynamic,16").unwrap(),
            Schedule::Dynamic(16)
        );
        assert_eq!(
            Schedule::parse("monotonic:guided,2").unwrap(),
            Schedule::Guided(2)
        );
        assert_eq!(Schedule::parse("auto").unwrap(), Schedule::Auto);
        for bad in ["", "fast", "dynamic,0", "dynamic,x", "auto,3", "static,-1"] {
            assert!(Schedule::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn encodes_round_trip() {
        for s in [
            Schedule::Static,
            Schedule::StaticChunk(7),
            Schedule::Dynamic(1),
            Schedule::Guided(1 << 40),
            Schedule::Runtime,
            Schedule::Auto,
        ] {
            assert_eq!(Schedule::decode(s.encode()), s);
            assert_eq!(Schedule::parse(&s.to_string()).ok(), {
                (s != Schedule::Runtime).then_some(s)
            });
        }
    }

    #[test]
    fn static_blocks_cover_each_iteration_once() {
        for len in [0usize, 1, 5, 7, 64, 1000] {
            for n in 1..9 {
                let mut next = 3;
                for t in 0..n {
                    let b = static_block(3..3 + len, t, n);
                    assert_eq!(b.start, next);
                    assert!(b.len() <= len.div_ceil(n));
                    next = b.end;
                }
                assert_eq!(next, 3 + len);
            }
        }
    }

    #[test]
    fn guided_chunks_shrink_but_not_below_the_minimum() {
        assert_eq!(guided_chunk(100, 4, 1), 25);
        assert_eq!(guided_chunk(3, 4, 1), 1);
        assert_eq!(guided_chunk(3, 4, 2), 2);
        assert_eq!(guided_chunk(1, 4, 8), 1);
    }
}
