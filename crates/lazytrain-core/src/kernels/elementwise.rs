//! Elementwise kernels: unary, binary, compare, select, iota, random.

use super::numeric::{FloatLike, IntLike, Real};
use crate::ir::{BinaryOp, CmpOp, UnaryOp};
use crate::storage::HostData;

/// The lanes a unary kernel maps over: a separate input and output, or the
/// output buffer in place (its old contents are the input). A one-element
/// input broadcasts to the whole output (splat constants and expanded
/// scalars are never materialised by the CPU backend).
pub(super) trait Lanes1<T: Copy> {
    fn apply(self, f: impl Fn(T) -> T);
}

impl<T: Copy> Lanes1<T> for (&[T], &mut [T]) {
    #[inline(always)]
    fn apply(self, f: impl Fn(T) -> T) {
        let (x, o) = self;
        if x.len() == 1 && o.len() != 1 {
            o.fill(f(x[0]));
            return;
        }
        for (o, x) in o.iter_mut().zip(x) {
            *o = f(*x);
        }
    }
}

impl<T: Copy> Lanes1<T> for &mut [T] {
    fn apply(self, f: impl Fn(T) -> T) {
        for o in self.iter_mut() {
            *o = f(*o);
        }
    }
}

/// The lanes a binary kernel maps over: `(a, b, out)`, or in place with the
/// output holding the left (or right) operand.
pub(super) trait Lanes2<T: Copy> {
    fn apply(self, f: impl Fn(T, T) -> T);
}

impl<T: Copy> Lanes2<T> for (&[T], &[T], &mut [T]) {
    #[inline(always)]
    fn apply(self, f: impl Fn(T, T) -> T) {
        let (a, b, o) = self;
        match (a.len() == 1 && o.len() != 1, b.len() == 1 && o.len() != 1) {
            (false, false) => o.iter_mut().zip(a).zip(b).for_each(|((o, a), b)| *o = f(*a, *b)),
            (true, false) => o.iter_mut().zip(b).for_each(|(o, b)| *o = f(a[0], *b)),
            (false, true) => o.iter_mut().zip(a).for_each(|(o, a)| *o = f(*a, b[0])),
            (true, true) => o.fill(f(a[0], b[0])),
        }
    }
}

/// In place: `out` holds the left operand when `.2` is true, else the right.
impl<T: Copy> Lanes2<T> for (&mut [T], &[T], bool) {
    fn apply(self, f: impl Fn(T, T) -> T) {
        let (o, other, out_is_lhs) = self;
        let splat = other.len() == 1 && o.len() != 1;
        match (out_is_lhs, splat) {
            (true, false) => o.iter_mut().zip(other).for_each(|(o, b)| *o = f(*o, *b)),
            (false, false) => o.iter_mut().zip(other).for_each(|(o, a)| *o = f(*a, *o)),
            (true, true) => o.iter_mut().for_each(|o| *o = f(*o, other[0])),
            (false, true) => o.iter_mut().for_each(|o| *o = f(other[0], *o)),
        }
    }
}

#[inline(always)]
pub(super) fn float_unary<T: FloatLike>(op: UnaryOp, lanes: impl Lanes1<T>) {
    let lift = |f: fn(T::Math) -> T::Math| move |x: T| T::narrow(f(x.widen()));
    match op {
        UnaryOp::Neg => lanes.apply(lift(|v| -v)),
        UnaryOp::Exp => lanes.apply(lift(Real::exp)),
        UnaryOp::Log => lanes.apply(lift(Real::ln)),
        UnaryOp::Sqrt => lanes.apply(lift(Real::sqrt)),
        UnaryOp::Rsqrt => lanes.apply(lift(|v| T::Math::ONE / v.sqrt())),
        UnaryOp::Tanh => lanes.apply(lift(Real::tanh)),
        UnaryOp::Erf => lanes.apply(lift(Real::erf)),
        UnaryOp::Abs => lanes.apply(lift(Real::abs)),
        UnaryOp::Recip => lanes.apply(lift(|v| T::Math::ONE / v)),
    }
}

fn int_unary<T: IntLike>(op: UnaryOp, lanes: impl Lanes1<T>) -> Result<(), String> {
    let f: fn(i64) -> i64 = match op {
        UnaryOp::Neg => i64::wrapping_neg,
        UnaryOp::Abs => i64::wrapping_abs,
        other => return Err(format!("{} is not defined on integers", other.name())),
    };
    lanes.apply(|x| T::from_i64(f(x.to_i64())));
    Ok(())
}

/// `out = op(x)`, compiled also for AVX2 and AVX-512 (exp and erf are
/// fused multiply-adds: one instruction there).
pub(crate) fn unary(op: UnaryOp, x: &HostData, out: &mut HostData) -> Result<(), String> {
    super::simd::widest!(unary_lanes(op, x, out))
}

#[inline(always)]
fn unary_lanes(op: UnaryOp, x: &HostData, out: &mut HostData) -> Result<(), String> {
    match (x, out) {
        (HostData::F32(x), HostData::F32(o)) => unary_f32_lanes(op, Some(x), o),
        (HostData::F64(x), HostData::F64(o)) => float_unary(op, (x.as_slice(), o.as_mut_slice())),
        (HostData::BF16(x), HostData::BF16(o)) => float_unary(op, (x.as_slice(), o.as_mut_slice())),
        (HostData::F16(x), HostData::F16(o)) => float_unary(op, (x.as_slice(), o.as_mut_slice())),
        (HostData::I64(x), HostData::I64(o)) => int_unary(op, (x.as_slice(), o.as_mut_slice()))?,
        (HostData::I32(x), HostData::I32(o)) => int_unary(op, (x.as_slice(), o.as_mut_slice()))?,
        (HostData::U8(x), HostData::U8(o)) => int_unary(op, (x.as_slice(), o.as_mut_slice()))?,
        (x, o) => return Err(format!("{} got {} input for {} output", op.name(), x.dtype(), o.dtype())),
    }
    Ok(())
}

/// [`unary`] (`x` given) or [`unary_inplace`] on f32 slices: a range of a
/// larger tensor gets the bits the whole tensor's kernel gives it.
pub(crate) fn unary_f32(op: UnaryOp, x: Option<&[f32]>, out: &mut [f32]) {
    super::simd::widest!(unary_f32_lanes(op, x, out))
}

#[inline(always)]
fn unary_f32_lanes(op: UnaryOp, x: Option<&[f32]>, out: &mut [f32]) {
    match (op, x) {
        (UnaryOp::Exp, Some(x)) if x.len() == out.len() => {
            out.iter_mut().zip(x).for_each(|(o, &v)| *o = super::numeric::exp_f32(v))
        }
        (_, Some(x)) => float_unary(op, (x, out)),
        (_, None) => float_unary(op, out),
    }
}

/// `out = op(out)`, in place (compiled as [`unary`] is).
pub(crate) fn unary_inplace(op: UnaryOp, out: &mut HostData) -> Result<(), String> {
    super::simd::widest!(unary_inplace_lanes(op, out))
}

#[inline(always)]
fn unary_inplace_lanes(op: UnaryOp, out: &mut HostData) -> Result<(), String> {
    match out {
        HostData::F32(o) => unary_f32_lanes(op, None, o),
        HostData::F64(o) => float_unary(op, o.as_mut_slice()),
        HostData::BF16(o) => float_unary(op, o.as_mut_slice()),
        HostData::F16(o) => float_unary(op, o.as_mut_slice()),
        HostData::I64(o) => int_unary(op, o.as_mut_slice())?,
        HostData::I32(o) => int_unary(op, o.as_mut_slice())?,
        HostData::U8(o) => int_unary(op, o.as_mut_slice())?,
        HostData::Bool(_) => return Err(format!("{} is not defined on bool", op.name())),
    }
    Ok(())
}

fn nan_max<R: Real>(a: R, b: R) -> R {
    if a.is_nan() || b.is_nan() {
        R::NAN
    } else if a >= b {
        a
    } else {
        b
    }
}

fn nan_min<R: Real>(a: R, b: R) -> R {
    if a.is_nan() || b.is_nan() {
        R::NAN
    } else if a <= b {
        a
    } else {
        b
    }
}

#[inline(always)]
pub(super) fn float_binary<T: FloatLike>(op: BinaryOp, lanes: impl Lanes2<T>) {
    let lift = |f: fn(T::Math, T::Math) -> T::Math| move |a: T, b: T| T::narrow(f(a.widen(), b.widen()));
    match op {
        BinaryOp::Add => lanes.apply(lift(|x, y| x + y)),
        BinaryOp::Sub => lanes.apply(lift(|x, y| x - y)),
        BinaryOp::Mul => lanes.apply(lift(|x, y| x * y)),
        BinaryOp::Div => lanes.apply(lift(|x, y| x / y)),
        BinaryOp::Max => lanes.apply(lift(nan_max)),
        BinaryOp::Min => lanes.apply(lift(nan_min)),
        BinaryOp::Pow => lanes.apply(lift(Real::powf)),
    }
}

fn int_binary<T: IntLike>(op: BinaryOp, lanes: impl Lanes2<T>) -> Result<(), String> {
    let f: fn(i64, i64) -> i64 = match op {
        BinaryOp::Add => i64::wrapping_add,
        BinaryOp::Sub => i64::wrapping_sub,
        BinaryOp::Mul => i64::wrapping_mul,
        BinaryOp::Div => |x, y| if y == 0 { 0 } else { x.wrapping_div(y) },
        BinaryOp::Max => i64::max,
        BinaryOp::Min => i64::min,
        BinaryOp::Pow => return Err("pow is not defined on integers".into()),
    };
    lanes.apply(|a, b| T::from_i64(f(a.to_i64(), b.to_i64())));
    Ok(())
}

/// `out = a op b` for same-shape inputs.
pub(crate) fn binary(op: BinaryOp, a: &HostData, b: &HostData, out: &mut HostData) -> Result<(), String> {
    match (a, b, out) {
        (HostData::F32(a), HostData::F32(b), HostData::F32(o)) => {
            float_binary(op, (a.as_slice(), b.as_slice(), o.as_mut_slice()))
        }
        (HostData::F64(a), HostData::F64(b), HostData::F64(o)) => {
            float_binary(op, (a.as_slice(), b.as_slice(), o.as_mut_slice()))
        }
        (HostData::BF16(a), HostData::BF16(b), HostData::BF16(o)) => {
            float_binary(op, (a.as_slice(), b.as_slice(), o.as_mut_slice()))
        }
        (HostData::F16(a), HostData::F16(b), HostData::F16(o)) => {
            float_binary(op, (a.as_slice(), b.as_slice(), o.as_mut_slice()))
        }
        (HostData::I64(a), HostData::I64(b), HostData::I64(o)) => {
            int_binary(op, (a.as_slice(), b.as_slice(), o.as_mut_slice()))?
        }
        (HostData::I32(a), HostData::I32(b), HostData::I32(o)) => {
            int_binary(op, (a.as_slice(), b.as_slice(), o.as_mut_slice()))?
        }
        (HostData::U8(a), HostData::U8(b), HostData::U8(o)) => {
            int_binary(op, (a.as_slice(), b.as_slice(), o.as_mut_slice()))?
        }
        (a, b, _) => return Err(format!("{} got {} and {} inputs", op.name(), a.dtype(), b.dtype())),
    }
    Ok(())
}

/// `out = out op other` (or `other op out` when `out_is_lhs` is false), in place.
pub(crate) fn binary_inplace(
    op: BinaryOp,
    out_is_lhs: bool,
    other: &HostData,
    out: &mut HostData,
) -> Result<(), String> {
    match (out, other) {
        (HostData::F32(o), HostData::F32(x)) => float_binary(op, (o.as_mut_slice(), x.as_slice(), out_is_lhs)),
        (HostData::F64(o), HostData::F64(x)) => float_binary(op, (o.as_mut_slice(), x.as_slice(), out_is_lhs)),
        (HostData::BF16(o), HostData::BF16(x)) => float_binary(op, (o.as_mut_slice(), x.as_slice(), out_is_lhs)),
        (HostData::F16(o), HostData::F16(x)) => float_binary(op, (o.as_mut_slice(), x.as_slice(), out_is_lhs)),
        (HostData::I64(o), HostData::I64(x)) => int_binary(op, (o.as_mut_slice(), x.as_slice(), out_is_lhs))?,
        (HostData::I32(o), HostData::I32(x)) => int_binary(op, (o.as_mut_slice(), x.as_slice(), out_is_lhs))?,
        (HostData::U8(o), HostData::U8(x)) => int_binary(op, (o.as_mut_slice(), x.as_slice(), out_is_lhs))?,
        (o, x) => return Err(format!("{} in place on {} with {}", op.name(), o.dtype(), x.dtype())),
    }
    Ok(())
}

/// `o[i] = out(a[i] op b[i])`, one loop per predicate (no call per
/// element); a one-element operand broadcasts, tested once. Shared by the
/// unfused kernel (bool output) and the fused one (0/1 in f32 registers).
#[inline(always)]
pub(super) fn compare_lanes<T: PartialOrd + Copy, O>(
    op: CmpOp,
    a: &[T],
    b: &[T],
    o: &mut [O],
    out: impl Fn(bool) -> O,
) {
    #[inline(always)]
    fn each<T: Copy, O>(a: &[T], b: &[T], o: &mut [O], f: impl Fn(T, T) -> bool, out: impl Fn(bool) -> O) {
        match (a.len() == 1 && o.len() != 1, b.len() == 1 && o.len() != 1) {
            (false, false) => o.iter_mut().zip(a).zip(b).for_each(|((o, &x), &y)| *o = out(f(x, y))),
            (false, true) => o.iter_mut().zip(a).for_each(|(o, &x)| *o = out(f(x, b[0]))),
            (true, false) => o.iter_mut().zip(b).for_each(|(o, &y)| *o = out(f(a[0], y))),
            (true, true) => o.iter_mut().for_each(|o| *o = out(f(a[0], b[0]))),
        }
    }
    match op {
        CmpOp::Eq => each(a, b, o, |x, y| x == y, out),
        CmpOp::Ne => each(a, b, o, |x, y| x != y, out),
        CmpOp::Lt => each(a, b, o, |x, y| x < y, out),
        CmpOp::Le => each(a, b, o, |x, y| x <= y, out),
        CmpOp::Gt => each(a, b, o, |x, y| x > y, out),
        CmpOp::Ge => each(a, b, o, |x, y| x >= y, out),
    }
}

fn cmp_slices<T: PartialOrd + Copy>(op: CmpOp, a: &[T], b: &[T], o: &mut [bool]) {
    compare_lanes(op, a, b, o, |x| x);
}

/// `out = a cmp b` (bool output).
pub(crate) fn compare(op: CmpOp, a: &HostData, b: &HostData, out: &mut HostData) -> Result<(), String> {
    let HostData::Bool(o) = out else {
        return Err(format!("{} must write a bool output", op.name()));
    };
    match (a, b) {
        (HostData::F32(a), HostData::F32(b)) => cmp_slices(op, a, b, o),
        (HostData::F64(a), HostData::F64(b)) => cmp_slices(op, a, b, o),
        (HostData::BF16(a), HostData::BF16(b)) => cmp_slices(op, a, b, o),
        (HostData::F16(a), HostData::F16(b)) => cmp_slices(op, a, b, o),
        (HostData::I64(a), HostData::I64(b)) => cmp_slices(op, a, b, o),
        (HostData::I32(a), HostData::I32(b)) => cmp_slices(op, a, b, o),
        (HostData::U8(a), HostData::U8(b)) => cmp_slices(op, a, b, o),
        (HostData::Bool(a), HostData::Bool(b)) => cmp_slices(op, a, b, o),
        (a, b) => return Err(format!("{} got {} and {} inputs", op.name(), a.dtype(), b.dtype())),
    }
    Ok(())
}

/// Element `i` of `v`, or its only element when it is a broadcast splat.
#[inline(always)]
pub(super) fn at<T: Copy>(v: &[T], i: usize) -> T {
    if v.len() == 1 {
        v[0]
    } else {
        v[i]
    }
}

fn select_inplace_slices<T: Copy>(c: &[bool], other: &[T], out_is_true_value: bool, o: &mut [T]) {
    for (i, o) in o.iter_mut().enumerate() {
        if at(c, i) != out_is_true_value {
            *o = at(other, i);
        }
    }
}

/// `out = cond ? out : other` (or `cond ? other : out`), in place.
pub(crate) fn select_inplace(
    cond: &HostData,
    other: &HostData,
    out_is_true_value: bool,
    out: &mut HostData,
) -> Result<(), String> {
    let HostData::Bool(c) = cond else {
        return Err("select needs a bool condition".into());
    };
    macro_rules! arm {
        ($($v:ident),*) => {
            match (other, out) {
                $((HostData::$v(x), HostData::$v(o)) => select_inplace_slices(c, x, out_is_true_value, o),)*
                (x, o) => return Err(format!("select in place on {} with {}", o.dtype(), x.dtype())),
            }
        };
    }
    arm!(F32, F64, BF16, F16, I64, I32, U8, Bool);
    Ok(())
}

/// `o[i] = is_true(c[i]) ? a[i] : b[i]`; the common shapes (everything
/// full-size, or one branch a one-element constant) get loops without
/// per-element broadcast tests. Shared by the unfused kernel (bool
/// condition) and the fused one (0/1 in f32 registers).
#[inline(always)]
pub(super) fn select_lanes<C: Copy, T: Copy>(c: &[C], a: &[T], b: &[T], o: &mut [T], is_true: impl Fn(C) -> bool) {
    let n = o.len();
    let full = |len: usize| len == n;
    if full(c.len()) && full(a.len()) && full(b.len()) {
        o.iter_mut().zip(c.iter().zip(a).zip(b)).for_each(|(o, ((&c, &x), &y))| *o = if is_true(c) { x } else { y });
    } else if full(c.len()) && full(a.len()) {
        // The constant in a local: read through the slice inside the loop,
        // it compiles to a gather of per-lane addresses.
        let y = b[0];
        o.iter_mut().zip(c.iter().zip(a)).for_each(|(o, (&c, &x))| *o = if is_true(c) { x } else { y });
    } else if full(c.len()) && full(b.len()) {
        let x = a[0];
        o.iter_mut().zip(c.iter().zip(b)).for_each(|(o, (&c, &y))| *o = if is_true(c) { x } else { y });
    } else {
        for (i, o) in o.iter_mut().enumerate() {
            *o = if is_true(at(c, i)) { at(a, i) } else { at(b, i) };
        }
    }
}

fn select_slices<T: Copy>(c: &[bool], a: &[T], b: &[T], o: &mut [T]) {
    select_lanes(c, a, b, o, |c| c);
}

/// `out = cond ? a : b`.
pub(crate) fn select(cond: &HostData, a: &HostData, b: &HostData, out: &mut HostData) -> Result<(), String> {
    let HostData::Bool(c) = cond else {
        return Err("select needs a bool condition".into());
    };
    match (a, b, out) {
        (HostData::F32(a), HostData::F32(b), HostData::F32(o)) => select_slices(c, a, b, o),
        (HostData::F64(a), HostData::F64(b), HostData::F64(o)) => select_slices(c, a, b, o),
        (HostData::BF16(a), HostData::BF16(b), HostData::BF16(o)) => select_slices(c, a, b, o),
        (HostData::F16(a), HostData::F16(b), HostData::F16(o)) => select_slices(c, a, b, o),
        (HostData::I64(a), HostData::I64(b), HostData::I64(o)) => select_slices(c, a, b, o),
        (HostData::I32(a), HostData::I32(b), HostData::I32(o)) => select_slices(c, a, b, o),
        (HostData::U8(a), HostData::U8(b), HostData::U8(o)) => select_slices(c, a, b, o),
        (HostData::Bool(a), HostData::Bool(b), HostData::Bool(o)) => select_slices(c, a, b, o),
        (a, b, _) => return Err(format!("select got {} and {} values", a.dtype(), b.dtype())),
    }
    Ok(())
}

/// Count along `axis` of `shape`.
pub(crate) fn iota(shape: &[usize], axis: usize, out: &mut HostData) {
    let dim = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let values = (0..out.len()).map(|i| ((i / inner) % dim) as i64);
    super::numeric::fill_from_i64(out, values);
}

/// Philox uniforms in `[0, 1)` keyed by the seed.
pub(crate) fn rng_uniform(seed: &HostData, stream: u64, out: &mut HostData) -> Result<(), String> {
    let seed = match seed {
        HostData::I64(v) if v.len() == 1 => v[0] as u64,
        HostData::I32(v) if v.len() == 1 => v[0] as u32 as u64,
        other => return Err(format!("the seed must be one integer, got {} x {}", other.len(), other.dtype())),
    };
    match out {
        HostData::F32(o) if o.len() >= 1 << 18 && rayon::current_num_threads() > 1 => {
            // Counter-based: the two halves are drawn independently.
            let mid = o.len() / 8 * 4;
            let (a, b) = o.split_at_mut(mid);
            rayon::join(
                || crate::random::uniform_f32_from(seed, stream, 0, a),
                || crate::random::uniform_f32_from(seed, stream, mid, b),
            );
        }
        HostData::F32(o) => crate::random::uniform_f32(seed, stream, o),
        other => {
            let mut tmp = vec![0f32; other.len()];
            crate::random::uniform_f32(seed, stream, &mut tmp);
            super::numeric::fill_from_f64(other, tmp.into_iter().map(f64::from));
        }
    }
    Ok(())
}
