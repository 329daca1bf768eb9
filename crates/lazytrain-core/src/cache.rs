//! The compile cache: executables keyed by the structural hash of the cut
//! graph, and the explanation of a miss.

use crate::backend::Executable;
use crate::ir::{Graph, Op};
use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex};

/// A cached compilation.
struct Entry {
    graph: Arc<Graph>,
    executable: Arc<dyn Executable>,
}

#[derive(Default)]
struct State {
    by_hash: FxHashMap<u64, Vec<Arc<Entry>>>,
    by_site: FxHashMap<String, Vec<Arc<Graph>>>,
}

/// Executables by graph structure. One cache can serve several devices (the
/// replicas of a data-parallel run compile each step once between them).
#[derive(Default)]
pub struct CompileCache {
    state: Mutex<State>,
    compiling: Mutex<()>,
}

impl CompileCache {
    /// An empty cache.
    pub fn new() -> CompileCache {
        CompileCache::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Held while compiling, so devices sharing the cache compile a graph once.
    pub(crate) fn compile_guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.compiling.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The executable compiled for a graph equal to `graph`, if any.
    pub fn get(&self, hash: u64, graph: &Graph) -> Option<Arc<dyn Executable>> {
        let state = self.lock();
        let entries = state.by_hash.get(&hash)?;
        entries.iter().find(|e| *e.graph == *graph).map(|e| e.executable.clone())
    }

    /// Store an executable for `graph`, compiled at `site`.
    pub fn insert(&self, hash: u64, graph: Arc<Graph>, site: &str, executable: Arc<dyn Executable>) {
        let mut state = self.lock();
        state.by_site.entry(site.to_string()).or_default().push(graph.clone());
        state.by_hash.entry(hash).or_default().push(Arc::new(Entry { graph, executable }));
    }

    /// Number of cached executables.
    pub fn len(&self) -> usize {
        self.lock().by_hash.values().map(Vec::len).sum()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Why `graph` missed: the differences from the nearest graph cached for
    /// the same sync site, or that the site has never compiled.
    pub fn explain_miss(&self, site: &str, graph: &Graph) -> String {
        let state = self.lock();
        let Some(candidates) = state.by_site.get(site) else {
            return "first compile at this site".to_string();
        };
        candidates
            .iter()
            .map(|old| explain_difference(old, graph))
            .min_by_key(|(score, _)| *score)
            .map(|(_, reason)| reason)
            .unwrap_or_else(|| "first compile at this site".to_string())
    }
}

/// Describe how `new` differs from `old`, with a score (smaller = nearer).
pub fn explain_difference(old: &Graph, new: &Graph) -> (usize, String) {
    let mut reasons = Vec::new();
    let (old_sig, new_sig) = (old.param_signature(), new.param_signature());
    if old_sig.len() != new_sig.len() {
        reasons.push(format!("the number of inputs changed from {} to {}", old_sig.len(), new_sig.len()));
    }
    for (k, (a, b)) in old_sig.iter().zip(&new_sig).enumerate() {
        match (a, b) {
            (Some((sa, da)), Some((sb, db))) if sa != sb || da != db => {
                reasons.push(format!("input {k} changed shape from {da}{sa} to {db}{sb}"));
            }
            _ => {}
        }
    }
    if reasons.is_empty() && old.donated != new.donated {
        reasons.push(format!(
            "which input buffers are donated changed (was {:?}, now {:?}); keep or drop old handles consistently",
            old.donated, new.donated
        ));
    }
    if reasons.is_empty() {
        let first_diff = old.nodes.iter().zip(&new.nodes).position(|(a, b)| a != b);
        match first_diff {
            Some(n) => {
                let (a, b) = (&old.nodes[n], &new.nodes[n]);
                match (&a.op, &b.op) {
                    (Op::Constant(va), Op::Constant(vb)) if va != vb => {
                        reasons.push(format!("the constant at node %{n} changed from {va} to {vb}; pass values that change as inputs (Tensor::scalar) rather than constants"));
                    }
                    _ => reasons.push(format!(
                        "the op sequence differs at node %{n}: was {} {}{}, now {} {}{}",
                        a.op.name(),
                        a.dtype,
                        a.shape,
                        b.op.name(),
                        b.dtype,
                        b.shape
                    )),
                }
            }
            None if old.nodes.len() != new.nodes.len() => {
                reasons.push(format!("the graph grew from {} to {} nodes", old.nodes.len(), new.nodes.len()));
            }
            None => {
                reasons.push(format!("the outputs changed from {} to {} values", old.outputs.len(), new.outputs.len()))
            }
        }
    }
    let differing_nodes =
        old.nodes.iter().zip(&new.nodes).filter(|(a, b)| a != b).count() + old.nodes.len().abs_diff(new.nodes.len());
    (differing_nodes, reasons.join("; "))
}
