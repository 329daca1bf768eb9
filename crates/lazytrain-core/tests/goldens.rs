//! Every primitive and composite against PyTorch (fixtures/goldens.json,
//! produced by fixtures/gen_goldens.py; the torch version is in the file).
//! Floats must agree to 1e-5 relative (1e-6 absolute near zero); integer and
//! bool results exactly, on every backend.

use lazytrain_core::{DType, Device, HostData, Result, Tensor};
use serde_json::Value;

fn dtype(name: &str) -> DType {
    match name {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        "i64" => DType::I64,
        "bool" => DType::Bool,
        other => panic!("fixture dtype {other}"),
    }
}

fn shape(v: &Value) -> Vec<usize> {
    v.as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect()
}

fn tensor(v: &Value, dev: &Device) -> Tensor {
    let data: Vec<f64> = v["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    let host = match dtype(v["dtype"].as_str().unwrap()) {
        DType::F32 => HostData::F32(data.iter().map(|&x| x as f32).collect()),
        DType::I64 => HostData::I64(data.iter().map(|&x| x as i64).collect()),
        DType::Bool => HostData::Bool(data.iter().map(|&x| x != 0.0).collect()),
        other => panic!("fixture input dtype {other}"),
    };
    Tensor::from_host(host, shape(&v["shape"]), dev).unwrap()
}

fn axes(v: &Value) -> Vec<isize> {
    v.as_array().unwrap().iter().map(|a| a.as_i64().unwrap() as isize).collect()
}

fn usizes(v: &Value) -> Vec<usize> {
    shape(v)
}

fn run(op: &str, attrs: &Value, x: &[Tensor], dev: &Device) -> Result<Tensor> {
    let int = |k: &str| attrs[k].as_i64().unwrap();
    Ok(match op {
        "neg" => x[0].neg()?,
        "exp" => x[0].exp()?,
        "log" => x[0].log()?,
        "sqrt" => x[0].sqrt()?,
        "rsqrt" => x[0].rsqrt()?,
        "tanh" => x[0].tanh()?,
        "erf" => x[0].erf()?,
        "abs" => x[0].abs()?,
        "recip" => x[0].recip()?,
        "cast" => x[0].cast(dtype(attrs["dtype"].as_str().unwrap()))?,
        "add" => x[0].add(&x[1])?,
        "sub" => x[0].sub(&x[1])?,
        "mul" => x[0].mul(&x[1])?,
        "div" => x[0].div(&x[1])?,
        "maximum" => x[0].maximum(&x[1])?,
        "minimum" => x[0].minimum(&x[1])?,
        "pow" => x[0].pow(&x[1])?,
        "eq" => x[0].eq(&x[1])?,
        "ne" => x[0].ne(&x[1])?,
        "lt" => x[0].lt(&x[1])?,
        "le" => x[0].le(&x[1])?,
        "gt" => x[0].gt(&x[1])?,
        "ge" => x[0].ge(&x[1])?,
        "select" => Tensor::select(&x[0], &x[1], &x[2])?,
        "sum" => x[0].sum(&axes(&attrs["axes"]), attrs["keepdim"].as_bool().unwrap())?,
        "max" => x[0].max(&axes(&attrs["axes"]), attrs["keepdim"].as_bool().unwrap())?,
        "mean" => x[0].mean(&axes(&attrs["axes"]), attrs["keepdim"].as_bool().unwrap())?,
        "reshape" => x[0].reshape(usizes(&attrs["shape"]))?,
        "permute" => x[0].permute(&usizes(&attrs["perm"]))?,
        "transpose" => x[0].transpose(int("a") as isize, int("b") as isize)?,
        "broadcast_to" => x[0].broadcast_to(&usizes(&attrs["shape"]).into())?,
        "narrow" => x[0].narrow(int("axis") as isize, int("start") as usize, int("len") as usize)?,
        "slice" => x[0].slice(&usizes(&attrs["starts"]), &usizes(&attrs["sizes"]))?,
        "cat" => Tensor::cat(&x.iter().collect::<Vec<_>>(), int("axis") as isize)?,
        "pad" => x[0].pad(&usizes(&attrs["low"]), &usizes(&attrs["high"]), attrs["value"].as_f64().unwrap())?,
        "gather" => x[0].gather(int("axis") as isize, &x[1])?,
        "scatter_add" => x[0].scatter_add(int("axis") as isize, &x[1], &x[2])?,
        "matmul" => x[0].matmul(&x[1])?,
        "matmul_transposed" => {
            x[0].matmul_transposed(&x[1], attrs["lhs_t"].as_bool().unwrap(), attrs["rhs_t"].as_bool().unwrap())?
        }
        "arange" => Tensor::arange(int("n") as usize, dtype(attrs["dtype"].as_str().unwrap()), dev)?,
        "softmax" => x[0].softmax(int("axis") as isize)?,
        "log_softmax" => x[0].log_softmax(int("axis") as isize)?,
        "gelu" => x[0].gelu()?,
        "layer_norm" => x[0].layer_norm(x.get(1), x.get(2), attrs["eps"].as_f64().unwrap())?,
        "cross_entropy" => x[0].cross_entropy(&x[1], int("ignore_index"))?,
        "embedding" => x[0].embedding(&x[1])?,
        other => panic!("no runner for fixture op {other}"),
    })
}

#[test]
fn primitives_and_composites_match_pytorch() {
    let fixture: Value = serde_json::from_str(include_str!("fixtures/goldens.json")).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() > 60, "fixture has {} cases", cases.len());
    let mut failures = Vec::new();
    for (backend, case) in lazytrain_core::backend::BACKEND_NAMES.iter().flat_map(|b| cases.iter().map(move |c| (b, c)))
    {
        let name = format!("{} on {backend}", case["name"].as_str().unwrap());
        let dev = Device::on_backend(backend).unwrap();
        let inputs: Vec<Tensor> = case["inputs"].as_array().unwrap().iter().map(|v| tensor(v, &dev)).collect();
        let out =
            run(case["op"].as_str().unwrap(), &case["attrs"], &inputs, &dev).unwrap_or_else(|e| panic!("{name}: {e}"));
        let expected = &case["output"];
        let want_dtype = dtype(expected["dtype"].as_str().unwrap());
        assert_eq!(out.dtype(), want_dtype, "{name}: dtype");
        assert_eq!(out.dims(), shape(&expected["shape"]).as_slice(), "{name}: shape");
        let got = out.to_f64_vec().unwrap();
        let want: Vec<f64> = expected["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let ok = if want_dtype.is_float() { (g - w).abs() <= 1e-5 * w.abs() + 1e-6 } else { g == w };
            if !ok {
                failures.push(format!("{name}[{i}]: got {g}, want {w}"));
                break;
            }
        }
    }
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
}
