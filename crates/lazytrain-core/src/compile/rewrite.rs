//! The rebuild loop every pass shares.

use crate::ir::{Graph, GraphBuilder, Node, NodeId};

/// What a pass decides for one node.
pub(crate) enum Rewrite {
    /// Emit this node (inputs already refer to the new graph).
    Emit(Node),
    /// Use an existing node of the new graph instead.
    Forward(NodeId),
}

/// Rebuild `graph` node by node. `decide` sees each node with inputs already
/// renamed into the new graph, and the new graph built so far (to which it
/// may add the nodes a replacement reads).
pub(crate) fn rebuild(graph: &Graph, mut decide: impl FnMut(&mut GraphBuilder, Node) -> Rewrite) -> Graph {
    let mut builder = GraphBuilder::new();
    let mut map: Vec<NodeId> = Vec::with_capacity(graph.nodes.len());
    for node in &graph.nodes {
        let mut renamed = node.clone();
        for input in renamed.inputs.iter_mut() {
            *input = map[input.index()];
        }
        let id = match decide(&mut builder, renamed) {
            Rewrite::Emit(n) => builder.push(n),
            Rewrite::Forward(id) => id,
        };
        map.push(id);
    }
    let outputs = graph.outputs.iter().map(|o| map[o.index()]).collect();
    builder.finish_like(outputs, graph)
}
