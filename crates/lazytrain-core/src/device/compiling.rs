//! Compile orchestration: the cache lookup, and on a miss the explained
//! recompile (optimise, schedule, lower) recorded in the metrics.

use super::Device;
use crate::backend::Executable;
use crate::compile;
use crate::error::Result;
use crate::ir::Graph;
use crate::metrics::CompileEvent;
use std::panic::Location;
use std::sync::Arc;
use std::time::Instant;

impl Device {
    /// The executable of `graph`: cached, or compiled now (one replica
    /// compiles while the others wait for it).
    pub(super) fn executable_for(
        &self,
        graph: Graph,
        hash: u64,
        location: &'static Location<'static>,
        cut_start: Instant,
    ) -> Result<Arc<dyn Executable>> {
        let cached = self.inner.cache.get(hash, &graph);
        let lookup_ms = cut_start.elapsed().as_secs_f64() * 1e3;
        self.inner.metrics.update(|m| m.lookup_ms += lookup_ms);
        if let Some(exe) = cached {
            self.inner.metrics.update(|m| m.cache_hits += 1);
            return Ok(exe);
        }
        // Replicas trace the same step at the same time: one compiles it while
        // the others wait here and then find it cached.
        let _compiling = self.inner.cache.compile_guard();
        if let Some(exe) = self.inner.cache.get(hash, &graph) {
            self.inner.metrics.update(|m| m.cache_hits += 1);
            return Ok(exe);
        }
        let site = location.to_string();
        let reason = self.inner.cache.explain_miss(&site, &graph);
        let start = Instant::now();
        let optimized = compile::optimize(&graph, compile::dump_dir_from_env().as_deref())?;
        let exe = self.inner.backend.compile(&optimized)?;
        let compile_ms = start.elapsed().as_secs_f64() * 1e3;
        let event = CompileEvent {
            site: site.clone(),
            hash: format!("{hash:016x}"),
            nodes: graph.nodes.len(),
            kernels: exe.stats().kernels,
            fused_kernels: exe.stats().fused_kernels,
            compile_ms,
            reason,
        };
        if self.inner.debug {
            eprintln!(
                "[lazytrain] compile {} at {}: {} nodes -> {} kernels ({} fused) in {:.2} ms ({})",
                event.hash, event.site, event.nodes, event.kernels, event.fused_kernels, event.compile_ms, event.reason
            );
        }
        self.inner.metrics.record_compile(event);
        self.inner.cache.insert(hash, Arc::new(graph), &site, exe.clone());
        Ok(exe)
    }
}
