//! Flat elementwise work shared between threads: a cast, a narrowing copy,
//! a sum of two partial products. Each output element depends on the
//! input element at the same index only, so the parts can run anywhere.

/// Elements from which flat elementwise work is split between threads: the
/// threshold the casts, the narrowing and the split-K sums each had on
/// their own before they shared this helper.
pub(super) const SPLIT_ELEMENTWISE_FROM: usize = 1 << 16;

/// `each(input_part, output_part)` over equal parts of `input` and `out`
/// (of equal lengths): one part per thread of `threads` when there are
/// two or more and `out` holds at least [`SPLIT_ELEMENTWISE_FROM`]
/// elements, else the whole on this thread.
pub(super) fn zip_in_parts<A: Sync, B: Send>(
    input: &[A],
    out: &mut [B],
    threads: usize,
    each: impl Fn(&[A], &mut [B]) + Sync,
) {
    debug_assert_eq!(input.len(), out.len(), "one input element per output element");
    if threads > 1 && out.len() >= SPLIT_ELEMENTWISE_FROM {
        use rayon::prelude::*;
        let part = out.len().div_ceil(threads);
        input.par_chunks(part).zip(out.par_chunks_mut(part)).for_each(|(a, o)| each(a, o));
    } else {
        each(input, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long work split in parts on a pool of three threads (the last part
    /// shorter) writes every element once, as the whole would.
    #[test]
    fn parts_cover_every_element_once() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        for len in [0, 7, SPLIT_ELEMENTWISE_FROM - 1, SPLIT_ELEMENTWISE_FROM * 3 + 2] {
            let input: Vec<u64> = (0..len as u64).collect();
            let mut out = vec![0u64; len];
            pool.install(|| {
                zip_in_parts(&input, &mut out, 3, |a, o| o.iter_mut().zip(a).for_each(|(o, a)| *o += 2 * a + 1))
            });
            assert!(out.iter().enumerate().all(|(i, &o)| o == 2 * i as u64 + 1), "length {len}");
        }
    }
}
