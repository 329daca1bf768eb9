//! The reference interpreter: evaluates a graph node by node, with no passes,
//! no memory planning and a naive matmul. It is the oracle every optimised
//! path is tested against.

use crate::error::{Error, Result};
use crate::ir::{Graph, Op};
use crate::kernels::{self, MatmulKernel};
use crate::storage::HostData;

/// Evaluate `graph` on `params` (indexed like `Op::Parameter`) and return its outputs.
pub fn interpret(graph: &Graph, params: &[&HostData]) -> Result<Vec<HostData>> {
    let mut values: Vec<HostData> = Vec::with_capacity(graph.nodes.len());
    for (i, node) in graph.nodes.iter().enumerate() {
        let value = if let Op::Parameter(k) = node.op {
            let data = params.get(k).ok_or_else(|| Error::Execution {
                node: i,
                op: "parameter",
                detail: format!("parameter {k} was not supplied ({} given)", params.len()),
            })?;
            (*data).clone()
        } else {
            let inputs: Vec<&HostData> = node.inputs.iter().map(|id| &values[id.index()]).collect();
            let shapes: Vec<&[usize]> = node.inputs.iter().map(|id| graph.node(*id).shape.dims()).collect();
            let mut out = HostData::zeros(node.dtype, node.shape.numel());
            kernels::eval(node, &inputs, &shapes, &mut out, MatmulKernel::Naive)
                .map_err(|detail| Error::Execution { node: i, op: node.op.name(), detail })?;
            out
        };
        values.push(value);
    }
    Ok(graph.outputs.iter().map(|id| values[id.index()].clone()).collect())
}
