//! XOR diff merging with write-write race detection (Endo 2020 §3.5.4,
//! Table 3.1), and the changed-run finder of the fixed-home policy.
//!
//! Three versions of a block take part: `twin` (the base version this
//! process started writing from), `data` (this process's working copy) and
//! `other` (the latest version from elsewhere). This process's changes are
//! `data ^ twin`, the other side's `other ^ twin`; the merged block is
//! `other ^ data ^ twin`. A byte changed by both sides is a write-write race:
//! the merge reports the first one (granularity: bytes, the smallest unit a
//! program can write without racing with its neighbours).
//!
//! The loops work on 64-bit words and compile to SIMD. They need exclusive
//! access to the buffers they write (callers protect the block first or work
//! on blocks the application cannot touch), except [`write_merge`]'s `data`
//! for a pinned block (a call stack, a block several processes write in
//! turn), which this process's threads may write meanwhile.

use core::sync::atomic::{AtomicU64, Ordering};

/// Where a merge found both sides changing the same byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Race {
    /// Byte offset of the first racing byte in the block.
    pub offset: usize,
    /// The aligned word around it in the base version.
    pub base: u64,
    /// The word in this process's copy.
    pub local: u64,
    /// The word in the other version.
    pub remote: u64,
}

const LO7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
const HI1: u64 = 0x8080_8080_8080_8080;

/// The high bit of every byte of `x` that is non-zero.
#[inline(always)]
fn nonzero_bytes(x: u64) -> u64 {
    (((x & LO7).wrapping_add(LO7)) | x) & HI1
}

/// Words per chunk of the race-checking loops (a race is looked up only in
/// the chunk that has one).
const CHUNK: usize = 64;

#[inline(always)]
fn words(len: usize) -> usize {
    debug_assert_eq!(len % 8, 0);
    len / 8
}

fn find_race(twin: &[u64], data: &[u64], other: &[u64], from: usize) -> Race {
    for i in from..twin.len() {
        let (t, d, o) = (twin[i], data[i], other[i]);
        let both = nonzero_bytes(d ^ t) & nonzero_bytes(o ^ t);
        if both != 0 {
            let byte = (both.trailing_zeros() / 8) as usize;
            return Race {
                offset: i * 8 + byte,
                base: t,
                local: d,
                remote: o,
            };
        }
    }
    unreachable!("find_race called on a chunk without a race")
}

/// A merge of `data` (base `twin`) with another version: [`write_merge`]
/// or [`read_merge`].
pub type MergeFn = fn(&mut [u64], &mut [u64], &[u64], bool) -> Result<Merged, Race>;

/// What a merge found besides races.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Merged {
    /// Whether this process had changed anything (`data != twin`).
    pub local_changes: bool,
    /// Whether the other version had changed anything (`other != twin`).
    pub remote_changes: bool,
}

/// Checks one chunk (`range`) of the three versions before it is merged:
/// returns the first race if both sides changed a byte in the chunk.
#[inline(always)]
fn check_chunk(
    data: &[u64],
    twin: &[u64],
    other: &[u64],
    range: core::ops::Range<usize>,
) -> Result<(), Race> {
    let mut race = 0u64;
    for i in range.clone() {
        let (d, t, o) = (data[i], twin[i], other[i]);
        race |= nonzero_bytes(d ^ t) & nonzero_bytes(o ^ t);
    }
    if race != 0 {
        return Err(find_race(twin, data, other, range.start));
    }
    Ok(())
}

/// For a merge that goes on past races: if `data` and `other` both changed
/// a byte since `twin`, returns a copy of `other` in which every such byte
/// has the base's value (the other side's change dropped, so the merge
/// keeps ours), and one [`Race`] per racing word. `None` without races.
pub fn keep_ours(data: &[u64], twin: &[u64], other: &[u64]) -> Option<(Vec<u64>, Vec<Race>)> {
    let n = data.len();
    assert!(twin.len() == n && other.len() == n);
    let racing = |i: usize| nonzero_bytes(data[i] ^ twin[i]) & nonzero_bytes(other[i] ^ twin[i]);
    let first = (0..n).find(|&i| racing(i) != 0)?;
    let mut fixed = other.to_vec();
    let mut races = Vec::new();
    for i in first..n {
        let both = racing(i);
        if both == 0 {
            continue;
        }
        races.push(Race {
            offset: i * 8 + (both.trailing_zeros() / 8) as usize,
            base: twin[i],
            local: data[i],
            remote: other[i],
        });
        // 0x80 per racing byte -> 0xff per racing byte.
        let bytes = (both >> 7) * 0xff;
        fixed[i] = (other[i] & !bytes) | (twin[i] & bytes);
    }
    Some((fixed, races))
}

/// The chunks of `n` words the merges work on.
fn chunks(n: usize) -> impl Iterator<Item = core::ops::Range<usize>> {
    (0..n).step_by(CHUNK).map(move |s| s..(s + CHUNK).min(n))
}

/// Write-merge: `data = twin = other ^ data ^ twin` (this process's changes
/// applied on top of `other`, which becomes the new base).
///
/// Other threads of this process may write `data` meanwhile (a pinned
/// block): each word is read once, atomically, and what the merge found
/// there is both what it counts as this process's change
/// ([`Merged::local_changes`]) and what it takes into the twin, so a store
/// made during the merge is either announced with it or stays pending
/// against the new twin — never lost.
///
/// Returns the first race if `detect` and both sides changed a byte; the
/// buffers are then partly merged (the DSM stops after a race).
pub fn write_merge(
    data: &mut [u64],
    twin: &mut [u64],
    other: &[u64],
    detect: bool,
) -> Result<Merged, Race> {
    merge_words(data, twin, other, detect, |data, twin, other| {
        // Only words the other side changed are rewritten in `data`, and
        // each with one atomic xor, so a word (or another byte of a word)
        // this process is writing concurrently — a pinned call stack's live
        // frame — is never overwritten with an older value.
        let t = *twin;
        let r = other ^ t;
        // SAFETY: `data` is a valid, aligned word; other threads of this
        // process may store to it concurrently, so it is accessed
        // atomically here.
        let w = unsafe { AtomicU64::from_ptr(data) };
        // The word as this merge found it: what it counts as our change and
        // takes into the twin is exactly that (a store landing after it
        // stays a pending change against the new twin).
        let found = if r != 0 {
            w.fetch_xor(r, Ordering::Relaxed)
        } else {
            w.load(Ordering::Relaxed)
        };
        *twin = found ^ r;
        found ^ t
    })
}

/// [`write_merge`] for a copy nobody else writes meanwhile (its
/// application view is write-protected, and the runtime writes it only
/// under the block's entry lock, which the caller holds): plain stores,
/// which the compiler vectorizes, instead of one atomic read-modify-write
/// per word the other side changed (a `lock cmpxchg` loop each: two thirds
/// of a merge's time in CG's falsely shared blocks).
pub fn write_merge_exclusive(
    data: &mut [u64],
    twin: &mut [u64],
    other: &[u64],
    detect: bool,
) -> Result<Merged, Race> {
    merge_words(data, twin, other, detect, |data, twin, other| {
        let t = *twin;
        let found = *data;
        let m = found ^ (other ^ t);
        *data = m;
        *twin = m;
        found ^ t
    })
}

/// Read-merge: `data = other ^ data ^ twin`, `twin = other` (the other
/// version is taken in, this process's changes stay pending against the new
/// base).
pub fn read_merge(
    data: &mut [u64],
    twin: &mut [u64],
    other: &[u64],
    detect: bool,
) -> Result<Merged, Race> {
    merge_words(data, twin, other, detect, |data, twin, o| {
        let t = *twin;
        let found = *data;
        let r = o ^ t;
        if r != 0 {
            *data = found ^ r;
        }
        *twin = o;
        found ^ t
    })
}

/// The walk the merges make: chunk by chunk, checks for races (if
/// `detect`), then calls `word(data[i], twin[i], other[i])` for each word
/// of the chunk, which merges the word and returns this process's change in
/// it as it found it (`data ^ twin` before the merge). Inlined into each
/// merge, so the per-word step is compiled into the loop.
#[inline(always)]
fn merge_words(
    data: &mut [u64],
    twin: &mut [u64],
    other: &[u64],
    detect: bool,
    mut word: impl FnMut(&mut u64, &mut u64, u64) -> u64,
) -> Result<Merged, Race> {
    let n = data.len();
    assert!(twin.len() == n && other.len() == n);
    let mut changed = 0u64;
    let mut remote = 0u64;
    for range in chunks(n) {
        if detect {
            check_chunk(data, twin, other, range.clone())?;
        }
        for i in range {
            remote |= other[i] ^ twin[i];
            changed |= word(&mut data[i], &mut twin[i], other[i]);
        }
    }
    Ok(Merged {
        local_changes: changed != 0,
        remote_changes: remote != 0,
    })
}

/// Whether `a` and `b` hold the same words: a chunk at a time, each word
/// read once and the differences folded together (the loop compiles to
/// SIMD), stopping at the first chunk that differs.
///
/// A release compares a copy with its twin while other threads of this
/// process may write the copy and another process's relaxed atomic may
/// rewrite a word of both, so `==` on the slices is not used: it calls
/// `memcmp`, whose vector loop finds the first differing byte and then
/// loads it again from both buffers to return their difference; if the
/// word changed in between (an atomic had updated the copy and not yet the
/// twin), the reloaded bytes are equal and `memcmp` reports the blocks
/// equal however much else differs — an idle release then announced
/// nothing, and the process's writes to the block were lost to its readers.
///
/// (Eight lanes of differences, folded at the end of each chunk, with AVX2
/// where the processor has it: about 60 ns for a 4 KiB block in the cache
/// where `memcmp` takes 40, and as fast as it for one that left the cache,
/// which idle releases mostly compare.)
pub fn same(a: &[u64], b: &[u64]) -> bool {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2 (checked just now).
        return unsafe { same_avx2(a, b) };
    }
    same_words(a, b)
}

/// [`same_words`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn same_avx2(a: &[u64], b: &[u64]) -> bool {
    same_words(a, b)
}

/// The loop of [`same`] (`a` and `b` of one length).
#[inline(always)]
fn same_words(a: &[u64], b: &[u64]) -> bool {
    let (mut ca, mut cb) = (a.chunks_exact(CHUNK), b.chunks_exact(CHUNK));
    for (x, y) in (&mut ca).zip(&mut cb) {
        let mut lanes = [0u64; 8];
        for (p, q) in x.chunks_exact(8).zip(y.chunks_exact(8)) {
            for i in 0..8 {
                lanes[i] |= p[i] ^ q[i];
            }
        }
        if lanes.iter().fold(0, |acc, l| acc | l) != 0 {
            return false;
        }
    }
    ca.remainder()
        .iter()
        .zip(cb.remainder())
        .fold(0, |acc, (p, q)| acc | (p ^ q))
        == 0
}

/// The maximal runs of bytes where `a` and `b` differ, as `(offset, len)`,
/// byte-exact (so writing them touches no byte that did not change).
pub fn changed_runs(a: &[u64], b: &[u64], out: &mut Vec<(usize, usize)>) {
    out.clear();
    let n = a.len();
    assert_eq!(b.len(), n);
    let mut run: Option<(usize, usize)> = None;
    let mut i = 0;
    while i < n {
        let x = a[i] ^ b[i];
        if x == 0 {
            if let Some(r) = run.take() {
                out.push(r);
            }
            i += 1;
            continue;
        }
        let mask = nonzero_bytes(x);
        if mask == HI1 {
            // The whole word changed.
            match &mut run {
                Some((_, len)) => *len += 8,
                None => run = Some((i * 8, 8)),
            }
        } else {
            for byte in 0..8 {
                let at = i * 8 + byte;
                if mask & (0x80 << (8 * byte)) != 0 {
                    match &mut run {
                        Some((_, len)) => *len += 1,
                        None => run = Some((at, 1)),
                    }
                } else if let Some(r) = run.take() {
                    out.push(r);
                }
            }
        }
        i += 1;
    }
    if let Some(r) = run {
        out.push(r);
    }
}

/// Writes into the words at `dst` those of `new` that differ from them,
/// each with one volatile store, and leaves the others unwritten: a thread
/// of this process reading a word that did not change sees no store to it.
/// Compared eight words at a time (plain loads, which the compiler may
/// widen), which costs about a memory comparison where little changed.
///
/// # Safety
///
/// `dst` must be 8-byte aligned and valid for reads and writes of
/// `new.len()` words, and no other thread may write them meanwhile (others
/// may read them).
pub unsafe fn write_changed(dst: *mut u64, new: &[u64]) {
    const CHUNK: usize = 8;
    let mut at = 0;
    for chunk in new.chunks(CHUNK) {
        // SAFETY: words `at .. at + chunk.len()` at `dst` (the caller's
        // contract); read as a copy, so no reference to them is held while
        // they are written below.
        let differ = chunk
            .iter()
            .enumerate()
            .any(|(i, &v)| unsafe { dst.add(at + i).read() != v });
        if differ {
            for (i, &v) in chunk.iter().enumerate() {
                // SAFETY: as above; volatile, so that the compiler neither
                // merges nor widens the stores over words that did not
                // change.
                unsafe {
                    let p = dst.add(at + i);
                    if p.read_volatile() != v {
                        p.write_volatile(v);
                    }
                }
            }
        }
        at += chunk.len();
    }
}

/// Copies a clean block's copy at `data` into its twin at `twin` (`words`
/// words) while another process may be applying a DSM atomic to both: an
/// atomic run at this process's copy (we are the block's last writer, or
/// its fixed home) writes the copy and then the twin, under the block's
/// global lock, which a write fault making the twin does not hold. A plain
/// copy that read a word before such an atomic and stored it after the
/// atomic's twin write left the twin with the old value: our next release
/// took the atomic's result for our own write (a write-write race with the
/// process that ran it, or its result published twice).
///
/// So the copy is followed by a pass that settles every word: it reads the
/// twin word, then the copy's, and moves the twin to the copy's value with a
/// compare-exchange until it reads them equal. An atomic in flight (copy
/// written, twin not yet) writes the same value into the twin itself; one
/// that starts later keeps the two equal; a twin word the atomic wrote after
/// our read makes our compare-exchange fail and the word is read again.
///
/// # Safety
///
/// `data` and `twin` must be 8-byte aligned and valid for reads (and `twin`
/// for writes) of `words` words, and no thread of this process may write
/// either meanwhile (other processes may, with 8-byte atomic stores to the
/// same word of both, copy first).
pub unsafe fn copy_to_twin(data: *mut u64, twin: *mut u64, words: usize) {
    // SAFETY: the caller's contract; the words are 8-byte aligned, so each
    // of the other process's stores is seen whole.
    unsafe { core::ptr::copy_nonoverlapping(data, twin, words) };
    settle_twin(data, twin, words);
}

/// The settling pass of [`copy_to_twin`].
fn settle_twin(data: *mut u64, twin: *mut u64, words: usize) {
    for i in 0..words {
        // SAFETY: word `i` of both blocks (`copy_to_twin`'s contract); the
        // other process accesses them with aligned 8-byte stores, so atomic
        // accesses here are sound.
        let (d, t) = unsafe {
            (
                AtomicU64::from_ptr(data.add(i)),
                AtomicU64::from_ptr(twin.add(i)),
            )
        };
        loop {
            // The twin first: equal values read in this order mean no
            // atomic finished between the two reads with the twin left
            // behind.
            let tv = t.load(Ordering::Acquire);
            let dv = d.load(Ordering::Acquire);
            if tv == dv {
                break;
            }
            // Success or failure, read again: the copy may have moved on.
            let _ = t.compare_exchange(tv, dv, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

/// Views `len` bytes at `p` as words.
///
/// # Safety
/// `p` must be 8-byte aligned and valid for reads (and writes, if the result
/// is written) of `len` bytes, with no other access while the slice lives.
#[allow(clippy::mut_from_ref)]
pub unsafe fn words_mut<'a>(p: *mut u8, len: usize) -> &'a mut [u64] {
    debug_assert_eq!(p as usize % 8, 0);
    // SAFETY: per the function's contract.
    unsafe { core::slice::from_raw_parts_mut(p.cast::<u64>(), words(len)) }
}

#[cfg(test)]
mod keep_ours_tests {
    use super::*;

    #[test]
    fn racing_bytes_keep_our_value_and_others_merge() {
        let twin = [0u64, 0x1111, 0x2222, 0];
        // Word 1: both changed byte 0; word 2: disjoint bytes; word 3: only theirs.
        let data = [0u64, 0x11aa, 0x2222 | 0xff_0000, 0];
        let other = [0u64, 0x11bb, 0x2233, 0x7];
        assert!(
            keep_ours(&twin, &twin, &other).is_none(),
            "no local change, no race"
        );
        let (fixed, races) = keep_ours(&data, &twin, &other).expect("a race");
        assert_eq!(races.len(), 1);
        assert_eq!(races[0].offset, 8);
        assert_eq!((races[0].local, races[0].remote), (0x11aa, 0x11bb));
        let (mut d, mut t) = (data, twin);
        write_merge(&mut d, &mut t, &fixed, true).expect("no race left");
        assert_eq!(d, [0, 0x11aa, 0xff_2233, 0x7]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A twin copied while another thread applies atomics to the copy and
    /// the twin (copy first), as a process running an atomic at our copy
    /// does, ends equal to the copy. The copy taken before the atomics and
    /// stored after them (a preempted `memcpy`) is what the settling pass
    /// repairs: without it the twin keeps the stale words.
    #[test]
    fn twin_copied_during_remote_atomics_settles() {
        use std::sync::atomic::AtomicBool;
        const WORDS: usize = 512;
        for round in 0..200u64 {
            let data: Vec<AtomicU64> = (0..WORDS as u64).map(AtomicU64::new).collect();
            let twin: Vec<AtomicU64> = (0..WORDS as u64).map(AtomicU64::new).collect();
            // The stale copy a preempted copy would store.
            let stale: Vec<u64> = data.iter().map(|w| w.load(Ordering::Relaxed)).collect();
            let go = AtomicBool::new(false);
            std::thread::scope(|s| {
                s.spawn(|| {
                    // The other process: atomics one after another (the
                    // global lock serialises them), copy first, then twin.
                    // The first half's words are not touched again: only
                    // the settling pass can repair their stale twin words.
                    for k in 0..4000u64 {
                        let w = ((k * 7 + round) % 16 + if k > 2000 { 16 } else { 0 }) as usize;
                        let v = data[w].fetch_add(1, Ordering::AcqRel) + 1;
                        twin[w].store(v, Ordering::Release);
                        if k == 2000 {
                            go.store(true, Ordering::Release);
                        }
                    }
                });
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                // The preempted copy's stores land now, then the pass runs
                // while the atomics go on.
                for (t, &v) in twin.iter().zip(&stale) {
                    t.store(v, Ordering::Relaxed);
                }
                settle_twin(data.as_ptr() as *mut u64, twin.as_ptr() as *mut u64, WORDS);
            });
            for (i, (d, t)) in data.iter().zip(&twin).enumerate() {
                assert_eq!(
                    d.load(Ordering::Relaxed),
                    t.load(Ordering::Relaxed),
                    "round {round}: word {i} of the twin left behind"
                );
            }
        }
    }

    /// A block whose words 8 and 9 differ from its twin is never found
    /// equal to it while another thread applies atomics to word 0 of the
    /// copy and then of the twin, as a process running a relaxed DSM atomic
    /// at our copy does. (`==` on the slices, i.e. `memcmp`, reported such
    /// blocks equal now and then: it reloads the first differing byte.)
    #[test]
    fn same_is_not_fooled_by_atomics_on_an_earlier_word() {
        use std::sync::atomic::AtomicBool;
        const WORDS: usize = 512;
        let data: Vec<AtomicU64> = (0..WORDS).map(|_| AtomicU64::new(0)).collect();
        let twin: Vec<AtomicU64> = (0..WORDS).map(|_| AtomicU64::new(0)).collect();
        data[8].store(24, Ordering::Relaxed);
        data[9].store(12, Ordering::Relaxed);
        let stop = AtomicBool::new(false);
        let mut wrong = 0;
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    k += 1;
                    data[0].store(k, Ordering::Relaxed);
                    twin[0].store(k, Ordering::Relaxed);
                }
            });
            // SAFETY: both vectors outlive the scope; the views are only
            // read, as a release reads a copy other threads may write (a
            // word read while it changes may hold either value).
            let (d, t) = unsafe {
                (
                    core::slice::from_raw_parts(data.as_ptr().cast::<u64>(), WORDS),
                    core::slice::from_raw_parts(twin.as_ptr().cast::<u64>(), WORDS),
                )
            };
            for _ in 0..200_000 {
                if same(core::hint::black_box(d), core::hint::black_box(t)) {
                    wrong += 1;
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert_eq!(
            wrong, 0,
            "a copy with two changed words was found equal to its twin"
        );
        let mut b = vec![7u64; 100];
        assert!(same(&b, &b.clone()));
        for i in [0, 63, 64, 99] {
            let a = b.clone();
            b[i] ^= 1 << 40;
            assert!(!same(&a, &b), "word {i}");
            b[i] ^= 1 << 40;
        }
    }

    fn block(n: usize, f: impl Fn(usize) -> u8) -> Vec<u64> {
        let bytes: Vec<u8> = (0..n).map(f).collect();
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// `write_changed` writes the words that differ and no other: the
    /// unchanged half lies on a read-only page, where a store would fault.
    #[test]
    fn write_changed_stores_only_changed_words() {
        const PAGE: usize = 4096;
        // SAFETY: a fresh private anonymous mapping of two pages, unmapped
        // at the end; nothing else uses it.
        unsafe {
            let p = libc::mmap(
                core::ptr::null_mut(),
                2 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let w = p.cast::<u64>();
            let n = 2 * PAGE / 8;
            for i in 0..n {
                w.add(i).write(i as u64);
            }
            assert_eq!(libc::mprotect(p.byte_add(PAGE), PAGE, libc::PROT_READ), 0);
            // The first page changes in every third word; the second not.
            let new: Vec<u64> = (0..n)
                .map(|i| {
                    if i < PAGE / 8 && i % 3 == 0 {
                        !(i as u64)
                    } else {
                        i as u64
                    }
                })
                .collect();
            write_changed(w, &new);
            for (i, &v) in new.iter().enumerate() {
                assert_eq!(w.add(i).read(), v, "word {i}");
            }
            assert_eq!(libc::munmap(p, 2 * PAGE), 0);
        }
    }

    fn bytes(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn nonzero_bytes_marks_exactly_nonzero_bytes() {
        assert_eq!(nonzero_bytes(0), 0);
        assert_eq!(nonzero_bytes(0x0100), 0x8000);
        assert_eq!(nonzero_bytes(0x80), 0x80);
        assert_eq!(nonzero_bytes(u64::MAX), HI1);
        assert_eq!(
            nonzero_bytes(0x01_00_00_00_00_00_00_7f),
            0x80_00_00_00_00_00_00_80
        );
    }

    #[test]
    fn write_merge_combines_disjoint_changes() {
        let n = 4096;
        let twin = block(n, |i| (i % 251) as u8);
        let mut data = twin.clone();
        let mut other = twin.clone();
        // Local changes the even 8-byte stripes, remote the odd ones.
        let (mut d, mut o) = (bytes(&data), bytes(&other));
        for i in 0..n {
            if (i / 8) % 2 == 0 {
                d[i] = d[i].wrapping_add(1);
            } else {
                o[i] = o[i].wrapping_add(2);
            }
        }
        data = block(n, |i| d[i]);
        other = block(n, |i| o[i]);
        for merge in [write_merge as MergeFn, write_merge_exclusive] {
            let (mut data, mut t) = (data.clone(), twin.clone());
            let m = merge(&mut data, &mut t, &other, true).unwrap();
            assert!(m.local_changes && m.remote_changes);
            let merged = bytes(&data);
            for i in 0..n {
                let want = if (i / 8) % 2 == 0 { d[i] } else { o[i] };
                assert_eq!(merged[i], want, "byte {i}");
            }
            assert_eq!(t, data);
        }
        // Without local changes the other version is taken whole.
        let (mut data, mut t) = (twin.clone(), twin.clone());
        let m = write_merge_exclusive(&mut data, &mut t, &other, true).unwrap();
        assert!(!m.local_changes && m.remote_changes);
        assert_eq!(data, other);
        assert_eq!(t, other);
        // Nothing changed on the other side: ours kept, and said so.
        for merge in [write_merge as MergeFn, write_merge_exclusive, read_merge] {
            let (mut d2, mut t) = (data.clone(), twin.clone());
            d2[3] ^= 0xff;
            let m = merge(&mut d2, &mut t, &twin, true).unwrap();
            assert!(m.local_changes && !m.remote_changes);
            assert_eq!(d2[3], data[3] ^ 0xff);
        }
    }

    #[test]
    fn byte_granular_race_is_found() {
        let twin = vec![0u64; 512];
        let mut data = twin.clone();
        let mut other = twin.clone();
        // Same word, different bytes: not a race.
        data[10] = 0x00ff;
        other[10] = 0xff00;
        let mut t = twin.clone();
        let mut d = data.clone();
        assert!(write_merge(&mut d, &mut t, &other, true).is_ok());
        assert_eq!(d[10], 0xffff);
        // Same byte, different bits: a race (the merged byte would be
        // neither write).
        data[300] = 0x01 << 16;
        other[300] = 0x02 << 16;
        let mut t = twin.clone();
        let mut d = data.clone();
        let r = write_merge(&mut d, &mut t, &other, true).unwrap_err();
        assert_eq!(r.offset, 300 * 8 + 2);
        assert_eq!(r.local, 0x01 << 16);
        assert_eq!(r.remote, 0x02 << 16);
        // Without detection the merge goes through.
        let mut t = twin.clone();
        let mut d = data.clone();
        assert!(write_merge(&mut d, &mut t, &other, false).is_ok());
    }

    #[test]
    fn read_merge_keeps_local_diff_pending() {
        let twin = vec![1u64; 64];
        let mut data = twin.clone();
        data[3] = 7;
        let mut other = twin.clone();
        other[5] = 9;
        let mut t = twin.clone();
        read_merge(&mut data, &mut t, &other, true).unwrap();
        assert_eq!(data[3], 7);
        assert_eq!(data[5], 9);
        assert_eq!(t, other);
        // The pending diff is exactly the local change.
        let diff: Vec<usize> = (0..64).filter(|&i| data[i] != t[i]).collect();
        assert_eq!(diff, vec![3]);
    }

    #[test]
    fn runs_are_byte_exact() {
        let a = vec![0u64; 8];
        let mut b = a.clone();
        b[0] = 0x00_00_ff_00; // byte 1
        b[1] = u64::MAX; // bytes 8..16
        b[2] = 0xff; // byte 16
        b[5] = 0xff << 56; // byte 47
        let mut runs = Vec::new();
        changed_runs(&a, &b, &mut runs);
        assert_eq!(runs, vec![(1, 1), (8, 9), (47, 1)]);
        changed_runs(&a, &a, &mut runs);
        assert!(runs.is_empty());
    }
}
