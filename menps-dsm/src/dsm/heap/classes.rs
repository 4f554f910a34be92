//! Size classes and allocation-bitmap arithmetic.

/// Largest chunk size.
pub const MAX_CHUNK_SIZE: usize = 1 << 20;

/// The small-object size classes, in bytes: 16, 32, then `2^k` and
/// `1.5 · 2^k` up to 128 KiB. Every class is a multiple of 16, so every small
/// object is 16-byte aligned (and aligned to the largest power of two
/// dividing its class).
pub const SIZE_CLASSES: [usize; 26] = size_classes();

const fn size_classes() -> [usize; 26] {
    let mut c = [0usize; 26];
    c[0] = 16;
    c[1] = 32;
    let mut i = 2;
    let mut p = 32;
    while i < 26 {
        c[i] = p + p / 2;
        c[i + 1] = 2 * p;
        p *= 2;
        i += 2;
    }
    c
}

/// Smallest size class (the bitmap granularity).
const MIN_CLASS: usize = SIZE_CLASSES[0];

/// Largest small object for chunks of `chunk` bytes.
pub(crate) fn max_small(chunk: usize) -> usize {
    (chunk / 8).min(SIZE_CLASSES[SIZE_CLASSES.len() - 1])
}

/// Chunk size of a heap of `heap_size` bytes: the largest power of two that
/// divides it, at most [`MAX_CHUNK_SIZE`].
pub(crate) fn chunk_size_for(heap_size: usize) -> usize {
    1 << heap_size
        .trailing_zeros()
        .min(MAX_CHUNK_SIZE.trailing_zeros())
}

/// The smallest size class of at most `max_small` bytes that holds `size`
/// bytes aligned to `align` (a power of two), if any.
pub(crate) fn class_index(size: usize, align: usize, max_small: usize) -> Option<usize> {
    SIZE_CLASSES
        .iter()
        .take_while(|&&c| c <= max_small)
        .position(|&c| c >= size && c.is_multiple_of(align))
}

/// Words of one chunk's allocation bitmap (one bit per smallest-class slot).
pub(crate) fn bitmap_words(chunk: usize) -> usize {
    (chunk / MIN_CLASS).div_ceil(64)
}

/// Bitmap word and bit mask of slot `slot`.
pub(crate) fn bit_of(slot: usize) -> (usize, u64) {
    (slot / 64, 1u64 << (slot % 64))
}

/// The lowest clear bit of `word` below `limit` (≤ 64), if any.
pub(crate) fn first_clear_bit(word: u64, limit: usize) -> Option<usize> {
    let b = (!word).trailing_zeros() as usize;
    (b < limit).then_some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_geometric_and_aligned() {
        assert_eq!(SIZE_CLASSES[..6], [16, 32, 48, 64, 96, 128]);
        assert_eq!(SIZE_CLASSES[25], 128 * 1024);
        for w in SIZE_CLASSES.windows(2) {
            assert!(w[0] < w[1]);
            // At most 50 % larger than the previous class.
            assert!(w[1] * 2 <= w[0] * 3 + 32, "{w:?}");
        }
        for c in SIZE_CLASSES {
            assert!(c.is_multiple_of(16), "{c}");
        }
    }

    #[test]
    fn class_selection_respects_size_alignment_and_limit() {
        let max = max_small(1 << 20);
        assert_eq!(max, 128 * 1024);
        let size_of = |i: Option<usize>| i.map(|i| SIZE_CLASSES[i]);
        assert_eq!(size_of(class_index(1, 1, max)), Some(16));
        assert_eq!(size_of(class_index(16, 8, max)), Some(16));
        assert_eq!(size_of(class_index(17, 8, max)), Some(32));
        assert_eq!(size_of(class_index(33, 16, max)), Some(48));
        // 48 is not 32-aligned: the next class that is.
        assert_eq!(size_of(class_index(33, 32, max)), Some(64));
        assert_eq!(size_of(class_index(65, 64, max)), Some(128));
        assert_eq!(size_of(class_index(100_000, 8, max)), Some(128 * 1024));
        assert_eq!(class_index(128 * 1024 + 1, 8, max), None);
        // Small chunks lower the limit.
        assert_eq!(max_small(4096), 512);
        assert_eq!(class_index(513, 8, 512), None);
        assert_eq!(size_of(class_index(512, 512, 512)), Some(512));
        for size in 1..5000 {
            for align in [1, 2, 8, 16, 32, 64, 256] {
                if let Some(i) = class_index(size, align, max) {
                    let c = SIZE_CLASSES[i];
                    assert!(c >= size && c.is_multiple_of(align));
                    // No smaller class would do.
                    assert!(
                        SIZE_CLASSES[..i]
                            .iter()
                            .all(|&d| d < size || !d.is_multiple_of(align))
                    );
                }
            }
        }
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(chunk_size_for(1 << 30), 1 << 20);
        assert_eq!(chunk_size_for(3 << 20), 1 << 20);
        assert_eq!(chunk_size_for(12 * 1024), 4096);
        assert_eq!(chunk_size_for(96 * 1024), 32 * 1024);
        assert_eq!(bitmap_words(1 << 20), 1024);
        assert_eq!(bitmap_words(4096), 4);
    }

    #[test]
    fn bitmap_math() {
        assert_eq!(bit_of(0), (0, 1));
        assert_eq!(bit_of(63), (0, 1 << 63));
        assert_eq!(bit_of(64), (1, 1));
        assert_eq!(bit_of(130), (2, 4));
        assert_eq!(first_clear_bit(0, 64), Some(0));
        assert_eq!(first_clear_bit(0b1011, 64), Some(2));
        assert_eq!(first_clear_bit(u64::MAX, 64), None);
        assert_eq!(first_clear_bit(0b0111, 3), None);
        assert_eq!(first_clear_bit(0b0111, 4), Some(3));
        assert_eq!(first_clear_bit(u64::MAX >> 1, 64), Some(63));
    }
}
