//! A small, fast per-worker random number generator for victim selection
//! (xorshift64*; not for anything that needs real randomness).

use core::cell::Cell;

/// xorshift64* state.
#[derive(Debug)]
pub(crate) struct Rng(Cell<u64>);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        // Mix the seed so that workers 0, 1, 2 … start far apart; never zero.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng(Cell::new((z ^ (z >> 31)) | 1))
    }

    /// A value in `0..n` (`n > 0`).
    #[inline]
    pub(crate) fn below(&self, n: usize) -> usize {
        let mut x = self.0.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0.set(x);
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (((r >> 32) * n as u64) >> 32) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn covers_range_roughly_uniformly() {
        let r = Rng::new(7);
        let mut counts = [0u32; 5];
        for _ in 0..50_000 {
            counts[r.below(5)] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
        assert_eq!(Rng::new(1).below(1), 0);
    }
}
