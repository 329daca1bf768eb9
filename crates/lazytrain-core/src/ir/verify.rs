//! The IR verifier: the invariants every pass must keep.

use super::graph::Graph;
use super::infer::{check_node, Meta};
use super::op::Op;

/// Check topological order, parameter numbering, outputs and every node's
/// shape/dtype rule. Returns a description of the first violation.
pub fn verify(graph: &Graph) -> Result<(), String> {
    for (i, node) in graph.nodes.iter().enumerate() {
        for input in &node.inputs {
            if input.index() >= i {
                return Err(format!("node %{i} ({}) reads %{} which does not precede it", node.op.name(), input.0));
            }
        }
        if let Op::Parameter(k) = node.op {
            if k >= graph.num_params {
                return Err(format!("node %{i} is parameter {k} but the graph has {} parameters", graph.num_params));
            }
        }
        let metas: Vec<Meta> = node.inputs.iter().map(|id| (&graph.node(*id).shape, graph.node(*id).dtype)).collect();
        check_node(node, &metas).map_err(|e| format!("node %{i}: {}", e.detail))?;
    }
    if graph.donated.len() != graph.num_params {
        return Err(format!("{} donation flags for {} parameters", graph.donated.len(), graph.num_params));
    }
    for out in &graph.outputs {
        if out.index() >= graph.nodes.len() {
            return Err(format!("output %{} does not exist", out.0));
        }
    }
    Ok(())
}
