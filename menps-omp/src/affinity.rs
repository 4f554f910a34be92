//! Thread affinity: `OMP_PROC_BIND` and `OMP_PLACES`.
//!
//! Team threads are user-level threads that the team's workers (OS
//! threads) run, so binding places the **workers**: with `OMP_PROC_BIND`
//! set to anything but `false` (or unset, with `OMP_PLACES` set: as
//! `true`), worker `i` of process `r` is bound to one
//! place of `OMP_PLACES` (default `threads`: one place per processor the
//! process may run on), chosen as OpenMP chooses a place for team thread
//! `r × workers + i` of a team of `processes × workers` threads on one
//! machine:
//!
//! - `close` (and `true`): consecutive threads on consecutive places (with
//!   more threads than places, each place takes an equal run of threads);
//! - `spread`: threads as far apart as the places allow;
//! - `primary` (or `master`): every thread on the first place.
//!
//! Team thread `k` of a process normally runs on worker `k`, but a thread
//! may run on another worker of its process for a while (work stealing
//! when a worker is busy), so [`place_num`](crate::internals::place_num)
//! names the place of the worker running the caller *now*. Processes of a
//! job on several machines each apply the rule to their own machine's
//! processors. Only the first value of an `OMP_PROC_BIND` list is used
//! (nested parallel regions run inactive).

use crate::error::Error;
use crate::runtime::runtime;

/// `OMP_PROC_BIND`'s policies, with the numbers of `omp_proc_bind_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProcBind {
    /// Not bound (`false`, the default).
    #[default]
    False,
    /// Bound, places chosen by the runtime (`true`: as `close`).
    True,
    /// Every thread on the primary thread's place (`primary`, `master`).
    Primary,
    /// Consecutive threads on consecutive places.
    Close,
    /// Threads spread over the places.
    Spread,
}

impl ProcBind {
    /// Parses an `OMP_PROC_BIND` value: its first item (any case).
    pub fn parse(v: &str) -> Option<ProcBind> {
        let first = v.split(',').next()?.trim().to_ascii_lowercase();
        Some(match first.as_str() {
            "false" => ProcBind::False,
            "true" => ProcBind::True,
            "primary" | "master" => ProcBind::Primary,
            "close" => ProcBind::Close,
            "spread" => ProcBind::Spread,
            _ => return None,
        })
    }

    /// The `omp_proc_bind_t` value.
    pub fn code(self) -> i32 {
        match self {
            ProcBind::False => 0,
            ProcBind::True => 1,
            ProcBind::Primary => 2,
            ProcBind::Close => 3,
            ProcBind::Spread => 4,
        }
    }
}

/// How this process's workers are bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The policy applied.
    pub policy: ProcBind,
    /// The place list: each place's processors, ascending.
    pub places: Vec<Vec<usize>>,
    /// The place of each worker of this process.
    pub worker_place: Vec<usize>,
}

impl Binding {
    /// The binding of `workers` workers of process `rank` of `nprocs`, all
    /// with as many workers, under `policy` over the places `places_var`
    /// (`OMP_PLACES`; `None`: `threads`) of the processors `allowed`.
    /// `None` when `policy` is [`ProcBind::False`].
    pub fn new(
        policy: ProcBind,
        places_var: Option<&str>,
        allowed: &[usize],
        rank: usize,
        nprocs: usize,
        workers: usize,
    ) -> Result<Option<Binding>, Error> {
        if policy == ProcBind::False {
            return Ok(None);
        }
        let places = places(places_var, allowed)?;
        let worker_place = (0..workers)
            .map(|i| place_of(policy, rank * workers + i, nprocs * workers, places.len()))
            .collect();
        Ok(Some(Binding {
            policy,
            places,
            worker_place,
        }))
    }
}

/// The place (index in [`Binding::places`]) of the worker running the
/// caller, when the workers are bound and the caller runs on one.
pub fn place_num() -> Option<usize> {
    let b = runtime()?.binding.as_ref()?;
    b.worker_place
        .get(ct_worker::current_worker_index()?)
        .copied()
}

/// The place (index) of thread `t` of a team of `n` under `policy`, with
/// `p` places (OpenMP's rules, the primary thread on place 0).
pub fn place_of(policy: ProcBind, t: usize, n: usize, p: usize) -> usize {
    match policy {
        ProcBind::False | ProcBind::Primary => 0,
        // More threads than places: each place takes ⌊n/p⌋ or ⌈n/p⌉
        // consecutive threads; else one place per thread, consecutively
        // (close) or one per equal subpartition of the places (spread).
        _ if n > p => t * p / n,
        ProcBind::True | ProcBind::Close => t,
        ProcBind::Spread => t * p / n,
    }
}

/// The place list of `OMP_PLACES` (`None`: `threads`) over the processors
/// `allowed` (places without an allowed processor are left out).
pub fn places(var: Option<&str>, allowed: &[usize]) -> Result<Vec<Vec<usize>>, Error> {
    let bad = |why: &str| Error::Config(format!("OMP_PLACES={:?}: {why}", var.unwrap_or_default()));
    let spec = var.map_or("threads", str::trim);
    let lower = spec.to_ascii_lowercase();
    // An abstract name with an optional count: `cores(4)`.
    let (name, count) = match lower.split_once('(') {
        Some((name, rest)) => {
            let n = rest
                .strip_suffix(')')
                .and_then(|n| n.trim().parse::<usize>().ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| bad("the count in parentheses must be a positive number"))?;
            (name.trim(), Some(n))
        }
        None => (lower.as_str(), None),
    };
    let mut list = match name {
        "threads" => allowed.iter().map(|&c| vec![c]).collect(),
        "cores" => group_by(allowed, &["core_cpus_list", "thread_siblings_list"]),
        "sockets" => group_by(allowed, &["package_cpus_list", "core_siblings_list"]),
        _ if spec.starts_with('{') => explicit(spec, allowed).map_err(|why| bad(&why))?,
        _ => {
            return Err(bad(
                "use threads, cores or sockets (with an optional count), or a list of places \
                 such as {0,1},{2:2}",
            ));
        }
    };
    if let Some(n) = count {
        list.truncate(n);
    }
    if list.is_empty() {
        return Err(bad("no place holds a processor this process may run on"));
    }
    Ok(list)
}

/// The allowed processors grouped by the sysfs topology list named first
/// in `files` that exists (processors sharing a core or a socket); a
/// processor without one is a place of its own.
fn group_by(allowed: &[usize], files: &[&str]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for &c in allowed {
        let key = files
            .iter()
            .find_map(|f| {
                std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{c}/topology/{f}")).ok()
            })
            .map_or_else(|| format!("cpu{c}"), |s| s.trim().to_string());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(c),
            None => groups.push((key, vec![c])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// An explicit place list, `{0,1},{2:2},{4:2:2}`: places in braces, each a
/// list of processors or of intervals `first:length[:stride]`; kept to the
/// allowed processors.
fn explicit(spec: &str, allowed: &[usize]) -> Result<Vec<Vec<usize>>, String> {
    let num = |s: &str| {
        s.trim()
            .parse::<i64>()
            .map_err(|_| format!("{s:?} is not a number"))
    };
    let mut places = Vec::new();
    let mut rest = spec.trim();
    while !rest.is_empty() {
        let body_end = rest
            .strip_prefix('{')
            .and_then(|r| r.find('}'))
            .ok_or("a place is a list in braces, such as {0,1}")?;
        let body = &rest[1..=body_end];
        rest = rest[body_end + 2..].trim_start();
        if !rest.is_empty() {
            rest = rest
                .strip_prefix(',')
                .ok_or("places are separated by commas (repeating a place with :count:stride and ! are not supported)")?
                .trim_start();
        }
        let mut place = Vec::new();
        for item in body.split(',') {
            if item.contains('!') {
                return Err("excluding processors with ! is not supported".into());
            }
            let parts: Vec<&str> = item.split(':').collect();
            let (first, len, stride) = match parts[..] {
                [a] => (num(a)?, 1, 1),
                [a, l] => (num(a)?, num(l)?, 1),
                [a, l, s] => (num(a)?, num(l)?, num(s)?),
                _ => {
                    return Err(format!(
                        "{item:?} is not a processor or first:length[:stride]"
                    ));
                }
            };
            if first < 0 || len < 1 {
                return Err(format!(
                    "{item:?}: a processor number is at least 0, a length at least 1"
                ));
            }
            for k in 0..len {
                let c = first + k * stride;
                if c < 0 {
                    return Err(format!("{item:?} reaches below processor 0"));
                }
                let c = c as usize;
                if allowed.contains(&c) && !place.contains(&c) {
                    place.push(c);
                }
            }
        }
        if !place.is_empty() {
            place.sort_unstable();
            places.push(place);
        }
    }
    Ok(places)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_bind_values_parse_by_their_first_item_in_any_case() {
        assert_eq!(ProcBind::parse("close"), Some(ProcBind::Close));
        assert_eq!(ProcBind::parse(" SPREAD , close"), Some(ProcBind::Spread));
        assert_eq!(ProcBind::parse("master"), Some(ProcBind::Primary));
        assert_eq!(ProcBind::parse("primary"), Some(ProcBind::Primary));
        assert_eq!(ProcBind::parse("TRUE"), Some(ProcBind::True));
        assert_eq!(ProcBind::parse("false"), Some(ProcBind::False));
        assert_eq!(ProcBind::parse("yes"), None);
        assert_eq!(ProcBind::Spread.code(), 4);
        assert_eq!(ProcBind::False.code(), 0);
    }

    #[test]
    fn threads_are_placed_as_openmp_places_them() {
        let all = |policy, n, p| {
            (0..n)
                .map(|t| place_of(policy, t, n, p))
                .collect::<Vec<_>>()
        };
        assert_eq!(all(ProcBind::Close, 4, 8), [0, 1, 2, 3]);
        assert_eq!(all(ProcBind::True, 2, 2), [0, 1]);
        assert_eq!(all(ProcBind::Spread, 4, 8), [0, 2, 4, 6]);
        assert_eq!(all(ProcBind::Spread, 3, 8), [0, 2, 5]);
        assert_eq!(all(ProcBind::Close, 4, 2), [0, 0, 1, 1]);
        assert_eq!(all(ProcBind::Spread, 6, 4), [0, 0, 1, 2, 2, 3]);
        assert_eq!(all(ProcBind::Primary, 3, 4), [0, 0, 0]);
    }

    #[test]
    fn a_binding_places_each_process_workers_as_threads_of_one_team() {
        let b = Binding::new(ProcBind::Close, None, &[0, 1, 2, 3], 1, 2, 2)
            .unwrap()
            .unwrap();
        assert_eq!(b.places, [[0], [1], [2], [3]]);
        assert_eq!(b.worker_place, [2, 3]);
        assert_eq!(
            Binding::new(ProcBind::False, Some("nonsense"), &[0], 0, 1, 1).unwrap(),
            None
        );
    }

    #[test]
    fn place_lists_name_places_or_list_them() {
        let allowed = [0, 1, 2, 3, 4, 5];
        assert_eq!(places(None, &allowed).unwrap().len(), 6);
        assert_eq!(places(Some("threads(2)"), &allowed).unwrap(), [[0], [1]]);
        // Every processor of the process is in one core and one socket.
        for name in ["cores", "sockets"] {
            let mut seen: Vec<usize> = places(Some(name), &allowed).unwrap().concat();
            seen.sort_unstable();
            assert_eq!(seen, allowed, "{name}");
        }
        assert_eq!(
            places(Some("{0,1},{2:2},{1:3:2}"), &allowed).unwrap(),
            [vec![0, 1], vec![2, 3], vec![1, 3, 5]]
        );
        // Processors the process may not use are left out.
        assert_eq!(places(Some("{4:4}"), &allowed).unwrap(), [[4, 5]]);
        for bad in [
            "cores(0)",
            "numa_domains",
            "{0,1}:2:2",
            "{!0}",
            "{0",
            "{a}",
            "{0:0}",
            "{9}",
        ] {
            let e = places(Some(bad), &allowed).unwrap_err().to_string();
            assert!(e.contains("OMP_PLACES"), "{bad}: {e}");
        }
    }
}
