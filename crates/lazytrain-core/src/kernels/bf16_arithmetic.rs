//! How the packed bf16 matmul (`dot_bf16`) multiplies on this CPU.
//!
//! AVX-512 BF16's `vdpbf16ps` multiplies a pair of bf16 values per f32 lane
//! and adds both products in one instruction. AMD's Zen 4 and Zen 5 run it
//! at the rate of an f32 FMA, so it does twice an FMA's work; Intel's cores
//! run it at half that rate (measured on an Emerald Rapids Xeon: 85 GFLOP/s
//! a core against 150–172 for f32 FMA), where bf16 products are faster
//! widened to f32 while they are packed and multiplied with FMA. The
//! packing, blocking and threading are the same either way. Intel cores
//! with AMX (Sapphire Rapids on) run `tdpbf16ps` on tiles instead
//! (`dot_amx`, measured 2.4 TFLOP/s a core on L1-resident tiles), once
//! Linux grants the process the tile state. The choice is made once per
//! process from the CPU's features, its vendor and the OS, so a machine
//! always computes the same bits.

use super::dot_bf16::{MR, NR};
use std::sync::OnceLock;

/// How bf16 products are multiplied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arithmetic {
    /// `vdpbf16ps` on pairs of `k` (AVX-512 BF16): each packed 32-bit word
    /// holds two bf16 values; sums rounded as the instruction rounds them.
    DotPairs,
    /// Values widened to f32 as they are packed, multiplied with
    /// `vfmadd231ps` (AVX-512 F): each packed word holds one f32; every
    /// product is exact and each addition rounded, as an f32 matmul.
    Fma,
    /// `tdpbf16ps` on AMX tiles (`dot_amx`): pairs of `k` packed as for
    /// [`Arithmetic::DotPairs`], 16 x 16 f32 products a tile; products
    /// exact, sums within f32 rounding of the f32 matmul's, denormals flushed.
    Tiles,
}

impl Arithmetic {
    /// Packed 32-bit words per pair of `k` per row (left operand) or column
    /// (right operand).
    pub(crate) fn words_per_pair(self) -> usize {
        match self {
            Arithmetic::DotPairs | Arithmetic::Tiles => 1,
            Arithmetic::Fma => 2,
        }
    }

    /// Every arithmetic this CPU can run (the tests run each, FMA wherever
    /// AVX-512 F is).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn supported() -> Vec<Arithmetic> {
        let (f, bf16) = features();
        let mut all = Vec::new();
        if f && amx() {
            all.push(Arithmetic::Tiles);
        }
        if f && bf16 {
            all.push(Arithmetic::DotPairs);
        }
        if f {
            all.push(Arithmetic::Fma);
        }
        all
    }
}

/// The arithmetic of this CPU's bf16 matmuls, or `None` without AVX-512
/// BF16 (bf16 products are then widened whole and run through `gemm`; on
/// this machine that measured no slower than [`Arithmetic::Fma`], so CPUs
/// with AVX-512 F alone keep it).
pub(crate) fn arithmetic() -> Option<Arithmetic> {
    static CHOICE: OnceLock<Option<Arithmetic>> = OnceLock::new();
    *CHOICE.get_or_init(|| match (features(), amx(), half_rate_dot()) {
        ((false, _), _, _) | ((true, false), _, _) => None,
        ((true, true), true, _) => Some(Arithmetic::Tiles),
        ((true, true), false, false) => Some(Arithmetic::DotPairs),
        ((true, true), false, true) => Some(Arithmetic::Fma),
    })
}

/// True when this process may run AMX tiles (asked of the CPU and the OS once).
fn amx() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(super::dot_amx::enable)
}

/// (AVX-512 F, AVX-512 BF16) on this CPU.
fn features() -> (bool, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        let f = std::is_x86_feature_detected!("avx512f");
        (f, f && std::is_x86_feature_detected!("avx512bf16"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (false, false)
    }
}

/// True on CPUs whose `vdpbf16ps` runs at half the f32 FMA rate: Intel's.
fn half_rate_dot() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0);
        let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx].iter().flat_map(|w| w.to_le_bytes()).collect();
        vendor == b"GenuineIntel"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `tile = A strip x B strip` over `pairs` pairs of `k` from operands packed
/// widened (`tile +=` when `accumulate`): for each `k`, [`MR`] f32 values of
/// the left strip, then [`NR`] of the right strip, consecutive.
///
/// # Safety
/// The CPU has AVX-512 F; `pairs * 2 * MR` values of `a` and
/// `pairs * 2 * NR` of `b` are in bounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn micro_kernel_fma(
    pairs: usize,
    a: *const u32,
    b: *const u32,
    tile: &mut [f32; MR * NR],
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    let (a, b) = (a as *const f32, b as *const f32);
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    if accumulate {
        for (r, row) in acc.iter_mut().enumerate() {
            row[0] = _mm512_loadu_ps(tile.as_ptr().add(r * NR));
            row[1] = _mm512_loadu_ps(tile.as_ptr().add(r * NR + 16));
        }
    }
    for q in 0..2 * pairs {
        let b0 = _mm512_loadu_ps(b.add(q * NR));
        let b1 = _mm512_loadu_ps(b.add(q * NR + 16));
        for (r, row) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(a.add(q * MR + r).read());
            row[0] = _mm512_fmadd_ps(av, b0, row[0]);
            row[1] = _mm512_fmadd_ps(av, b1, row[1]);
        }
    }
    for (r, row) in acc.iter().enumerate() {
        _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR), row[0]);
        _mm512_storeu_ps(tile.as_mut_ptr().add(r * NR + 16), row[1]);
    }
}

/// Off x86-64 [`arithmetic`] is `None` and nothing calls this.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn micro_kernel_fma(_: usize, _: *const u32, _: *const u32, _: &mut [f32; MR * NR], _: bool) {
    unreachable!("`arithmetic` is None off x86-64")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's choice is one this CPU supports: `vdpbf16ps` where it
    /// runs at full rate, FMA on Intel's half-rate one, else none.
    #[test]
    fn the_choice_is_supported_here() {
        let supported = Arithmetic::supported();
        if let Some(choice) = arithmetic() {
            assert!(supported.contains(&choice), "{choice:?} not in {supported:?}");
        }
        let expected = match (supported.contains(&Arithmetic::DotPairs), amx(), half_rate_dot()) {
            (false, _, _) => None,
            (true, true, _) => Some(Arithmetic::Tiles),
            (true, false, false) => Some(Arithmetic::DotPairs),
            (true, false, true) => Some(Arithmetic::Fma),
        };
        assert_eq!(arithmetic(), expected);
    }
}
