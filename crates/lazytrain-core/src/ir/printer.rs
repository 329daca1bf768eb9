//! A readable text form of a graph, for dumps and debugging.

use super::graph::Graph;
use super::op::Op;
use std::fmt;

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "graph(params={}, nodes={}, hash={:016x}) {{",
            self.num_params,
            self.nodes.len(),
            self.structural_hash()
        )?;
        for (i, node) in self.nodes.iter().enumerate() {
            write!(f, "  %{i}: {}{} = {}", node.dtype, node.shape, node.op.name())?;
            match &node.op {
                Op::Parameter(k) if self.donated.get(*k) == Some(&true) => write!(f, "({k}, donated)")?,
                Op::Parameter(k) => write!(f, "({k})")?,
                Op::Constant(v) => write!(f, "({v})")?,
                Op::Iota { axis } => write!(f, "(axis={axis})")?,
                Op::RngUniform { stream } => write!(f, "(stream={stream})")?,
                Op::Reduce { axes, .. } => write!(f, "(axes={axes:?})")?,
                Op::Permute(perm) => write!(f, "(perm={perm:?})")?,
                Op::Slice { starts } => write!(f, "(starts={starts:?})")?,
                Op::Concat { axis } | Op::Gather { axis } | Op::ScatterAdd { axis } => write!(f, "(axis={axis})")?,
                Op::Pad { low, high, value } => write!(f, "(low={low:?}, high={high:?}, value={value})")?,
                Op::Dot { lhs_t, rhs_t } => write!(f, "(lhs_t={lhs_t}, rhs_t={rhs_t})")?,
                Op::AllReduce(kind) => write!(f, "({kind:?})")?,
                // The name says everything about these.
                Op::Unary(_)
                | Op::Cast
                | Op::Binary(_)
                | Op::Compare(_)
                | Op::Select
                | Op::Reshape
                | Op::Expand
                | Op::StopGradient => {}
            }
            for (j, input) in node.inputs.iter().enumerate() {
                write!(f, "{}%{}", if j == 0 { " " } else { ", " }, input.0)?;
            }
            writeln!(f)?;
        }
        write!(f, "  return")?;
        for (j, out) in self.outputs.iter().enumerate() {
            write!(f, "{}%{}", if j == 0 { " " } else { ", " }, out.0)?;
        }
        writeln!(f, "\n}}")
    }
}
