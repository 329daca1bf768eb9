//! Matmul epilogues: a fused group that runs right after a matmul and reads
//! the product only at its own positions (bias add, GELU, residual add, a
//! bf16 cast, the row max of logits, GELU's gradient with its bias's
//! column sums) can run on each row panel of the product as soon as the
//! panel is computed, while it is still in cache, instead of reading the
//! whole product back from memory afterwards.
//!
//! The schedule only names the pairs; a backend that computes products by
//! row panels runs them together, any other runs the two steps in order
//! (the same values either way).

use super::fusion::{Access, Fusion};
use super::memory::Operand;
use super::Step;
use crate::dtype::DType;
use crate::ir::{Graph, Op};

/// A matmul step and the group step right after it that may run as its
/// epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Epilogue {
    /// The matmul's step (the group is step `product_step + 1`).
    pub product_step: usize,
    /// The group input that is the product.
    pub product_input: usize,
    /// Rows of the product (all batch dimensions are 1).
    pub rows: usize,
    /// Elements per row.
    pub row_len: usize,
}

/// The epilogue pairs among `steps`: a single (batch 1) f32 or bf16 matmul
/// followed by a group that loads the product at its own positions over
/// the product's shape, whose reduction rows (if any) are whole product
/// rows or whole numbers of them (or which sums columns: a bias's
/// gradient), and whose outputs never take over a buffer the matmul reads
/// (the group's panels are written while later panels of the product are
/// still being computed).
pub fn matmul_epilogues(graph: &Graph, fusion: &Fusion, steps: &[Step]) -> Vec<Epilogue> {
    let mut pairs = Vec::new();
    for (k, window) in steps.windows(2).enumerate() {
        let [Step::Node { node: d, inputs: dot_inputs, splat: false, in_place: None, out_strides: None, .. }, Step::Group { group, outputs, .. }] =
            window
        else {
            continue;
        };
        let node = &graph.nodes[*d];
        let dims = node.shape.dims();
        if !matches!(node.op, Op::Dot { .. })
            || !matches!(node.dtype, DType::F32 | DType::BF16)
            || dims.len() < 2
            || dims[..dims.len() - 2].iter().any(|&b| b != 1)
        {
            continue;
        }
        let (rows, row_len) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let group = &fusion.groups[*group];
        let Some(product_input) = group.inputs.iter().position(|&x| x == *d) else { continue };
        let loads_in_place =
            group.loads.iter().filter(|load| load.input == product_input).all(|load| load.access == Access::Contiguous);
        // A group summing columns splits its rows at the canonical middle
        // row (between panels or inside one: a product row boundary), and
        // sums nothing else.
        let whole_rows = match group.column_len {
            0 => {
                group.reduce_inner == 0
                    || row_len.is_multiple_of(group.reduce_inner)
                    || group.reduce_inner.is_multiple_of(row_len)
            }
            columns => group.reduce_inner == 0 && columns.is_multiple_of(row_len),
        };
        let takes_operand = dot_inputs.iter().any(|op| match op {
            Operand::Slot(s) => outputs.contains(s),
            Operand::Param(_) | Operand::Fused => false,
        });
        if loads_in_place && whole_rows && !takes_operand && group.shape.iter().product::<usize>() == rows * row_len {
            pairs.push(Epilogue { product_step: k, product_input, rows, row_len });
        }
    }
    pairs
}
