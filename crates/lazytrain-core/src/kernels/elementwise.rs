//! Elementwise kernels: unary, binary, compare, select, iota, random.

use super::numeric::{FloatLike, IntLike, Real};
use crate::ir::{BinaryOp, CmpOp, UnaryOp};
use crate::storage::HostData;

fn map1<T: FloatLike>(x: &[T], o: &mut [T], f: impl Fn(T::Math) -> T::Math) {
    for (o, x) in o.iter_mut().zip(x) {
        *o = T::narrow(f(x.widen()));
    }
}

fn float_unary<T: FloatLike>(op: UnaryOp, x: &[T], o: &mut [T]) {
    match op {
        UnaryOp::Neg => map1(x, o, |v| -v),
        UnaryOp::Exp => map1(x, o, Real::exp),
        UnaryOp::Log => map1(x, o, Real::ln),
        UnaryOp::Sqrt => map1(x, o, Real::sqrt),
        UnaryOp::Rsqrt => map1(x, o, |v| T::Math::ONE / v.sqrt()),
        UnaryOp::Tanh => map1(x, o, Real::tanh),
        UnaryOp::Erf => map1(x, o, Real::erf),
        UnaryOp::Abs => map1(x, o, Real::abs),
        UnaryOp::Recip => map1(x, o, |v| T::Math::ONE / v),
    }
}

fn int_unary<T: IntLike>(op: UnaryOp, x: &[T], o: &mut [T]) -> Result<(), String> {
    let f: fn(i64) -> i64 = match op {
        UnaryOp::Neg => i64::wrapping_neg,
        UnaryOp::Abs => i64::wrapping_abs,
        other => return Err(format!("{} is not defined on integers", other.name())),
    };
    for (o, x) in o.iter_mut().zip(x) {
        *o = T::from_i64(f(x.to_i64()));
    }
    Ok(())
}

/// `out = op(x)`.
pub(crate) fn unary(op: UnaryOp, x: &HostData, out: &mut HostData) -> Result<(), String> {
    match (x, out) {
        (HostData::F32(x), HostData::F32(o)) => float_unary(op, x, o),
        (HostData::F64(x), HostData::F64(o)) => float_unary(op, x, o),
        (HostData::BF16(x), HostData::BF16(o)) => float_unary(op, x, o),
        (HostData::F16(x), HostData::F16(o)) => float_unary(op, x, o),
        (HostData::I64(x), HostData::I64(o)) => int_unary(op, x, o)?,
        (HostData::I32(x), HostData::I32(o)) => int_unary(op, x, o)?,
        (HostData::U8(x), HostData::U8(o)) => int_unary(op, x, o)?,
        (x, o) => return Err(format!("{} got {} input for {} output", op.name(), x.dtype(), o.dtype())),
    }
    Ok(())
}

fn map2<T: FloatLike>(a: &[T], b: &[T], o: &mut [T], f: impl Fn(T::Math, T::Math) -> T::Math) {
    for ((o, a), b) in o.iter_mut().zip(a).zip(b) {
        *o = T::narrow(f(a.widen(), b.widen()));
    }
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

fn float_binary<T: FloatLike>(op: BinaryOp, a: &[T], b: &[T], o: &mut [T]) {
    match op {
        BinaryOp::Add => map2(a, b, o, |x, y| x + y),
        BinaryOp::Sub => map2(a, b, o, |x, y| x - y),
        BinaryOp::Mul => map2(a, b, o, |x, y| x * y),
        BinaryOp::Div => map2(a, b, o, |x, y| x / y),
        BinaryOp::Max => map2(a, b, o, nan_max),
        BinaryOp::Min => map2(a, b, o, nan_min),
        BinaryOp::Pow => map2(a, b, o, Real::powf),
    }
}

fn int_binary<T: IntLike>(op: BinaryOp, a: &[T], b: &[T], o: &mut [T]) -> Result<(), String> {
    let f: fn(i64, i64) -> i64 = match op {
        BinaryOp::Add => i64::wrapping_add,
        BinaryOp::Sub => i64::wrapping_sub,
        BinaryOp::Mul => i64::wrapping_mul,
        BinaryOp::Div => |x, y| if y == 0 { 0 } else { x.wrapping_div(y) },
        BinaryOp::Max => i64::max,
        BinaryOp::Min => i64::min,
        BinaryOp::Pow => return Err("pow is not defined on integers".into()),
    };
    for ((o, a), b) in o.iter_mut().zip(a).zip(b) {
        *o = T::from_i64(f(a.to_i64(), b.to_i64()));
    }
    Ok(())
}

/// `out = a op b` for same-shape inputs.
pub(crate) fn binary(op: BinaryOp, a: &HostData, b: &HostData, out: &mut HostData) -> Result<(), String> {
    match (a, b, out) {
        (HostData::F32(a), HostData::F32(b), HostData::F32(o)) => float_binary(op, a, b, o),
        (HostData::F64(a), HostData::F64(b), HostData::F64(o)) => float_binary(op, a, b, o),
        (HostData::BF16(a), HostData::BF16(b), HostData::BF16(o)) => float_binary(op, a, b, o),
        (HostData::F16(a), HostData::F16(b), HostData::F16(o)) => float_binary(op, a, b, o),
        (HostData::I64(a), HostData::I64(b), HostData::I64(o)) => int_binary(op, a, b, o)?,
        (HostData::I32(a), HostData::I32(b), HostData::I32(o)) => int_binary(op, a, b, o)?,
        (HostData::U8(a), HostData::U8(b), HostData::U8(o)) => int_binary(op, a, b, o)?,
        (a, b, _) => return Err(format!("{} got {} and {} inputs", op.name(), a.dtype(), b.dtype())),
    }
    Ok(())
}

fn cmp_slices<T: PartialOrd>(op: CmpOp, a: &[T], b: &[T], o: &mut [bool]) {
    let f: fn(&T, &T) -> bool = match op {
        CmpOp::Eq => |x, y| x == y,
        CmpOp::Ne => |x, y| x != y,
        CmpOp::Lt => |x, y| x < y,
        CmpOp::Le => |x, y| x <= y,
        CmpOp::Gt => |x, y| x > y,
        CmpOp::Ge => |x, y| x >= y,
    };
    for ((o, a), b) in o.iter_mut().zip(a).zip(b) {
        *o = f(a, b);
    }
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

fn select_slices<T: Copy>(c: &[bool], a: &[T], b: &[T], o: &mut [T]) {
    for (((o, c), a), b) in o.iter_mut().zip(c).zip(a).zip(b) {
        *o = if *c { *a } else { *b };
    }
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
        HostData::F32(o) => crate::random::uniform_f32(seed, stream, o),
        other => {
            let mut tmp = vec![0f32; other.len()];
            crate::random::uniform_f32(seed, stream, &mut tmp);
            super::numeric::fill_from_f64(other, tmp.into_iter().map(f64::from));
        }
    }
    Ok(())
}
