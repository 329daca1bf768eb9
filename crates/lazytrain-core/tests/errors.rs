//! Every class of trace-time error names the op, the shapes/dtypes and the
//! caller's line; runtime data errors are errors, not panics.

use lazytrain_core::{DType, Device, Error, RuleKind, Tensor};

fn t(dev: &Device, shape: &[usize]) -> Tensor {
    Tensor::from_vec(vec![0.5f32; shape.iter().product()], shape, dev).unwrap()
}

fn assert_message(e: &Error, line: u32, parts: &[&str]) {
    let msg = e.to_string();
    for p in parts {
        assert!(msg.contains(p), "`{msg}` should contain `{p}`");
    }
    assert!(msg.contains(&format!("errors.rs:{line}:")), "`{msg}` should name line {line}");
}

#[test]
fn matmul_dimension_mismatch() {
    let dev = Device::cpu();
    let (a, b) = (t(&dev, &[2, 3]), t(&dev, &[4, 5]));
    let line = line!() + 1;
    let e = a.matmul(&b).unwrap_err();
    assert!(matches!(e, Error::Op { kind: RuleKind::Shape, op: "matmul", .. }));
    assert_message(&e, line, &["matmul", "[2, 3]", "[4, 5]", "3 with 4"]);
}

#[test]
fn bad_broadcast() {
    let dev = Device::cpu();
    let (a, b) = (t(&dev, &[2, 3]), t(&dev, &[4]));
    let line = line!() + 1;
    let e = a.add(&b).unwrap_err();
    assert!(matches!(e, Error::Op { kind: RuleKind::Shape, .. }));
    assert_message(&e, line, &["add", "[2, 3]", "[4]", "broadcast"]);
}

#[test]
fn axis_out_of_range() {
    let dev = Device::cpu();
    let a = t(&dev, &[2, 3]);
    let line = line!() + 1;
    let e = a.sum(&[2], false).unwrap_err();
    assert!(matches!(e, Error::Op { kind: RuleKind::Axis, .. }));
    assert_message(&e, line, &["sum", "axis 2", "[2, 3]"]);
    let line = line!() + 1;
    let e = a.softmax(-3).unwrap_err();
    assert_message(&e, line, &["max", "axis -3"]);
}

#[test]
fn dtype_mix() {
    let dev = Device::cpu();
    let a = t(&dev, &[3]);
    let b = Tensor::from_vec(vec![1i64, 2, 3], [3], &dev).unwrap();
    let line = line!() + 1;
    let e = a.mul(&b).unwrap_err();
    assert!(matches!(e, Error::Op { kind: RuleKind::DType, .. }));
    assert_message(&e, line, &["mul", "f32", "i64", "cast"]);
    let line = line!() + 1;
    let e = b.exp().unwrap_err();
    assert_message(&e, line, &["exp", "floating-point", "i64"]);
}

#[test]
fn bad_arguments() {
    let dev = Device::cpu();
    let a = t(&dev, &[2, 3]);
    let line = line!() + 1;
    let e = a.narrow(1, 2, 5).unwrap_err();
    assert!(matches!(e, Error::Op { kind: RuleKind::Argument, .. }));
    assert_message(&e, line, &["slice", "out of bounds", "[2, 3]"]);
    let line = line!() + 1;
    let e = a.reshape([4, 2]).unwrap_err();
    assert_message(&e, line, &["reshape", "[2, 3]", "[4, 2]"]);
    let line = line!() + 1;
    let e = a.permute(&[0, 0]).unwrap_err();
    assert_message(&e, line, &["permute", "[0, 0]"]);
}

#[test]
fn host_data_of_the_wrong_length_or_type() {
    let dev = Device::cpu();
    let line = line!() + 1;
    let e = Tensor::from_vec(vec![1f32; 5], [2, 3], &dev).unwrap_err();
    assert_message(&e, line, &["5 values", "[2, 3]"]);
    let a = t(&dev, &[2]);
    let line = line!() + 1;
    let e = a.to_vec::<i64>().unwrap_err();
    assert_message(&e, line, &["i64", "f32", "cast"]);
    let line = line!() + 1;
    let e = a.item::<f32>().unwrap_err();
    assert_message(&e, line, &["item", "[2]"]);
}

#[test]
fn tensors_from_two_devices() {
    let (d1, d2) = (Device::cpu(), Device::cpu());
    let (a, b) = (t(&d1, &[2]), t(&d2, &[2]));
    let line = line!() + 1;
    let e = a.add(&b).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }));
    assert_message(&e, line, &["add", "different devices"]);
}

#[test]
fn out_of_range_indices_fail_at_run_time_without_panicking() {
    let dev = Device::cpu();
    let table = t(&dev, &[4, 2]);
    let ids = Tensor::from_vec(vec![1i64, 9], [2], &dev).unwrap();
    let rows = table.embedding(&ids).unwrap();
    let e = dev.sync().unwrap_err();
    assert!(e.to_string().contains("index 9 is out of range for axis 0 of size 4"), "{e}");
    let e = rows.to_vec::<f32>().unwrap_err();
    assert!(e.to_string().contains("could not be computed"), "{e}");
    // The device keeps working.
    let ok = Tensor::from_vec(vec![3i64], [1], &dev).unwrap();
    assert_eq!(table.embedding(&ok).unwrap().to_vec::<f32>().unwrap(), vec![0.5, 0.5]);
    let _ = DType::F32;
}

/// Sizes whose arithmetic would overflow `usize` are argument or shape
/// errors at the caller's line, never a wrapped size or a panic.
#[test]
fn sizes_that_overflow_are_refused() {
    let dev = Device::cpu();
    let a = t(&dev, &[2, 3]);
    let line = line!() + 1;
    let e = a.narrow(0, usize::MAX, 2).unwrap_err();
    assert!(matches!(e, Error::Op { kind: RuleKind::Argument, .. }));
    assert_message(&e, line, &["slice", "out of bounds", "[2, 3]"]);
    let line = line!() + 1;
    let e = a.pad(&[usize::MAX, 0], &[1, 0], 0.0).unwrap_err();
    assert_message(&e, line, &["pad", "overflow"]);
    let huge = 1usize << 33;
    let line = line!() + 1;
    let e = Tensor::zeros([huge, huge, huge], DType::F32, &dev).unwrap_err();
    assert!(matches!(e, Error::Op { kind: RuleKind::Shape, .. }));
    assert_message(&e, line, &["would not fit in memory"]);
    let empty = Tensor::zeros([0], DType::F32, &dev).unwrap();
    let line = line!() + 1;
    let e = empty.reshape([huge, huge]).unwrap_err();
    assert_message(&e, line, &["reshape", "[0]"]);
    assert_eq!(Tensor::zeros([huge, huge, 0], DType::F32, &dev).unwrap().dims(), [huge, huge, 0], "zero elements");
}
