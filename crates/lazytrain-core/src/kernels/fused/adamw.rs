//! AdamW's update as one loop with every value in vector registers.
//!
//! The optimizer (`lazytrain-nn`'s `AdamW`) traces, per parameter,
//!
//! ```text
//! m' = m β1 + g (1 - β1)
//! v' = v β2 + g² (1 - β2)
//! p' = p k - m' / (√v' s + ε) · η
//! ```
//!
//! (`k = 1 - lr λ` where the parameter decays, `s = 1/√(1 - β2^t)`, `η` the
//! bias-corrected step size; `g` possibly scaled by a clipping factor),
//! which fuses into one straight-line program of four streams in and three
//! out. Even as a lane program (see [`super::lanes`]) each of its twenty
//! instructions writes its result to a register file in memory; this loop
//! keeps them in vector registers, as a hand-written fused optimizer does
//! (measured on a 2-core AMD Zen 4, BERT-base's `[30522, 768]` embeddings:
//! 36 ms by tiles, 28.5 ms as a lane program, 11 ms here; a C loop of the
//! same arithmetic, 8.3 ms).
//!
//! The update is recognised by the expressions the program stores, not by
//! its instruction list: register allocation and instruction order may
//! change, the arithmetic may not. The loop evaluates the same expressions,
//! operation for operation, so the results are the same bits. Under
//! autocast the program may store a fourth value, `p'` rounded to bf16
//! (the weight's copy for the next step's products, see
//! `tensor::narrow_copy`), which the loop writes too.

use super::lanes::{map, write, zip, Op, Stream, Vector, LANES};
use super::{round_bf16, OutView};
use crate::ir::{BinaryOp, UnaryOp};
use std::rc::Rc;

#[inline(always)]
fn add(a: &Vector, b: &Vector) -> Vector {
    zip(a, b, |x, y| x + y)
}

#[inline(always)]
fn mul(a: &Vector, b: &Vector) -> Vector {
    zip(a, b, |x, y| x * y)
}

/// A value the program computes, as an expression of its loads and
/// constant registers.
#[derive(Debug, PartialEq)]
enum Expr {
    /// Load `k`, read element by element.
    Load(usize),
    /// A register holding one value (an immediate or a single-value load).
    Constant(usize),
    Unary(UnaryOp, Rc<Expr>),
    Binary(BinaryOp, Rc<Expr>, Rc<Expr>),
    /// A value rounded to bf16's precision.
    RoundBf16(Rc<Expr>),
    /// Anything else (a comparison, a selection, a cast).
    Other,
}

/// How the denominator scales `√v'`: by a multiplication or a division by
/// a constant register.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scale {
    Mul(usize),
    Div(usize),
}

/// A recognised AdamW update: which loads and constant registers play
/// which part, and which outputs receive `m'`, `v'` and `p'`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AdamWUpdate {
    param: usize,
    grad: usize,
    exp_avg: usize,
    exp_avg_sq: usize,
    /// The decay factor `k`, where the parameter decays.
    keep: Option<usize>,
    /// The clipping factor `g` is scaled by, if any.
    clip: Option<usize>,
    beta1: usize,
    one_minus_beta1: usize,
    beta2: usize,
    one_minus_beta2: usize,
    scale: Scale,
    eps: usize,
    step_size: usize,
    /// Outputs of `m'`, `v'` and `p'`.
    outputs: [usize; 3],
    /// The output of `p'` rounded to bf16, if the program stores it.
    rounded_copy: Option<usize>,
}

/// `e` as `x * Constant(c)` (either order): `(x, c)`.
fn times_constant(e: &Expr) -> Option<(&Rc<Expr>, usize)> {
    match e {
        Expr::Binary(BinaryOp::Mul, x, c) | Expr::Binary(BinaryOp::Mul, c, x) if matches!(**c, Expr::Constant(_)) => {
            let Expr::Constant(c) = **c else { unreachable!("matched a constant") };
            Some((x, c))
        }
        _ => None,
    }
}

/// `e` as `a + b` in either order, `f` matching the two terms.
fn sum_of<T>(e: &Expr, f: impl Fn(&Expr, &Expr) -> Option<T>) -> Option<T> {
    match e {
        Expr::Binary(BinaryOp::Add, a, b) => f(a, b).or_else(|| f(b, a)),
        _ => None,
    }
}

fn load(e: &Expr) -> Option<usize> {
    match *e {
        Expr::Load(k) => Some(k),
        _ => None,
    }
}

/// `e` as `Load(k)` or `Load(k) * Constant(c)`: `(k, c)`.
fn load_maybe_scaled(e: &Expr) -> Option<(usize, Option<usize>)> {
    match load(e) {
        Some(k) => Some((k, None)),
        None => times_constant(e).and_then(|(x, c)| Some((load(x)?, Some(c)))),
    }
}

/// `m β1 + g (1 - β1)`: `(m, β1, 1 - β1)`, given `g`.
fn first_moment(e: &Expr, g: &Expr) -> Option<(usize, usize, usize)> {
    sum_of(e, |a, b| {
        let (m, beta) = times_constant(a)?;
        let (grad, one_minus) = times_constant(b)?;
        (**grad == *g).then_some(())?;
        Some((load(m)?, beta, one_minus))
    })
}

/// `v β2 + g² (1 - β2)`: `(v, β2, 1 - β2)`, given `g`.
fn second_moment(e: &Expr, g: &Expr) -> Option<(usize, usize, usize)> {
    sum_of(e, |a, b| {
        let (v, beta) = times_constant(a)?;
        let (square, one_minus) = times_constant(b)?;
        match &**square {
            Expr::Binary(BinaryOp::Mul, x, y) if **x == *g && **y == *g => Some((load(v)?, beta, one_minus)),
            _ => None,
        }
    })
}

impl AdamWUpdate {
    /// The update `ops` compute over `registers` registers, of which
    /// `constants` hold one value each, if they compute one.
    pub(super) fn recognise(ops: &[Op], registers: usize, constants: &[usize]) -> Option<AdamWUpdate> {
        let mut values: Vec<Rc<Expr>> = (0..registers)
            .map(|r| Rc::new(if constants.contains(&r) { Expr::Constant(r) } else { Expr::Other }))
            .collect();
        let mut stored: Vec<(usize, Rc<Expr>)> = Vec::new();
        for op in ops {
            let (dst, value) = match *op {
                Op::Load { load, dst } => (dst, Expr::Load(load)),
                Op::Unary { op, src, dst } => (dst, Expr::Unary(op, values[src].clone())),
                Op::Binary { op, a, b, dst } => (dst, Expr::Binary(op, values[a].clone(), values[b].clone())),
                Op::RoundBf16 { src, dst } => (dst, Expr::RoundBf16(values[src].clone())),
                Op::Compare { dst, .. }
                | Op::Select { dst, .. }
                | Op::ToBool { dst, .. }
                | Op::RowValue { dst, .. }
                | Op::ColumnValues { dst, .. }
                | Op::Random { dst, .. } => (dst, Expr::Other),
                Op::ReduceStore { .. } | Op::ColumnSum { .. } => return None,
                Op::Store { src, out } => {
                    stored.push((out, values[src].clone()));
                    continue;
                }
            };
            values[dst] = Rc::new(value);
        }
        if !(3..=4).contains(&stored.len()) {
            return None;
        }
        let stores: Vec<&(usize, Rc<Expr>)> = stored.iter().collect();
        // p' = p k - (m' / d) η, its first term p or p k.
        stores.iter().find_map(|&(p_out, p_new)| {
            let Expr::Binary(BinaryOp::Sub, decayed, step) = &**p_new else { return None };
            let (param, keep) = load_maybe_scaled(decayed)?;
            let (ratio, step_size) = times_constant(step)?;
            let Expr::Binary(BinaryOp::Div, m_new, denominator) = &**ratio else { return None };
            // d = √v' s + ε
            let (root, scale, eps) = sum_of(denominator, |a, b| {
                let Expr::Constant(eps) = *b else { return None };
                match a {
                    Expr::Binary(BinaryOp::Div, root, s) => match **s {
                        Expr::Constant(s) => Some((root.clone(), Scale::Div(s), eps)),
                        _ => None,
                    },
                    _ => times_constant(a).map(|(root, s)| (root.clone(), Scale::Mul(s), eps)),
                }
            })?;
            let Expr::Unary(UnaryOp::Sqrt, v_new) = &*root else { return None };
            let m_out = stores.iter().find(|(_, e)| Rc::ptr_eq(e, m_new))?.0;
            let v_out = stores.iter().find(|(_, e)| Rc::ptr_eq(e, v_new))?.0;
            // A fourth store is p' rounded to bf16, or this is not the update.
            let rounded = |e: &Expr| matches!(e, Expr::RoundBf16(x) if Rc::ptr_eq(x, p_new));
            let rounded_copy = match stores.len() {
                4 => Some(stores.iter().find(|(_, e)| rounded(e))?.0),
                _ => None,
            };
            // g: the gradient, or the gradient times a clipping factor.
            let Expr::Binary(BinaryOp::Add, a, b) = &**m_new else { return None };
            [a, b].into_iter().find_map(|term| {
                let (g, _) = times_constant(term)?;
                let (grad, clip) = load_maybe_scaled(g)?;
                let (exp_avg, beta1, one_minus_beta1) = first_moment(m_new, g)?;
                let (exp_avg_sq, beta2, one_minus_beta2) = second_moment(v_new, g)?;
                Some(AdamWUpdate {
                    param,
                    grad,
                    exp_avg,
                    exp_avg_sq,
                    keep,
                    clip,
                    beta1,
                    one_minus_beta1,
                    beta2,
                    one_minus_beta2,
                    scale,
                    eps,
                    step_size,
                    outputs: [m_out, v_out, *p_out],
                    rounded_copy,
                })
            })
        })
    }

    /// Run the whole vectors of elements `start..end` reading `streams`
    /// (by load) and the constant registers of `registers`; returns where
    /// the rest starts.
    ///
    /// # Safety
    /// As for [`super::lanes::BoundLanes::run`].
    #[inline(always)]
    pub(super) unsafe fn run(
        &self,
        streams: &[Stream],
        registers: &[Vector],
        outs: &[OutView],
        start: usize,
        end: usize,
    ) -> usize {
        let c = |r: usize| &registers[r];
        let (beta1, one_minus_beta1, beta2, one_minus_beta2) =
            (c(self.beta1), c(self.one_minus_beta1), c(self.beta2), c(self.one_minus_beta2));
        let (eps, step_size) = (c(self.eps), c(self.step_size));
        let (keep, clip) = (self.keep.map(c), self.clip.map(c));
        let [m_out, v_out, p_out] = self.outputs.map(|k| outs[k]);
        let copy_out = self.rounded_copy.map(|k| outs[k]);
        let (param, grad, exp_avg, exp_avg_sq) =
            (streams[self.param], streams[self.grad], streams[self.exp_avg], streams[self.exp_avg_sq]);
        let mut at = start;
        while at + LANES <= end {
            let g = match clip {
                Some(clip) => mul(&grad.read_ahead(at), clip),
                None => grad.read_ahead(at),
            };
            let m_new = add(&mul(&exp_avg.read_ahead(at), beta1), &mul(&g, one_minus_beta1));
            let v_new = add(&mul(&exp_avg_sq.read_ahead(at), beta2), &mul(&mul(&g, &g), one_minus_beta2));
            let root = map(&v_new, f32::sqrt);
            let scaled = match self.scale {
                Scale::Mul(s) => mul(&root, c(s)),
                Scale::Div(s) => zip(&root, c(s), |x, y| x / y),
            };
            let decayed = match keep {
                Some(keep) => mul(&param.read_ahead(at), keep),
                None => param.read_ahead(at),
            };
            let step = mul(&zip(&m_new, &add(&scaled, eps), |x, y| x / y), step_size);
            let p_new = zip(&decayed, &step, |x, y| x - y);
            write(m_out, at, &m_new);
            write(v_out, at, &v_new);
            write(p_out, at, &p_new);
            if let Some(copy_out) = copy_out {
                write(copy_out, at, &map(&p_new, round_bf16));
            }
            at += LANES;
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::super::lanes::tests::{bits, fused, values};
    use super::super::{Instr, Source, Src};
    use crate::dtype::DType;
    use crate::ir::{BinaryOp, UnaryOp};
    use crate::schedule::Access;
    use crate::storage::HostData;
    use Instr::{Binary, Load, Store, Unary};
    use Src::{Imm, Reg};

    /// AdamW's program as the CPU backend builds it for a decaying
    /// parameter (registers allocated, the gradient loaded three times),
    /// `√v'` scaled by `scale` (the rewritten division multiplies) and the
    /// first moment's terms combined by `combine`.
    fn adamw(scale: BinaryOp, combine: BinaryOp) -> Vec<Instr> {
        let bin = |op, a, b, dst| Binary { op, a, b, dst };
        vec![
            Load { load: 0, dst: 0 },
            Load { load: 1, dst: 1 },
            bin(BinaryOp::Mul, Reg(0), Reg(1), 2),
            Load { load: 2, dst: 1 },
            bin(BinaryOp::Mul, Reg(1), Imm(0.9), 0),
            Load { load: 3, dst: 1 },
            bin(BinaryOp::Mul, Reg(1), Imm(0.1), 3),
            bin(combine, Reg(0), Reg(3), 1),
            Load { load: 4, dst: 3 },
            bin(BinaryOp::Mul, Reg(3), Imm(0.999), 0),
            Load { load: 3, dst: 3 },
            Load { load: 3, dst: 4 },
            bin(BinaryOp::Mul, Reg(3), Reg(4), 5),
            bin(BinaryOp::Mul, Reg(5), Imm(0.001), 4),
            bin(BinaryOp::Add, Reg(0), Reg(4), 5),
            Unary { op: UnaryOp::Sqrt, src: 5, dst: 4 },
            Load { load: 5, dst: 0 },
            bin(scale, Reg(4), Reg(0), 3),
            bin(BinaryOp::Add, Reg(3), Imm(1e-8), 0),
            bin(BinaryOp::Div, Reg(1), Reg(0), 3),
            Load { load: 6, dst: 0 },
            bin(BinaryOp::Mul, Reg(3), Reg(0), 4),
            bin(BinaryOp::Sub, Reg(2), Reg(4), 0),
            Store { src: 1, out: 0 },
            Store { src: 5, out: 1 },
            Store { src: 0, out: 2 },
        ]
    }

    /// The outputs (`m'`, `v'`, `p'`, each over its input in place, and a
    /// bf16 fourth where `copy`) of `instrs` over `len` elements, as a lane
    /// program or by tiles; and whether the lanes ran it as AdamW.
    fn update(instrs: Vec<Instr>, len: usize, lanes: bool, copy: bool) -> (Vec<Vec<u32>>, bool) {
        use Access::{Contiguous, Splat};
        let accesses = [Contiguous, Splat, Contiguous, Contiguous, Contiguous, Splat, Splat];
        let dtypes = [DType::F32, DType::F32, DType::F32, DType::BF16];
        let program = fused(len, &accesses, instrs, &dtypes[..if copy { 4 } else { 3 }], lanes);
        let g = HostData::F32(values(len, 4).iter().map(|v| v * 0.01).collect());
        let (keep, scale, step) = (HostData::F32(vec![0.999]), HostData::F32(vec![1.3]), HostData::F32(vec![0.01]));
        let v = values(len, 3).iter().map(|v| v.abs() * 1e-4).collect();
        let mut outs = vec![HostData::F32(values(len, 2)), HostData::F32(v), HostData::F32(values(len, 1))];
        if copy {
            outs.push(HostData::BF16(vec![half::bf16::ZERO; len]));
        }
        let inputs = [
            Source::Output(2),
            Source::Data(&keep),
            Source::Output(0),
            Source::Data(&g),
            Source::Output(1),
            Source::Data(&scale),
            Source::Data(&step),
        ];
        program.run(&inputs, &mut outs).unwrap();
        (outs.iter().map(bits).collect(), program.runs_own_loop())
    }

    #[test]
    fn the_update_runs_by_its_own_loop_with_the_interpreters_bits() {
        for scale in [BinaryOp::Mul, BinaryOp::Div] {
            for len in [5, 1000, (1 << 16) + 37] {
                let (own, recognised) = update(adamw(scale, BinaryOp::Add), len, true, false);
                let (interpreted, _) = update(adamw(scale, BinaryOp::Add), len, false, false);
                assert!(recognised, "√v' {scale:?} a constant is AdamW's");
                assert_eq!(own, interpreted, "{scale:?}, {len} elements");
            }
        }
    }

    /// Under autocast the update also stores `p'` rounded to bf16 (the
    /// weight's copy for the next step): recognised, the same bits as the
    /// interpreter's in all four outputs, the copy `p'`'s bf16 rounding.
    #[test]
    fn the_update_with_a_bf16_copy_of_the_weight_runs_by_its_own_loop() {
        let mut instrs = adamw(BinaryOp::Mul, BinaryOp::Add);
        instrs.push(Instr::RoundBf16 { src: 0, dst: 6 });
        instrs.push(Store { src: 6, out: 3 });
        for len in [5, 1000, (1 << 16) + 37] {
            let (own, recognised) = update(instrs.clone(), len, true, true);
            let (interpreted, _) = update(instrs.clone(), len, false, true);
            assert!(recognised, "{len} elements");
            assert_eq!(own, interpreted, "{len} elements");
            let rounded = |p: &u32| u32::from(half::bf16::from_f32(f32::from_bits(*p)).to_bits());
            assert!(own[2].iter().zip(&own[3]).all(|(p, c)| rounded(p) == *c), "the copy is p' in bf16");
        }
    }

    #[test]
    fn another_update_runs_as_a_lane_program() {
        let (lanes, recognised) = update(adamw(BinaryOp::Mul, BinaryOp::Sub), 1000, true, false);
        assert!(!recognised, "m β1 - g (1 - β1) is not AdamW's first moment");
        assert_eq!(lanes, update(adamw(BinaryOp::Mul, BinaryOp::Sub), 1000, false, false).0);
    }
}
