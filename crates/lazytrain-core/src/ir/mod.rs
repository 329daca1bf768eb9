//! The intermediate representation: one node type in a hash-consed arena.
//!
//! A [`Graph`] is a topologically ordered list of [`Node`]s (each input id is
//! smaller than the node's own id) plus the list of outputs. Identical nodes
//! exist once ([`GraphBuilder`] hash-conses them), so common subexpressions
//! are shared by construction and a graph's structural hash is a plain hash
//! of its nodes.

mod graph;
pub mod infer;
mod op;
mod printer;
pub mod verify;

pub use graph::{Graph, GraphBuilder, Node, NodeId};
pub use op::{AllReduceOp, BinaryOp, CmpOp, Op, ReduceOp, UnaryOp};
