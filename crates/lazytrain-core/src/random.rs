//! Counter-based random numbers: Philox-4x32 with 10 rounds (Salmon et al.,
//! "Parallel random numbers: as easy as 1, 2, 3", SC'11).
//!
//! Element `i` of a draw depends only on `(seed, stream, i)`, so masks are
//! reproducible, independent of thread count, and need no state between steps.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// One Philox-4x32-10 block: four 32-bit outputs for a 128-bit counter and a 64-bit key.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let p0 = (M0 as u64) * (c[0] as u64);
        let p1 = (M1 as u64) * (c[2] as u64);
        c = [((p1 >> 32) as u32) ^ c[1] ^ k[0], p1 as u32, ((p0 >> 32) as u32) ^ c[3] ^ k[1], p0 as u32];
    }
    c
}

/// Fill `out` with uniform floats in `[0, 1)`: element `i` uses word `i % 4`
/// of the block with counter `(i / 4, stream)`, keyed by `seed`.
pub fn uniform_f32(seed: u64, stream: u64, out: &mut [f32]) {
    uniform_f32_from(seed, stream, 0, out);
}

/// Elements `first..first + out.len()` of the draw [`uniform_f32`] makes,
/// so a draw can be split between threads or computed tile by tile.
/// (Never inlined: compiled for AVX2, as it would be inside the fused
/// kernels, the rounds vectorise into code three times slower.)
#[inline(never)]
pub fn uniform_f32_from(seed: u64, stream: u64, first: usize, out: &mut [f32]) {
    let key = [seed as u32, (seed >> 32) as u32];
    let block = |b: usize| {
        let b = b as u64;
        philox4x32_10([b as u32, (b >> 32) as u32, stream as u32, (stream >> 32) as u32], key)
    };
    // A start inside a block takes that block's remaining words first.
    let skip = first % 4;
    let lead = ((4 - skip) % 4).min(out.len());
    let (head, rest) = out.split_at_mut(lead);
    if lead > 0 {
        head.iter_mut().zip(&block(first / 4)[skip..]).for_each(|(o, &w)| *o = unit_float(w));
    }
    let mut b = first.div_ceil(4);
    let mut whole = rest.chunks_exact_mut(4);
    for chunk in &mut whole {
        let words = block(b);
        for w in 0..4 {
            chunk[w] = unit_float(words[w]);
        }
        b += 1;
    }
    let tail = whole.into_remainder();
    tail.iter_mut().zip(block(b)).for_each(|(o, w)| *o = unit_float(w));
}

/// The float of a Philox word: its top 24 bits over 2^24.
#[inline(always)]
fn unit_float(w: u32) -> f32 {
    // Below 2^24, so the signed conversion (one instruction) is exact.
    ((w >> 8) as i32) as f32 * (1.0 / (1u32 << 24) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known-answer vectors from Random123's kat_vectors file (philox4x32 10).
    #[test]
    fn philox_known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(
            philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn uniform_is_in_range_and_mean_half() {
        let mut v = vec![0f32; 10_000];
        uniform_f32(7, 0, &mut v);
        assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        let mut w = vec![0f32; 10_000];
        uniform_f32(7, 1, &mut w);
        assert_ne!(v, w);
        let mut tail = vec![0f32; 6_000];
        uniform_f32_from(7, 0, 4_000, &mut tail);
        assert_eq!(tail, v[4_000..], "a split draw equals the whole one");
        for (start, len) in [(4_001, 3), (4_002, 7), (3, 1), (9_995, 5), (1, 77), (36, 64)] {
            let mut part = vec![0f32; len];
            uniform_f32_from(7, 0, start, &mut part);
            assert_eq!(part, v[start..start + len], "a draw from element {start}");
        }
    }
}
