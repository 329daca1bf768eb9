//! A weight cast to bf16 under autocast and then updated by `assign` gets
//! the bf16 copy of its new value from the update's own step: the next
//! steps read that copy instead of casting the weight again (a kernel fewer
//! per weight), with the same values, and an assignment never leaves a
//! stale copy behind. The memory plan gives each new copy the slot of the
//! copy it replaces, and nothing else.

use half::bf16;
use lazytrain_core::ir::{GraphBuilder, Node, NodeId, Op};
use lazytrain_core::schedule::{Capabilities, Operand, Schedule};
use lazytrain_core::{DType, Device, Result, Shape, Tensor};

/// Rows of the fixed batch `[ROWS, IN]` a weight `[OUT, IN]` trains on.
const ROWS: usize = 8;
/// The weight's input width.
const IN: usize = 32;
/// The weight's output width.
const OUT: usize = 16;

fn values(len: usize, salt: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 7919 + salt * 104_729) % 2003) as f32 / 1001.0 - 1.0).collect()
}

/// Four steps of `w ← w - 0.05 ∂/∂w Σ (x wᵀ)²` with the product under bf16
/// autocast, and the weight after each. With `fresh_weights` every step
/// reads a new tensor holding the weight's values (which never has a kept
/// copy), so every step casts it.
fn train(dev: &Device, fresh_weights: bool) -> Result<Vec<Vec<f32>>> {
    let x = Tensor::from_vec(values(ROWS * IN, 1), [ROWS, IN], dev)?;
    let mut w = Tensor::from_vec(values(OUT * IN, 2), [OUT, IN], dev)?;
    w.set_requires_grad(true);
    let mut weights = Vec::new();
    for _ in 0..4 {
        if fresh_weights {
            w = Tensor::from_vec(w.to_vec::<f32>()?, [OUT, IN], dev)?;
            w.set_requires_grad(true);
        }
        let loss = {
            let _autocast = dev.autocast(DType::BF16)?;
            x.matmul_transposed(&w, false, true)?.square()?.sum_all()?
        };
        loss.backward()?;
        let lr = Tensor::scalar(0.05f32, dev);
        w.assign(&w.sub(&w.grad().expect("a gradient").mul(&lr)?)?)?;
        w.set_grad(None);
        dev.mark_step()?;
        weights.push(w.to_vec::<f32>()?);
    }
    Ok(weights)
}

#[test]
fn updated_weights_are_read_through_their_kept_copies_with_the_same_values() -> Result<()> {
    let kept = Device::cpu();
    let fresh = Device::cpu();
    let (with_copies, casting) = (train(&kept, false)?, train(&fresh, true)?);
    let bits = |w: &[Vec<f32>]| w.iter().map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>();
    assert_eq!(bits(&with_copies), bits(&casting), "the same weights after every step");
    assert_ne!(with_copies[0], with_copies[3], "the weights moved");
    // The first step casts the weight; from the second on the step reads the
    // copy the previous update wrote, so its graph has a kernel fewer.
    let events = kept.metrics().compile_events;
    assert_eq!(events.len(), 2, "{}", kept.metrics_report());
    assert!(events[1].kernels < events[0].kernels, "{}", kept.metrics_report());
    Ok(())
}

#[test]
fn an_assignment_replaces_the_kept_copy() -> Result<()> {
    let dev = Device::cpu();
    let w = Tensor::from_vec(values(OUT * IN, 3), [OUT, IN], &dev)?;
    let rounded = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect::<Vec<_>>();
    let cast = |w: &Tensor| -> Result<Vec<f32>> { w.cast(DType::BF16)?.cast(DType::F32)?.to_vec::<f32>() };
    // Cast once (asking for copies), then update: the update keeps a copy.
    assert_eq!(cast(&w)?, rounded(&values(OUT * IN, 3)));
    w.assign(&w.mul(&Tensor::scalar(2.0f32, &dev))?)?;
    dev.mark_step()?;
    let doubled: Vec<f32> = values(OUT * IN, 3).iter().map(|x| 2.0 * x).collect();
    assert_eq!(cast(&w)?, rounded(&doubled), "read through the kept copy");
    // A value from the host, read before any sync, and again after one.
    let loaded = values(OUT * IN, 4);
    w.assign(&Tensor::from_vec(loaded.clone(), [OUT, IN], &dev)?)?;
    assert_eq!(cast(&w)?, rounded(&loaded), "the copy of the loaded value, pending");
    dev.mark_step()?;
    assert_eq!(cast(&w)?, rounded(&loaded), "and computed");
    Ok(())
}

/// A parameter of `dtype` over `[64, 64]`.
fn param(b: &mut GraphBuilder, k: usize, dtype: DType) -> NodeId {
    b.push(Node { op: Op::Parameter(k), inputs: vec![], shape: Shape::new([64, 64]), dtype })
}

/// A node of `op` over `inputs`, shaped and typed as its first input.
fn node(b: &mut GraphBuilder, op: Op, inputs: Vec<NodeId>) -> NodeId {
    let (shape, dtype) = (b.node(inputs[0]).shape.clone(), b.node(inputs[0]).dtype);
    b.push(Node { op, inputs, shape, dtype })
}

#[test]
fn a_donated_inputs_slot_goes_to_a_graph_output_only() {
    // A donated bf16 input (last step's copy) read first, an intermediate
    // of its size made after it died, and an output of its size at the end.
    let mut b = GraphBuilder::new();
    let (old_copy, x) = (param(&mut b, 0, DType::BF16), param(&mut b, 1, DType::BF16));
    let early = node(&mut b, Op::Dot { lhs_t: false, rhs_t: true }, vec![x, old_copy]);
    let late = node(&mut b, Op::Dot { lhs_t: false, rhs_t: false }, vec![early, x]);
    let new_copy = node(&mut b, Op::Unary(lazytrain_core::ir::UnaryOp::Neg), vec![late]);
    let mut graph = b.finish(vec![new_copy], 2);
    graph.donated = vec![true, false];
    let schedule =
        Schedule::new(&graph, &Capabilities { fuse: true, splat: true, in_place: true, permuted_products: true });
    let slot = |id: NodeId| match schedule.memory.operands[id.index()] {
        Operand::Slot(s) => Some(s),
        Operand::Param(_) | Operand::Fused => None,
    };
    let donated = slot(old_copy).expect("a donated input has a slot");
    assert_ne!(slot(late), Some(donated), "an intermediate never takes it");
    assert_eq!(slot(new_copy), Some(donated), "the output takes it");
}
