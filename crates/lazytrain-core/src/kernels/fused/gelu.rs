//! GELU's programs (the erf form BERT uses) run as one AVX-512 loop over
//! their operands instead of one loop per instruction.
//!
//! The forward program, `y = (x + b) (erf((x + b) / √2) + 1) / 2` (the
//! bias add of the product before it, usually run as its epilogue), and
//! the backward program, which computes the same CDF again instead of
//! reading it back and then `dx = g cdf + g (x + b) / 2 · e^{-u²} 2/√π / √2`
//! with `u = (x + b) / √2`, and the column sums of `dx` (the bias's
//! gradient), are recognised by their exact instructions, and so are their
//! bf16 forms under autocast (a feed-forward expansion stored in bf16, its
//! GELU and that GELU's gradient computed in f32 and rounded to bf16,
//! `encoder::expansion_activation` in `lazytrain-models`). When the
//! operands lie in plain buffers (contiguous inputs and output of the
//! program's dtype, an f32 bias one row broadcast down the rows:
//! the kernels of a BERT step), the loop reads and writes them in place
//! ([`Direct`]); otherwise each tile's inputs are loaded by the
//! interpreter's own loads (any access, chained) and its outputs stored by
//! its own stores, and the arithmetic between them runs as one pass over
//! the tile. Either way every intermediate value stays in vector
//! registers, where the interpreter makes one pass per instruction through
//! tile-sized registers in memory.
//!
//! The arithmetic is the interpreter's own, operation for operation and in
//! the same order (the same `erf` and `exp` bits, see
//! [`crate::kernels::numeric_avx512`]; no contracted multiply-adds), so the
//! results are the same bits (unit tests below).

use super::Instr::{self, Binary, ColumnSum, Load, RoundBf16, Store, Unary};
use super::Src::{Imm, Reg};
use super::{FusedProgram, OutView, Source};
use crate::ir::{BinaryOp, UnaryOp};
use crate::schedule::Access;
#[cfg(test)]
use crate::schedule::Load as LoadSpec;
use crate::storage::HostData;

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
    /// [`Gelu::ForwardBf16`] with the bias add before it (a bf16 product's
    /// epilogue under autocast): loads the product `x` into register 0 and
    /// the bias into 1; stores `h = x + b` rounded to bf16 (the expansion
    /// its gradient reads) from register 1 and `y = gelu(h)` rounded from 0.
    ForwardBf16Biased,
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
        } else if instrs == forward_bf16_biased() {
            Some(Gelu::ForwardBf16Biased)
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
        const FORWARD_BF16_BIASED_STORES: [Instr; 2] = [Store { src: 1, out: 0 }, Store { src: 0, out: 1 }];
        match self {
            Gelu::Forward => (&FORWARD_LOADS, &FORWARD_STORES),
            Gelu::Backward => (&BACKWARD_LOADS, &BACKWARD_STORES),
            Gelu::ForwardBf16 => (&FORWARD_BF16_LOADS, &FORWARD_BF16_STORES),
            Gelu::BackwardBf16 => (&BACKWARD_BF16_LOADS, &BACKWARD_BF16_STORES),
            Gelu::ForwardBf16Biased => (&FORWARD_LOADS, &FORWARD_BF16_BIASED_STORES),
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
                    // The bias register is read and overwritten in place.
                    let bias_y = bias[..len].as_mut_ptr();
                    lanes::forward_in_place(x[..len].as_ptr(), bias_y, bias_y, len);
                }
                Gelu::Backward => {
                    let [x, bias, g, dx, ..] = regs else { unreachable!("the backward program has five registers") };
                    let (x, bias, g, dx) = (&x[..len], &bias[..len], &g[..len], &mut dx[..len]);
                    lanes::backward_in_place(x.as_ptr(), bias.as_ptr(), g.as_ptr(), dx.as_mut_ptr(), len);
                }
                Gelu::ForwardBf16 => {
                    let [x, _, y, ..] = regs else { unreachable!("the bf16 forward program has three registers") };
                    lanes::forward_bf16(&x[..len], &mut y[..len]);
                }
                Gelu::BackwardBf16 => {
                    let [x, dx, _, g, ..] = regs else { unreachable!("the bf16 backward program has five registers") };
                    lanes::backward_bf16(&x[..len], &g[..len], &mut dx[..len]);
                }
                Gelu::ForwardBf16Biased => {
                    let [x_y, bias_h, ..] = regs else { unreachable!("the biased program has three registers") };
                    lanes::forward_bf16_biased(&mut x_y[..len], &mut bias_h[..len]);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (regs, len);
    }
}

/// A GELU program's operands where they are: the loop reads its inputs and
/// writes its output directly, a run of one row at a time, instead of
/// copying each tile into the interpreter's registers and its result out
/// of them. Half the time of BERT-small's GELU kernels went to those
/// copies (the tiles' loads and stores against the arithmetic, timed in
/// the step). The loop reads steady streams and asks for them 2 KiB ahead
/// ([`crate::kernels::simd::prefetch_ahead`]: the hardware prefetchers
/// alone left the gradient loop waiting on its loads on an Intel Xeon).
/// The values and the column sums' order are the tile path's, so the bits
/// are too (tests below).
pub(crate) struct Direct<'a> {
    /// Which program.
    gelu: Gelu,
    /// Elements per row (the bias's length; a run never crosses a row).
    row_len: usize,
    /// The column sums' length (backward): the trailing elements summed
    /// over the leading ones, a multiple of `row_len`.
    column_len: usize,
    /// The operands.
    operands: Operands<'a>,
}

/// The operands of [`Direct`], each read or written at every element but
/// the bias.
enum Operands<'a> {
    /// [`Gelu::Forward`] and [`Gelu::Backward`]: the product `x`, the bias
    /// (one row, broadcast down the rows), the incoming gradient `g`
    /// (backward; null forward), and `y` or `dx`.
    F32 { x: *const f32, bias: &'a [f32], g: *const f32, out: *mut f32 },
    /// [`Gelu::ForwardBf16`] and [`Gelu::BackwardBf16`]: the stored
    /// expansion `x`, `g` (backward; null forward) and `y` or `dx`, bf16
    /// words.
    Bf16 { x: *const u16, g: *const u16, out: *mut u16 },
    /// [`Gelu::ForwardBf16Biased`]: the bf16 product `x`, the f32 bias (one
    /// row, broadcast down the rows), and the bf16 outputs `h` and `y`.
    Bf16Biased { x: *const u16, bias: &'a [f32], h: *mut u16, y: *mut u16 },
}

/// Where a contiguous load reads: f32 or bf16 elements.
#[derive(Clone, Copy)]
enum Elements {
    F32(*const f32),
    Bf16(*const u16),
}

impl Gelu {
    /// The operands of `program` (this GELU program) in place when every
    /// input is contiguous (f32 for the f32 programs, bf16 for the bf16
    /// ones) but a bias (of the f32 programs and the biased bf16 one), one
    /// f32 row broadcast down the rows, and the outputs have the program's
    /// dtypes (otherwise the tile path runs it). `outs` are the program's
    /// output views, each checked to hold its output.
    pub(crate) fn bind_direct<'a>(
        self,
        program: &FusedProgram,
        inputs: &[Source<'a>],
        outs: &[OutView],
    ) -> Option<Direct<'a>> {
        let (loads, shape) = (&program.loads, &program.shape);
        let (row_len, numel) = (*shape.last()?, shape.iter().product::<usize>());
        let column_len = match self {
            Gelu::Forward | Gelu::ForwardBf16 | Gelu::ForwardBf16Biased => 0,
            Gelu::Backward | Gelu::BackwardBf16 => match program.column_len {
                0 => return None,
                len if row_len > 0 && len % row_len == 0 => len,
                _ => return None,
            },
        };
        let contiguous = |k: usize| -> Option<Elements> {
            let load = loads.get(k)?;
            match (&load.access, inputs.get(load.input)?) {
                (Access::Contiguous, Source::Data(HostData::F32(x))) if x.len() >= numel => {
                    Some(Elements::F32(x.as_ptr()))
                }
                (Access::Contiguous, Source::Data(HostData::BF16(x))) if x.len() >= numel => {
                    Some(Elements::Bf16(x.as_ptr().cast()))
                }
                (Access::Contiguous, Source::Output(o)) => match outs.get(*o)? {
                    OutView::F32(p) => Some(Elements::F32(p.cast_const())),
                    OutView::BF16(p) => Some(Elements::Bf16(p.cast_const().cast())),
                    OutView::Bool(_) => None,
                },
                (Access::Contiguous | Access::Splat | Access::Strided(_), _) => None,
            }
        };
        let f32s = |k| match contiguous(k)? {
            Elements::F32(p) => Some(p),
            Elements::Bf16(_) => None,
        };
        let bf16s = |k| match contiguous(k)? {
            Elements::Bf16(p) => Some(p),
            Elements::F32(_) => None,
        };
        let bias = || match (&loads.get(1)?.access, inputs.get(loads.get(1)?.input)?) {
            (Access::Strided(strides), Source::Data(HostData::F32(b)))
                if strides.split_last().is_some_and(|(&last, rest)| last == 1 && rest.iter().all(|&s| s == 0))
                    && b.len() >= row_len =>
            {
                Some(&b[..row_len])
            }
            _ => None,
        };
        let operands = match self {
            Gelu::Forward | Gelu::Backward => {
                let OutView::F32(out) = *outs.first()? else { return None };
                let g = if self == Gelu::Backward { f32s(2)? } else { std::ptr::null() };
                Operands::F32 { x: f32s(0)?, bias: bias()?, g, out }
            }
            Gelu::ForwardBf16 | Gelu::BackwardBf16 => {
                let OutView::BF16(out) = *outs.first()? else { return None };
                let g = if self == Gelu::BackwardBf16 { bf16s(1)? } else { std::ptr::null() };
                Operands::Bf16 { x: bf16s(0)?, g, out: out.cast() }
            }
            Gelu::ForwardBf16Biased => {
                let (OutView::BF16(h), OutView::BF16(y)) = (*outs.first()?, *outs.get(1)?) else { return None };
                Operands::Bf16Biased { x: bf16s(0)?, bias: bias()?, h: h.cast(), y: y.cast() }
            }
        };
        Some(Direct { gelu: self, row_len, column_len, operands })
    }
}

impl Direct<'_> {
    /// Elements `start..end`, and (backward) their column sums added into
    /// `columns[1]` row by row, as the tile path adds them.
    ///
    /// # Safety
    /// This thread owns elements `start..end` of the output, and every
    /// input holds them.
    #[cfg(target_arch = "x86_64")]
    pub(crate) unsafe fn run(&self, start: usize, end: usize, columns: &mut [Vec<f64>]) {
        let mut at = start;
        while at < end {
            let column = at % self.row_len;
            let len = (self.row_len - column).min(end - at);
            // Within the column sums' length, a multiple of the row's.
            let sum_at = if self.column_len > 0 { at % self.column_len } else { 0 };
            match (self.gelu, &self.operands) {
                (Gelu::Forward, &Operands::F32 { x, bias, out, .. }) => {
                    lanes::forward_in_place(x.add(at), bias.as_ptr().add(column), out.add(at), len)
                }
                (Gelu::Backward, &Operands::F32 { x, bias, g, out }) => {
                    lanes::backward_in_place(x.add(at), bias.as_ptr().add(column), g.add(at), out.add(at), len);
                    let dx = std::slice::from_raw_parts(out.add(at), len);
                    columns[1][sum_at..sum_at + len].iter_mut().zip(dx).for_each(|(a, &v)| *a += f64::from(v));
                }
                (Gelu::ForwardBf16, &Operands::Bf16 { x, out, .. }) => {
                    lanes::forward_bf16_in_place(x.add(at), out.add(at), len)
                }
                (Gelu::BackwardBf16, &Operands::Bf16 { x, g, out }) => {
                    lanes::backward_bf16_in_place(x.add(at), g.add(at), out.add(at), len);
                    let dx = std::slice::from_raw_parts(out.add(at), len);
                    columns[1][sum_at..sum_at + len]
                        .iter_mut()
                        .zip(dx)
                        .for_each(|(a, &w)| *a += f64::from(f32::from_bits(u32::from(w) << 16)));
                }
                (Gelu::ForwardBf16Biased, &Operands::Bf16Biased { x, bias, h, y }) => {
                    lanes::forward_bf16_biased_in_place(
                        x.add(at),
                        bias.as_ptr().add(column),
                        (h.add(at), y.add(at)),
                        len,
                    )
                }
                (Gelu::Forward | Gelu::Backward, Operands::Bf16 { .. } | Operands::Bf16Biased { .. })
                | (Gelu::ForwardBf16 | Gelu::BackwardBf16, Operands::F32 { .. } | Operands::Bf16Biased { .. })
                | (Gelu::ForwardBf16Biased, Operands::F32 { .. } | Operands::Bf16 { .. }) => {
                    unreachable!("`bind_direct` binds each program's own operands")
                }
            }
            at += len;
        }
    }

    /// Never bound off x86-64 (the loops need AVX-512).
    ///
    /// # Safety
    /// None needed.
    #[cfg(not(target_arch = "x86_64"))]
    pub(crate) unsafe fn run(&self, _: usize, _: usize, _: &mut [Vec<f64>]) {
        unreachable!("GELU programs are recognised on AVX-512 CPUs only")
    }
}

/// The loops, 16 lanes at a time (a last part under a mask).
#[cfg(target_arch = "x86_64")]
mod lanes {
    use super::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI};
    use crate::kernels::numeric_avx512::{bf16_words16, each16, erf16, exp16, round_bf16_16};
    use crate::kernels::simd::prefetch_ahead;
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

    /// `out[i] = gelu(x[i] + bias[i])` for `len` elements (`out` may be `x`
    /// or `bias`).
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn forward_in_place(x: *const f32, bias: *const f32, out: *mut f32, len: usize) {
        each16(len, |i, m| {
            prefetch_ahead(x, i, 16);
            let (h, _, cdf) = biased_cdf(_mm512_maskz_loadu_ps(m, x.add(i)), _mm512_maskz_loadu_ps(m, bias.add(i)));
            _mm512_mask_storeu_ps(out.add(i), m, _mm512_mul_ps(h, cdf));
        });
    }

    /// `out[i]`: the gradient of `gelu(x + bias)` for the incoming `g`, for
    /// `len` elements (`out` may be `x` or `g`).
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn backward_in_place(x: *const f32, bias: *const f32, g: *const f32, out: *mut f32, len: usize) {
        each16(len, |i, m| {
            prefetch_ahead(x, i, 16);
            prefetch_ahead(g, i, 16);
            let (h, u, cdf) = biased_cdf(_mm512_maskz_loadu_ps(m, x.add(i)), _mm512_maskz_loadu_ps(m, bias.add(i)));
            _mm512_mask_storeu_ps(out.add(i), m, gradient(h, u, cdf, _mm512_maskz_loadu_ps(m, g.add(i))));
        });
    }

    /// 16 bf16 words from `p` (the lanes of `m`), widened to f32. A
    /// signalling NaN stays signalling here (`bf16_to_f32` quiets it); every
    /// use is arithmetic, which quiets it to the same NaN.
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16, m: __mmask16) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p.cast()))))
    }

    /// The lanes of `x` (those of `m`) rounded to bf16 words at `p`: what
    /// the interpreter's rounding and bf16 store write.
    #[inline(always)]
    unsafe fn store_bf16(p: *mut u16, m: __mmask16, x: __m512) {
        _mm512_mask_cvtepi32_storeu_epi16(p.cast(), m, bf16_words16(x));
    }

    /// `out[i] = gelu(x[i])` as bf16 words, for `len` elements (`out` may be `x`).
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) unsafe fn forward_bf16_in_place(x: *const u16, out: *mut u16, len: usize) {
        each16(len, |i, m| {
            prefetch_ahead(x, i, 16);
            let h = load_bf16(x.add(i), m);
            let (_, cdf) = cdf(h);
            store_bf16(out.add(i), m, _mm512_mul_ps(h, cdf));
        });
    }

    /// `out[i]`: the gradient of `gelu(x)` for the incoming `g`, as bf16
    /// words, for `len` elements (`out` may be `x` or `g`).
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) unsafe fn backward_bf16_in_place(x: *const u16, g: *const u16, out: *mut u16, len: usize) {
        each16(len, |i, m| {
            prefetch_ahead(x, i, 16);
            prefetch_ahead(g, i, 16);
            let h = load_bf16(x.add(i), m);
            let (u, cdf) = cdf(h);
            store_bf16(out.add(i), m, gradient(h, u, cdf, load_bf16(g.add(i), m)));
        });
    }

    /// `h[i] = x[i] + bias[i]` rounded to bf16 and `y[i] = gelu(h[i])`, as
    /// bf16 words, for `len` elements (`h` may be `x`).
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) unsafe fn forward_bf16_biased_in_place(
        x: *const u16,
        bias: *const f32,
        (h, y): (*mut u16, *mut u16),
        len: usize,
    ) {
        each16(len, |i, m| {
            prefetch_ahead(x, i, 16);
            let biased = round_bf16_16(_mm512_add_ps(load_bf16(x.add(i), m), _mm512_maskz_loadu_ps(m, bias.add(i))));
            let (_, cdf) = cdf(biased);
            store_bf16(h.add(i), m, biased);
            store_bf16(y.add(i), m, _mm512_mul_ps(biased, cdf));
        });
    }

    /// Over registers: `x_y[i]` (the product) becomes `gelu(h[i])` and
    /// `bias_h[i]` becomes `h[i] = x[i] + bias[i]`, both rounded to bf16.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn forward_bf16_biased(x_y: &mut [f32], bias_h: &mut [f32]) {
        each16(x_y.len(), |i, m| {
            let (x, b) = (x_y.as_mut_ptr().add(i), bias_h.as_mut_ptr().add(i));
            let biased = round_bf16_16(_mm512_add_ps(_mm512_maskz_loadu_ps(m, x), _mm512_maskz_loadu_ps(m, b)));
            let (_, cdf) = cdf(biased);
            _mm512_mask_storeu_ps(b, m, biased);
            _mm512_mask_storeu_ps(x, m, round_bf16_16(_mm512_mul_ps(biased, cdf)));
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

/// The bf16 forward program with its bias add, as the CPU backend builds
/// it: `h` rounded into register 1, its CDF in 0, `y` rounded into 0.
fn forward_bf16_biased() -> Vec<Instr> {
    use BinaryOp::{Add, Mul};
    vec![
        Load { load: 0, dst: 0 },
        Load { load: 1, dst: 1 },
        binary(Add, Reg(0), Reg(1), 2),
        RoundBf16 { src: 2, dst: 1 },
        binary(Mul, Reg(1), Imm(FRAC_1_SQRT_2), 2),
        Unary { op: UnaryOp::Erf, src: 2, dst: 0 },
        binary(Add, Reg(0), Imm(1.0), 2),
        binary(Mul, Reg(2), Imm(0.5), 0),
        binary(Mul, Reg(1), Reg(0), 2),
        RoundBf16 { src: 2, dst: 0 },
        Store { src: 1, out: 0 },
        Store { src: 0, out: 1 },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use half::bf16;

    /// GELU program `gelu` over `shape` (an f32 program's bias a row
    /// broadcast down the leading axes), a gradient's column sums over the
    /// trailing `column_len` elements, run by its loop when `fast`, else by
    /// the interpreter. With `strided_x` the input `x` is read through its
    /// row-major strides (the same elements), which the loop cannot bind in
    /// place: it then runs over the interpreter's tiles.
    fn program(gelu: Gelu, shape: &[usize], column_len: usize, fast: bool, strided_x: bool) -> FusedProgram {
        let mut row = vec![0; shape.len()];
        *row.last_mut().unwrap() = 1;
        let x = match strided_x {
            true => Access::Strided((0..shape.len()).map(|d| shape[d + 1..].iter().product()).collect()),
            false => Access::Contiguous,
        };
        let (instrs, accesses) = match gelu {
            Gelu::Forward => (forward(), vec![x, Access::Strided(row)]),
            Gelu::Backward => (backward(), vec![x, Access::Strided(row), Access::Contiguous]),
            Gelu::ForwardBf16 => (forward_bf16(), vec![x]),
            Gelu::BackwardBf16 => (backward_bf16(), vec![x, Access::Contiguous]),
            Gelu::ForwardBf16Biased => (forward_bf16_biased(), vec![x, Access::Strided(row)]),
        };
        let bf16 = matches!(gelu, Gelu::ForwardBf16 | Gelu::BackwardBf16 | Gelu::ForwardBf16Biased);
        let backward = matches!(gelu, Gelu::Backward | Gelu::BackwardBf16);
        let mut output_dtypes = vec![if bf16 { DType::BF16 } else { DType::F32 }];
        match (backward, gelu == Gelu::ForwardBf16Biased) {
            (true, _) => output_dtypes.push(DType::F32),
            (false, true) => output_dtypes.push(DType::BF16),
            (false, false) => {}
        }
        FusedProgram {
            shape: shape.to_vec(),
            gelu: if fast { Gelu::recognise(&instrs) } else { None },
            loads: accesses.into_iter().enumerate().map(|(input, access)| LoadSpec { input, access }).collect(),
            instrs,
            registers: 5,
            output_dtypes,
            reduce_inner: 0,
            column_len: if backward { column_len } else { 0 },
            lanes: None,
        }
    }

    fn values(len: usize, salt: usize, spread: f32) -> Vec<f32> {
        (0..len).map(|i| (((i * 7919 + salt * 104_729) % 2003) as f32 / 1001.0 - 1.0) * spread).collect()
    }

    fn floats(data: &HostData) -> Vec<f32> {
        match data {
            HostData::F32(v) => v.clone(),
            HostData::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            other => panic!("unexpected {}", other.dtype()),
        }
    }

    /// Every GELU program with its operands bound in place, the input read
    /// from the output buffer it is overwritten in, and by its loop over
    /// the interpreter's tiles (the input read through strides): the bits
    /// of the interpreter, column sums included. Rows of an odd width split
    /// between two threads mid-row (forward) or at the middle row
    /// (backward), and a gradient whose column sums run over the first
    /// axis only (each column two axes long).
    #[test]
    fn programs_in_place_have_the_bits_of_the_interpreter() {
        let cases: [(&[usize], usize); 2] = [(&[1801, 37], 37), (&[6, 5, 37], 5 * 37)];
        let all = [Gelu::Forward, Gelu::Backward, Gelu::ForwardBf16, Gelu::BackwardBf16, Gelu::ForwardBf16Biased];
        for gelu in all {
            for (&(shape, column_len), strided_x) in cases.iter().flat_map(|c| [(c, false), (c, true)]) {
                let fast = program(gelu, shape, column_len, true, strided_x);
                if fast.gelu.is_none() {
                    #[cfg(target_arch = "x86_64")]
                    assert!(!crate::kernels::simd::avx512(), "{gelu:?}: its own program is not recognised");
                    eprintln!("skipped: this CPU has no AVX-512");
                    return;
                }
                let (numel, width) = (shape.iter().product::<usize>(), shape[shape.len() - 1]);
                let bf16 = fast.output_dtypes[0] == DType::BF16;
                let data = |len: usize, salt: usize, spread: f32| match bf16 {
                    true => HostData::BF16(values(len, salt, spread).into_iter().map(bf16::from_f32).collect()),
                    false => HostData::F32(values(len, salt, spread)),
                };
                let (x, g) = (data(numel, 1, 4.0), data(numel, 3, 1.0));
                let bias = HostData::F32(values(width, 2, 1.0));
                // The product `x` is read from the output buffer it is
                // overwritten in, as an epilogue reads its matmul's panel (an
                // in-place input is read at its own positions), or through
                // strides from its own buffer.
                let x_source = if strided_x { Source::Data(&x) } else { Source::Output(0) };
                let sources = match gelu {
                    Gelu::Forward => vec![x_source, Source::Data(&bias)],
                    Gelu::Backward => vec![x_source, Source::Data(&bias), Source::Data(&g)],
                    Gelu::ForwardBf16 => vec![x_source],
                    Gelu::BackwardBf16 => vec![x_source, Source::Data(&g)],
                    Gelu::ForwardBf16Biased => vec![x_source, Source::Data(&bias)],
                };
                let fresh = |program: &FusedProgram| {
                    let mut outs = vec![x.clone()];
                    if program.column_len > 0 {
                        outs.push(HostData::F32(vec![0.0; program.column_len]));
                    }
                    if gelu == Gelu::ForwardBf16Biased {
                        outs.push(data(numel, 4, 1.0));
                    }
                    outs
                };
                let run = |program: &FusedProgram| -> Vec<HostData> {
                    let mut outs = fresh(program);
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
                    pool.install(|| program.run(&sources, &mut outs)).unwrap();
                    outs
                };
                let mut outs = fresh(&fast);
                let views: Vec<OutView> = outs.iter_mut().map(|o| OutView::of(o).unwrap()).collect();
                let bound = gelu.bind_direct(&fast, &sources, &views).is_some();
                assert_eq!(bound, !strided_x, "{gelu:?} {shape:?}: bound in place unless read through strides");
                let (looped, interpreted) = (run(&fast), run(&program(gelu, shape, column_len, false, strided_x)));
                for (k, (a, b)) in looped.iter().zip(&interpreted).enumerate() {
                    assert_eq!(a.dtype(), b.dtype(), "{gelu:?} {shape:?} {strided_x} output {k}");
                    let (a, b) = (floats(a), floats(b));
                    let differ = a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                    assert_eq!(differ, 0, "{gelu:?} {shape:?} {strided_x} output {k}: {differ} values differ");
                }
            }
        }
    }
}
