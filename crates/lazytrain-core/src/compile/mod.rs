//! The compiler: a declared pipeline of pure, named passes over the IR.
//!
//! `optimize` runs [`PIPELINE`] in order, verifying the IR after each pass
//! (always in debug builds, or with `LAZYTRAIN_VERIFY=1`), and dumps the IR
//! before and after every pass when `LAZYTRAIN_DUMP_IR=DIR` is set. The
//! backend then plans memory and emits an executable from the result.

mod casts;
mod hoist;
mod order;
mod pads;
mod passes;
mod rewrite;

pub(crate) use casts::narrow_copies;
pub use casts::{reorder_casts, schedule_narrow_copies};
pub use hoist::hoist_product_readers;
pub use order::order_small_nodes;
pub use passes::{
    dead_code_elimination, fold_constant_indices, fold_constants, gather_from_operands, live_nodes, simplify_algebra,
    split_scatter_sums,
};

use crate::error::{Error, Result};
use crate::ir::{verify::verify, Graph};
use std::path::{Path, PathBuf};

/// One compiler pass: a pure function from graph to graph.
#[derive(Clone, Copy)]
pub struct Pass {
    /// The name used in dumps and verifier errors.
    pub name: &'static str,
    /// The transformation.
    pub run: fn(&Graph) -> Graph,
}

/// The passes `optimize` runs, in order. Common-subexpression elimination
/// needs no pass of its own: every rebuild hash-conses its nodes.
pub const PIPELINE: &[Pass] = &[
    Pass { name: "dead_code_elimination", run: dead_code_elimination },
    Pass { name: "fold_constants", run: fold_constants },
    Pass { name: "simplify_algebra", run: simplify_algebra },
    Pass { name: "split_scatter_sums", run: split_scatter_sums },
    Pass { name: "fold_constant_indices", run: fold_constant_indices },
    Pass { name: "gather_from_operands", run: gather_from_operands },
    Pass { name: "reorder_casts", run: reorder_casts },
    Pass { name: "schedule_narrow_copies", run: schedule_narrow_copies },
    Pass { name: "order_small_nodes", run: order_small_nodes },
    Pass { name: "hoist_product_readers", run: hoist_product_readers },
    Pass { name: "dead_code_elimination", run: dead_code_elimination },
];

/// Where to write IR dumps, from `LAZYTRAIN_DUMP_IR`.
pub fn dump_dir_from_env() -> Option<PathBuf> {
    std::env::var_os("LAZYTRAIN_DUMP_IR").filter(|v| !v.is_empty()).map(PathBuf::from)
}

fn verify_enabled() -> bool {
    cfg!(debug_assertions) || std::env::var("LAZYTRAIN_VERIFY").is_ok_and(|v| v == "1")
}

fn dump(dir: &Path, hash: u64, step: usize, name: &str, graph: &Graph) -> Result<()> {
    let io = |source| Error::Io { context: format!("writing an IR dump to {}", dir.display()), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(dir.join(format!("{hash:016x}-{step:02}-{name}.txt")), graph.to_string()).map_err(io)
}

/// Run the pass pipeline on `graph`.
pub fn optimize(graph: &Graph, dump_dir: Option<&Path>) -> Result<Graph> {
    let hash = graph.structural_hash();
    if let Some(dir) = dump_dir {
        dump(dir, hash, 0, "input", graph)?;
    }
    let mut current = graph.clone();
    for (i, pass) in PIPELINE.iter().enumerate() {
        current = (pass.run)(&current);
        if verify_enabled() {
            verify(&current).map_err(|detail| Error::Verify { pass: pass.name, detail })?;
        }
        if let Some(dir) = dump_dir {
            dump(dir, hash, i + 1, pass.name, &current)?;
        }
    }
    Ok(current)
}
