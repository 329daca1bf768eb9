//! GELU's programs (the erf form BERT uses) run as one AVX-512 loop per
//! tile instead of one loop per instruction.
//!
//! The forward program, `y = (x + b) (erf((x + b) / √2) + 1) / 2` (the
//! bias add of the product before it, usually run as its epilogue), and
//! the backward program, which computes the same CDF again instead of
//! reading it back and then `dx = g cdf + g (x + b) / 2 · e^{-u²} 2/√π / √2`
//! with `u = (x + b) / √2`, and the column sums of `dx` (the bias's
//! gradient), are recognised by their exact instructions, and so are their
//! bf16 forms under autocast (a feed-forward expansion stored in bf16, its
//! GELU and that GELU's gradient computed in f32 and rounded to bf16,
//! `encoder::expansion_activation` in `lazytrain-models`). Each tile's
//! inputs are still loaded by the interpreter's own loads (any access, in
//! place, chained), and its outputs stored by its own stores; the
//! arithmetic between them runs as one pass over the tile that keeps every
//! intermediate value in vector registers, where the interpreter makes one
//! pass per instruction through tile-sized registers in memory.
//!
//! The arithmetic is the interpreter's own, operation for operation and in
//! the same order (the same `erf` and `exp` bits, see
//! [`crate::kernels::numeric_avx512`]; no contracted multiply-adds), so the
//! results are the same bits (unit tests below).

use super::Instr::{self, Binary, ColumnSum, Load, RoundBf16, Store, Unary};
use super::Src::{Imm, Reg};
use crate::ir::{BinaryOp, UnaryOp};

/// `1/√2` as the traced GELU multiplies by it (an f64 constant in f32).
const FRAC_1_SQRT_2: f32 = std::f64::consts::FRAC_1_SQRT_2 as f32;
/// `2/√π`, erf's derivative at 0, as the traced gradient has it.
const FRAC_2_SQRT_PI: f32 = std::f64::consts::FRAC_2_SQRT_PI as f32;

/// Which GELU program a fused program is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Gelu {
    /// Loads `x` into register 0 and the bias into 1; stores `y` from
    /// register 1.
    Forward,
    /// Loads `x`, the bias and `g` into registers 0, 1 and 2; stores `dx`
    /// and its column sums from register 3.
    Backward,
    /// GELU of a value stored in bf16 (a feed-forward expansion under
    /// autocast, its bias already added), the output rounded to bf16: loads
    /// `x` into register 0; stores `y` from register 2.
    ForwardBf16,
    /// Its gradient, rounded to bf16: loads `x` and `g` into registers 0
    /// and 3; stores `dx` and its column sums from register 1.
    BackwardBf16,
}

impl Gelu {
    /// The GELU program `instrs` is, if it is one and this CPU runs the
    /// loops (AVX-512).
    pub(crate) fn recognise(instrs: &[Instr]) -> Option<Gelu> {
        #[cfg(target_arch = "x86_64")]
        let loops_run_here = crate::kernels::simd::avx512();
        #[cfg(not(target_arch = "x86_64"))]
        let loops_run_here = false;
        if !loops_run_here {
            None
        } else if instrs == forward() {
            Some(Gelu::Forward)
        } else if instrs == backward() {
            Some(Gelu::Backward)
        } else if instrs == forward_bf16() {
            Some(Gelu::ForwardBf16)
        } else if instrs == backward_bf16() {
            Some(Gelu::BackwardBf16)
        } else {
            None
        }
    }

    /// The instructions that load a tile's inputs into the registers
    /// [`Gelu::arithmetic`] reads, and those that store its outputs from
    /// the register it writes (the program's own).
    pub(crate) fn loads_and_stores(self) -> (&'static [Instr], &'static [Instr]) {
        const FORWARD_LOADS: [Instr; 2] = [Load { load: 0, dst: 0 }, Load { load: 1, dst: 1 }];
        const FORWARD_STORES: [Instr; 1] = [Store { src: 1, out: 0 }];
        const BACKWARD_LOADS: [Instr; 3] =
            [Load { load: 0, dst: 0 }, Load { load: 1, dst: 1 }, Load { load: 2, dst: 2 }];
        const BACKWARD_STORES: [Instr; 2] = [Store { src: 3, out: 0 }, ColumnSum { src: 3, out: 1 }];
        const FORWARD_BF16_LOADS: [Instr; 1] = [Load { load: 0, dst: 0 }];
        const FORWARD_BF16_STORES: [Instr; 1] = [Store { src: 2, out: 0 }];
        const BACKWARD_BF16_LOADS: [Instr; 2] = [Load { load: 0, dst: 0 }, Load { load: 1, dst: 3 }];
        const BACKWARD_BF16_STORES: [Instr; 2] = [Store { src: 1, out: 0 }, ColumnSum { src: 1, out: 1 }];
        match self {
            Gelu::Forward => (&FORWARD_LOADS, &FORWARD_STORES),
            Gelu::Backward => (&BACKWARD_LOADS, &BACKWARD_STORES),
            Gelu::ForwardBf16 => (&FORWARD_BF16_LOADS, &FORWARD_BF16_STORES),
            Gelu::BackwardBf16 => (&BACKWARD_BF16_LOADS, &BACKWARD_BF16_STORES),
        }
    }

    /// The arithmetic over the first `len` elements of the loaded
    /// registers, written into the register the stores read.
    pub(crate) fn arithmetic(self, regs: &mut [Vec<f32>], len: usize) {
        // SAFETY: `recognise` admits a program only on a CPU with AVX-512.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            match self {
                Gelu::Forward => {
                    let [x, bias, ..] = regs else { unreachable!("the forward program has three registers") };
                    lanes::forward(&x[..len], &mut bias[..len]);
                }
                Gelu::Backward => {
                    let [x, bias, g, dx, ..] = regs else { unreachable!("the backward program has five registers") };
                    lanes::backward(&x[..len], &bias[..len], &g[..len], &mut dx[..len]);
                }
                Gelu::ForwardBf16 => {
                    let [x, _, y, ..] = regs else { unreachable!("the bf16 forward program has three registers") };
                    lanes::forward_bf16(&x[..len], &mut y[..len]);
                }
                Gelu::BackwardBf16 => {
                    let [x, dx, _, g, ..] = regs else { unreachable!("the bf16 backward program has five registers") };
                    lanes::backward_bf16(&x[..len], &g[..len], &mut dx[..len]);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (regs, len);
    }
}

/// The loops, 16 lanes at a time (a last part under a mask).
#[cfg(target_arch = "x86_64")]
mod lanes {
    use super::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI};
    use crate::kernels::numeric_avx512::{each16, erf16, exp16, round_bf16_16};
    use std::arch::x86_64::*;

    /// `u = h / √2` and the CDF `(erf(u) + 1) / 2`.
    #[inline(always)]
    unsafe fn cdf(h: __m512) -> (__m512, __m512) {
        let u = _mm512_mul_ps(h, _mm512_set1_ps(FRAC_1_SQRT_2));
        (u, _mm512_mul_ps(_mm512_add_ps(erf16(u), _mm512_set1_ps(1.0)), _mm512_set1_ps(0.5)))
    }

    /// `h = x + b`, `u` and the CDF.
    #[inline(always)]
    unsafe fn biased_cdf(x: __m512, b: __m512) -> (__m512, __m512, __m512) {
        let h = _mm512_add_ps(x, b);
        let (u, cdf) = cdf(h);
        (h, u, cdf)
    }

    /// GELU's gradient at `h` (with its `u` and CDF) for the incoming `g`.
    #[inline(always)]
    unsafe fn gradient(h: __m512, u: __m512, cdf: __m512, g: __m512) -> __m512 {
        let through_cdf = _mm512_mul_ps(g, cdf);
        let half_gh = _mm512_mul_ps(_mm512_mul_ps(g, h), _mm512_set1_ps(0.5));
        let neg_square = _mm512_xor_ps(_mm512_mul_ps(u, u), _mm512_set1_ps(-0.0));
        let density = _mm512_mul_ps(exp16(neg_square), _mm512_set1_ps(FRAC_2_SQRT_PI));
        let through_density = _mm512_mul_ps(_mm512_mul_ps(half_gh, density), _mm512_set1_ps(FRAC_1_SQRT_2));
        _mm512_add_ps(through_cdf, through_density)
    }

    /// `bias_y[i] = gelu(x[i] + bias_y[i])`.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn forward(x: &[f32], bias_y: &mut [f32]) {
        each16(x.len(), |i, m| {
            let xv = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
            let bv = _mm512_maskz_loadu_ps(m, bias_y.as_ptr().add(i));
            let (h, _, cdf) = biased_cdf(xv, bv);
            _mm512_mask_storeu_ps(bias_y.as_mut_ptr().add(i), m, _mm512_mul_ps(h, cdf));
        });
    }

    /// `dx[i]`: the gradient of `gelu(x + bias)` for the incoming `g`.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn backward(x: &[f32], bias: &[f32], g: &[f32], dx: &mut [f32]) {
        each16(x.len(), |i, m| {
            let xv = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
            let bv = _mm512_maskz_loadu_ps(m, bias.as_ptr().add(i));
            let gv = _mm512_maskz_loadu_ps(m, g.as_ptr().add(i));
            let (h, u, cdf) = biased_cdf(xv, bv);
            _mm512_mask_storeu_ps(dx.as_mut_ptr().add(i), m, gradient(h, u, cdf, gv));
        });
    }

    /// `y[i] = gelu(x[i])` rounded to bf16.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn forward_bf16(x: &[f32], y: &mut [f32]) {
        each16(x.len(), |i, m| {
            let h = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
            let (_, cdf) = cdf(h);
            _mm512_mask_storeu_ps(y.as_mut_ptr().add(i), m, round_bf16_16(_mm512_mul_ps(h, cdf)));
        });
    }

    /// `dx[i]`: the gradient of `gelu(x)` for the incoming `g`, rounded to bf16.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn backward_bf16(x: &[f32], g: &[f32], dx: &mut [f32]) {
        each16(x.len(), |i, m| {
            let h = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
            let gv = _mm512_maskz_loadu_ps(m, g.as_ptr().add(i));
            let (u, cdf) = cdf(h);
            _mm512_mask_storeu_ps(dx.as_mut_ptr().add(i), m, round_bf16_16(gradient(h, u, cdf, gv)));
        });
    }
}

/// `dst = a op b` over registers and constants.
fn binary(op: BinaryOp, a: super::Src, b: super::Src, dst: usize) -> Instr {
    Binary { op, a, b, dst }
}

/// The first instructions of both programs: `h = x + b` in register 2,
/// `u = h / √2` in 1 and the CDF in 0.
fn cdf_of_biased() -> [Instr; 7] {
    use BinaryOp::{Add, Mul};
    [
        Load { load: 0, dst: 0 },
        Load { load: 1, dst: 1 },
        binary(Add, Reg(0), Reg(1), 2),
        binary(Mul, Reg(2), Imm(FRAC_1_SQRT_2), 1),
        Unary { op: UnaryOp::Erf, src: 1, dst: 0 },
        binary(Add, Reg(0), Imm(1.0), 1),
        binary(Mul, Reg(1), Imm(0.5), 0),
    ]
}

/// The bf16 forward program as the CPU backend builds it: the CDF of
/// register 0 in 2, `y` rounded into 2.
fn forward_bf16() -> Vec<Instr> {
    use BinaryOp::{Add, Mul};
    vec![
        Load { load: 0, dst: 0 },
        binary(Mul, Reg(0), Imm(FRAC_1_SQRT_2), 1),
        Unary { op: UnaryOp::Erf, src: 1, dst: 2 },
        binary(Add, Reg(2), Imm(1.0), 1),
        binary(Mul, Reg(1), Imm(0.5), 2),
        binary(Mul, Reg(0), Reg(2), 1),
        RoundBf16 { src: 1, dst: 2 },
        Store { src: 2, out: 0 },
    ]
}

/// The bf16 backward program as the CPU backend builds it: `u` in 1, the
/// CDF in 2, `g` in 3, `dx` rounded into 1.
fn backward_bf16() -> Vec<Instr> {
    use BinaryOp::{Add, Mul};
    vec![
        Load { load: 0, dst: 0 },
        binary(Mul, Reg(0), Imm(FRAC_1_SQRT_2), 1),
        Unary { op: UnaryOp::Erf, src: 1, dst: 2 },
        binary(Add, Reg(2), Imm(1.0), 3),
        binary(Mul, Reg(3), Imm(0.5), 2),
        Load { load: 1, dst: 3 },
        binary(Mul, Reg(3), Reg(2), 4),
        binary(Mul, Reg(3), Reg(0), 2),
        binary(Mul, Reg(2), Imm(0.5), 0),
        binary(Mul, Reg(1), Reg(1), 2),
        Unary { op: UnaryOp::Neg, src: 2, dst: 1 },
        Unary { op: UnaryOp::Exp, src: 1, dst: 2 },
        binary(Mul, Reg(2), Imm(FRAC_2_SQRT_PI), 1),
        binary(Mul, Reg(0), Reg(1), 2),
        binary(Mul, Reg(2), Imm(FRAC_1_SQRT_2), 1),
        binary(Add, Reg(4), Reg(1), 2),
        RoundBf16 { src: 2, dst: 1 },
        Store { src: 1, out: 0 },
        ColumnSum { src: 1, out: 1 },
    ]
}

/// The forward program as the CPU backend builds it (registers allocated).
fn forward() -> Vec<Instr> {
    let mut instrs = cdf_of_biased().to_vec();
    instrs.extend([binary(BinaryOp::Mul, Reg(2), Reg(0), 1), Store { src: 1, out: 0 }]);
    instrs
}

/// The backward program as the CPU backend builds it (registers allocated).
fn backward() -> Vec<Instr> {
    use BinaryOp::{Add, Mul};
    let mut instrs = cdf_of_biased().to_vec();
    // The CDF's last step writes register 3 here, not 1 (still live: `u`).
    instrs[5] = binary(Add, Reg(0), Imm(1.0), 3);
    instrs[6] = binary(Mul, Reg(3), Imm(0.5), 0);
    instrs.extend([
        Load { load: 2, dst: 3 },
        binary(Mul, Reg(3), Reg(0), 4),
        Load { load: 2, dst: 0 },
        binary(Mul, Reg(0), Reg(2), 3),
        binary(Mul, Reg(3), Imm(0.5), 2),
        binary(Mul, Reg(1), Reg(1), 3),
        Unary { op: UnaryOp::Neg, src: 3, dst: 1 },
        Unary { op: UnaryOp::Exp, src: 1, dst: 3 },
        binary(Mul, Reg(3), Imm(FRAC_2_SQRT_PI), 1),
        binary(Mul, Reg(2), Reg(1), 3),
        binary(Mul, Reg(3), Imm(FRAC_1_SQRT_2), 1),
        binary(Add, Reg(4), Reg(1), 3),
        Store { src: 3, out: 0 },
        ColumnSum { src: 3, out: 1 },
    ]);
    instrs
}
