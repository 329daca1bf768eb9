//! The CPU's f32 multiply-add throughput: the ceiling no f32 matmul can
//! pass, measured rather than read from a datasheet.
//!
//! Each thread runs twelve independent chains of vector fused multiply-adds
//! in registers (the widest vectors the CPU has: 16 lanes with AVX-512, 8
//! with AVX2 and FMA), enough to keep every FMA unit busy, with no memory
//! traffic. On an AMD Zen 4 (AVX-512 on 256-bit units) 512-bit and 256-bit
//! vectors reach the same rate; on CPUs with 512-bit units the 512-bit
//! chains reach twice the 256-bit rate, as a matmul kernel using them can.

use std::time::Instant;

/// Independent accumulator chains per thread: more than FMA latency times
/// FMA units on current x86 cores (4 × 2).
const CHAINS: usize = 12;
/// Multiply-adds per chain in one measurement (about a millisecond).
const ROUNDS: usize = 1 << 18;
/// Measurements taken, a millisecond's pause apart, of which the best is
/// kept: spread over some 40 ms, so that a host that takes a core away for
/// a few milliseconds (seen on a 2-core virtual machine: five back-to-back
/// measurements all read one core's rate) does not halve the ceiling.
const TRIALS: usize = 20;

/// The f32 FMA throughput of `threads` threads together, in GFLOP/s (a
/// multiply-add counts as two FLOPs): the best of [`TRIALS`] short
/// measurements, each timing the threads' chains from the first thread's
/// start to the last thread's end (as the threads themselves see them: the
/// spawning thread may not get a core while they run). Threads of their
/// own, not a rayon pool's: the caller may be running inside a pool
/// narrower than the machine. On CPUs without AVX2 and FMA the chains are
/// scalar, and the result only a lower bound of the units' rate.
pub fn fma_peak_gflops(threads: usize) -> f64 {
    let threads = threads.max(1);
    (0..TRIALS)
        .map(|trial| {
            if trial > 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let start = std::sync::Barrier::new(threads);
            let runs: Vec<(Instant, Instant, f64)> = std::thread::scope(|scope| {
                let workers: Vec<_> = (0..threads)
                    .map(|_| {
                        scope.spawn(|| {
                            start.wait();
                            let began = Instant::now();
                            let flops = fma_chains(ROUNDS);
                            (began, Instant::now(), flops)
                        })
                    })
                    .collect();
                workers.into_iter().filter_map(|w| w.join().ok()).collect()
            });
            let first = runs.iter().map(|r| r.0).min();
            let last = runs.iter().map(|r| r.1).max();
            let flops: f64 = runs.iter().map(|r| r.2).sum();
            match first.zip(last) {
                Some((first, last)) => flops / (last - first).as_secs_f64().max(1e-9) / 1e9,
                None => 0.0,
            }
        })
        .fold(0.0, f64::max)
}

/// Run [`CHAINS`] chains of `rounds` vector multiply-adds on this thread;
/// the FLOPs done.
fn fma_chains(rounds: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if super::simd::avx512() {
            // SAFETY: AVX-512 F was detected on this CPU.
            return unsafe { x86::chains_avx512(rounds) };
        }
        if super::simd::avx2() {
            // SAFETY: AVX2 and FMA were detected on this CPU.
            return unsafe { x86::chains_avx2(rounds) };
        }
    }
    chains_scalar(rounds)
}

/// The portable chains: one lane each.
fn chains_scalar(rounds: usize) -> f64 {
    let mut acc = [0.5f32; CHAINS];
    let (x, y) = std::hint::black_box((0.999_999_9f32, 1e-7f32));
    for _ in 0..rounds {
        for a in &mut acc {
            *a = a.mul_add(x, y);
        }
    }
    std::hint::black_box(acc);
    (2 * CHAINS * rounds) as f64
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CHAINS;
    use std::arch::x86_64::*;

    /// [`CHAINS`] chains of 16-lane multiply-adds.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn chains_avx512(rounds: usize) -> f64 {
        let mut acc = [_mm512_set1_ps(0.5); CHAINS];
        let (x, y) = std::hint::black_box((_mm512_set1_ps(0.999_999_9), _mm512_set1_ps(1e-7)));
        for _ in 0..rounds {
            for a in &mut acc {
                *a = _mm512_fmadd_ps(*a, x, y);
            }
        }
        std::hint::black_box(acc);
        (2 * 16 * CHAINS * rounds) as f64
    }

    /// [`CHAINS`] chains of 8-lane multiply-adds.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn chains_avx2(rounds: usize) -> f64 {
        let mut acc = [_mm256_set1_ps(0.5); CHAINS];
        let (x, y) = std::hint::black_box((_mm256_set1_ps(0.999_999_9), _mm256_set1_ps(1e-7)));
        for _ in 0..rounds {
            for a in &mut acc {
                *a = _mm256_fmadd_ps(*a, x, y);
            }
        }
        std::hint::black_box(acc);
        (2 * 8 * CHAINS * rounds) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::gemm::{gemm_into, GemmOperand};

    /// The best of `runs` timings of `f`, in seconds.
    fn best_seconds(runs: usize, mut f: impl FnMut()) -> f64 {
        (0..runs)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min)
    }

    /// A matmul on one thread cannot outrun one thread's FMA units: the
    /// probe's rate bounds `gemm`'s (with a margin for a noisy machine).
    /// A probe that counted too few FLOPs per instruction would fail here,
    /// one that counted too many or let the compiler drop its chains the
    /// other bound.
    #[test]
    fn no_matmul_outruns_the_probe() {
        let n = 512;
        let a = vec![0.25f32; n * n];
        let b = vec![0.5f32; n * n];
        let mut c = vec![0f32; n * n];
        let gemm_seconds = best_seconds(20, || {
            // SAFETY: whole row-major `n x n` buffers.
            unsafe {
                gemm_into(
                    (n, n, n),
                    GemmOperand { ptr: a.as_ptr(), rs: n, cs: 1 },
                    GemmOperand { ptr: b.as_ptr(), rs: n, cs: 1 },
                    &mut c,
                    gemm::Parallelism::None,
                )
            }
        });
        assert_eq!(c[0], 0.125 * n as f32);
        let gemm_rate = 2.0 * (n * n * n) as f64 / gemm_seconds;
        let rounds = 1 << 14;
        let mut flops = 0.0;
        let probe_seconds = best_seconds(20, || flops = fma_chains(rounds));
        let probe_rate = flops / probe_seconds;
        assert!(gemm_rate <= 1.1 * probe_rate, "gemm {gemm_rate:.3e} FLOP/s, probe {probe_rate:.3e}");
        // Nor does the probe count FLOPs it did not do: optimised `gemm`
        // reaches well over a third of the FMA units' rate on a product this
        // size (with debug assertions it runs at a fraction of its speed).
        if !cfg!(debug_assertions) {
            assert!(probe_rate <= 3.0 * gemm_rate, "gemm {gemm_rate:.3e} FLOP/s, probe {probe_rate:.3e}");
        }
    }
}
