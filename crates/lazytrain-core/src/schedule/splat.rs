//! Splat nodes: single values a graph broadcasts, kept as one element.

use crate::ir::{Graph, Op};

/// Nodes kept as one element: splat constants and broadcasts of a single
/// value, read only by elementwise kernels (which broadcast a one-element
/// operand). They are never materialised at full size.
pub fn splat_nodes(graph: &Graph) -> Vec<bool> {
    let mut only_elementwise_readers = vec![true; graph.nodes.len()];
    for node in &graph.nodes {
        let broadcasting_reader = matches!(node.op, Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Compare(_));
        for input in &node.inputs {
            only_elementwise_readers[input.index()] &= broadcasting_reader;
        }
    }
    for out in &graph.outputs {
        only_elementwise_readers[out.index()] = false;
    }
    let mut single_value = vec![false; graph.nodes.len()];
    let mut splat = vec![false; graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        single_value[i] = match node.op {
            Op::Constant(_) => true,
            Op::Expand | Op::Reshape => {
                let input = node.inputs[0].index();
                single_value[input] || graph.nodes[input].shape.numel() == 1
            }
            _ => node.shape.numel() == 1,
        };
        splat[i] = single_value[i] && only_elementwise_readers[i] && node.shape.numel() > 1;
    }
    splat
}
