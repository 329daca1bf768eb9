//! The reference interpreter: evaluates a graph as it is (no passes) on the
//! [`ReferenceBackend`]: one naive kernel per node, no fusion, no in-place
//! kernels. It is the oracle every optimised path is tested against.

use crate::backend::{Backend, ReferenceBackend};
use crate::error::{Error, Result};
use crate::ir::Graph;
use crate::storage::{Buffer, HostData};
use std::sync::Arc;

/// Evaluate `graph` on `params` (indexed like `Op::Parameter`) and return its outputs.
pub fn interpret(graph: &Graph, params: &[&HostData]) -> Result<Vec<HostData>> {
    if params.len() < graph.num_params {
        return Err(Error::Execution {
            node: 0,
            op: "parameter",
            detail: format!("parameter {} was not supplied ({} given)", params.len(), params.len()),
        });
    }
    let executable = ReferenceBackend.compile(graph)?;
    let inputs = params[..graph.num_params].iter().map(|p| Arc::new(Buffer::new((*p).clone()))).collect();
    let outputs = executable.run(inputs, &Default::default())?;
    outputs
        .iter()
        .map(|b| {
            b.wait().cloned().map_err(|message| Error::Execution { node: 0, op: "output", detail: message.to_string() })
        })
        .collect()
}
