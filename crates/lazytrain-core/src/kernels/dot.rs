//! Batched matmul kernels: a naive reference loop and the `gemm` crate.

use super::numeric::{FloatLike, Real};
use crate::storage::HostData;

/// The geometry of one batched matmul `[b, m, k] x [b, k, n]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DotDims {
    pub batch: usize,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub lhs_t: bool,
    pub rhs_t: bool,
}

impl DotDims {
    /// `(row stride, column stride)` of the left operand as an `m x k` matrix.
    fn lhs_strides(&self) -> (usize, usize) {
        if self.lhs_t {
            (1, self.m)
        } else {
            (self.k, 1)
        }
    }

    /// `(row stride, column stride)` of the right operand as a `k x n` matrix.
    fn rhs_strides(&self) -> (usize, usize) {
        if self.rhs_t {
            (1, self.k)
        } else {
            (self.n, 1)
        }
    }
}

/// Which matmul implementation runs `dot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernel {
    /// Triple loop with `f64` accumulation: the reference interpreter's oracle.
    Naive,
    /// The `gemm` crate's blocked SIMD kernels.
    Gemm,
}

fn naive_typed<T: FloatLike>(d: DotDims, a: &[T], b: &[T], o: &mut [T]) {
    let (ars, acs) = d.lhs_strides();
    let (brs, bcs) = d.rhs_strides();
    for bi in 0..d.batch {
        let (a, b) = (&a[bi * d.m * d.k..], &b[bi * d.k * d.n..]);
        let o = &mut o[bi * d.m * d.n..];
        for i in 0..d.m {
            for j in 0..d.n {
                let mut acc = 0f64;
                for p in 0..d.k {
                    acc += a[i * ars + p * acs].widen().to_f64() * b[p * brs + j * bcs].widen().to_f64();
                }
                o[i * d.n + j] = T::narrow(T::Math::from_f64(acc));
            }
        }
    }
}

fn gemm_native<T: Real + Send + Sync + 'static>(d: DotDims, a: &[T], b: &[T], o: &mut [T]) {
    if d.k == 0 {
        o.fill(T::ZERO);
        return;
    }
    let parallelism = matmul_parallelism(d.m * d.n * d.k);
    let threads = rayon::current_num_threads();
    if d.batch >= 2
        && threads > 1
        && matches!(parallelism, gemm::Parallelism::None)
        && d.batch * d.m * d.n * d.k >= 1 << 21
    {
        // Many small matrices (attention heads): split the batch between two
        // threads, each running its matrices one after another.
        let half = d.batch / 2;
        let (a1, a2) = a.split_at(half * d.m * d.k);
        let (b1, b2) = b.split_at(half * d.k * d.n);
        let (o1, o2) = o.split_at_mut(half * d.m * d.n);
        let first = DotDims { batch: half, ..d };
        let second = DotDims { batch: d.batch - half, ..d };
        rayon::join(|| gemm_serial(first, a1, b1, o1), || gemm_serial(second, a2, b2, o2));
        return;
    }
    gemm_batches(d, a, b, o, parallelism);
}

/// The matrices of `d` one after another on this thread.
fn gemm_serial<T: Real + 'static>(d: DotDims, a: &[T], b: &[T], o: &mut [T]) {
    gemm_batches(d, a, b, o, gemm::Parallelism::None);
}

fn gemm_batches<T: Real + 'static>(d: DotDims, a: &[T], b: &[T], o: &mut [T], parallelism: gemm::Parallelism) {
    let (ars, acs) = d.lhs_strides();
    let (brs, bcs) = d.rhs_strides();
    for bi in 0..d.batch {
        let a = &a[bi * d.m * d.k..(bi + 1) * d.m * d.k];
        let b = &b[bi * d.k * d.n..(bi + 1) * d.k * d.n];
        let o = &mut o[bi * d.m * d.n..(bi + 1) * d.m * d.n];
        // SAFETY: the slices hold exactly m*k, k*n and m*n elements and the
        // strides describe matrices inside them; `o` does not alias `a` or `b`.
        unsafe {
            gemm::gemm(
                d.m,
                d.n,
                d.k,
                o.as_mut_ptr(),
                1,
                d.n as isize,
                false,
                a.as_ptr(),
                acs as isize,
                ars as isize,
                b.as_ptr(),
                bcs as isize,
                brs as isize,
                T::ZERO,
                T::ONE,
                false,
                false,
                false,
                parallelism,
            );
        }
    }
}

/// Threads for one matmul: all cores for large products, one for small ones
/// (where starting threads costs more than it saves).
fn matmul_parallelism(flops: usize) -> gemm::Parallelism {
    static THREADS: std::sync::LazyLock<usize> =
        std::sync::LazyLock::new(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if *THREADS > 1 && flops >= 1 << 21 {
        gemm::Parallelism::Rayon(*THREADS)
    } else {
        gemm::Parallelism::None
    }
}

fn widen<T: FloatLike<Math = f32>>(v: &[T]) -> Vec<f32> {
    v.iter().map(|x| x.widen()).collect()
}

fn gemm_widened<T: FloatLike<Math = f32>>(d: DotDims, a: &[T], b: &[T], o: &mut [T]) {
    let mut out = vec![0f32; o.len()];
    gemm_native(d, &widen(a), &widen(b), &mut out);
    for (o, v) in o.iter_mut().zip(out) {
        *o = T::narrow(v);
    }
}

/// `out = lhs x rhs` with the given geometry.
pub(crate) fn dot(
    kernel: MatmulKernel,
    d: DotDims,
    a: &HostData,
    b: &HostData,
    out: &mut HostData,
) -> Result<(), String> {
    match (kernel, a, b, out) {
        (MatmulKernel::Naive, HostData::F32(a), HostData::F32(b), HostData::F32(o)) => naive_typed(d, a, b, o),
        (MatmulKernel::Naive, HostData::F64(a), HostData::F64(b), HostData::F64(o)) => naive_typed(d, a, b, o),
        (MatmulKernel::Naive, HostData::BF16(a), HostData::BF16(b), HostData::BF16(o)) => naive_typed(d, a, b, o),
        (MatmulKernel::Naive, HostData::F16(a), HostData::F16(b), HostData::F16(o)) => naive_typed(d, a, b, o),
        (MatmulKernel::Gemm, HostData::F32(a), HostData::F32(b), HostData::F32(o)) => gemm_native(d, a, b, o),
        (MatmulKernel::Gemm, HostData::F64(a), HostData::F64(b), HostData::F64(o)) => gemm_native(d, a, b, o),
        (MatmulKernel::Gemm, HostData::BF16(a), HostData::BF16(b), HostData::BF16(o)) => gemm_widened(d, a, b, o),
        (MatmulKernel::Gemm, HostData::F16(a), HostData::F16(b), HostData::F16(o)) => gemm_widened(d, a, b, o),
        (_, a, b, _) => return Err(format!("dot of {} and {}", a.dtype(), b.dtype())),
    }
    Ok(())
}
