//! Counters and events that explain what the engine did: compiles, cache
//! hits, where syncs were forced, why graphs recompiled, bytes moved.
//!
//! Every device records into its own [`Metrics`] and into the process-wide
//! one behind [`report`] and [`snapshot`].

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::sync::{LazyLock, Mutex, MutexGuard};

/// Most compile events kept (the oldest are dropped first).
const MAX_EVENTS: usize = 1000;

/// One compilation and the reason it was needed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompileEvent {
    /// The `file:line:column` of the sync that cut the graph.
    pub site: String,
    /// The graph's structural hash, hex.
    pub hash: String,
    /// Nodes before optimisation.
    pub nodes: usize,
    /// Kernels in the executable.
    pub kernels: usize,
    /// Of those, fused elementwise kernels.
    #[serde(default)]
    pub fused_kernels: usize,
    /// Wall time of optimisation and code generation.
    pub compile_ms: f64,
    /// Why the cache missed: `first compile at this site`, or what differs
    /// from the nearest graph cached for the same site.
    pub reason: String,
}

/// A place in user code that forced a sync by reading a pending value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForcedSync {
    /// `file:line:column` of the read.
    pub location: String,
    /// How many times it forced a sync.
    pub count: u64,
}

/// A snapshot of the counters, serialisable for tools.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsReport {
    /// Graphs compiled.
    pub compiles: u64,
    /// Syncs whose graph was already compiled.
    pub cache_hits: u64,
    /// Total compile wall time.
    pub compile_ms: f64,
    /// Time spent cutting the live graph, hashing it and looking it up in
    /// the compile cache (excluding compilation).
    pub lookup_ms: f64,
    /// Executions of compiled graphs.
    pub executions: u64,
    /// Total execution wall time.
    pub execute_ms: f64,
    /// Graph cuts (explicit and forced) that had something to run.
    pub syncs: u64,
    /// Syncs forced by reading values, by call site.
    pub forced_syncs: Vec<ForcedSync>,
    /// Nodes traced.
    pub traced_nodes: u64,
    /// Bytes copied host → device.
    pub host_to_device_bytes: u64,
    /// Bytes copied device → host.
    pub device_to_host_bytes: u64,
    /// The largest planned peak of one execution: intermediate buffers,
    /// donated inputs and the inputs that are not donated.
    pub peak_execution_bytes: u64,
    /// Milliseconds the host spent waiting for an asynchronous device's results.
    pub host_wait_ms: f64,
    /// Milliseconds an asynchronous device's worker sat idle waiting for the host's next step.
    pub device_idle_ms: f64,
    /// Bytes held by live device buffers now (process-wide).
    pub live_buffer_bytes: u64,
    /// The most bytes device buffers held at once (process-wide).
    pub peak_buffer_bytes: u64,
    /// Every compilation with its reason (the newest 1000).
    pub compile_events: Vec<CompileEvent>,
}

impl MetricsReport {
    /// Total forced syncs.
    pub fn forced_sync_count(&self) -> u64 {
        self.forced_syncs.iter().map(|f| f.count).sum()
    }

    /// The report as text, in the spirit of PyTorch/XLA's metrics report.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "lazytrain metrics");
        let _ = writeln!(s, "  compiles:             {}", self.compiles);
        let _ = writeln!(s, "  cache hits:           {}", self.cache_hits);
        let _ = writeln!(s, "  compile time:         {:.3} ms", self.compile_ms);
        let _ = writeln!(s, "  cut+hash+lookup time: {:.3} ms", self.lookup_ms);
        let _ = writeln!(s, "  executions:           {}", self.executions);
        let _ = writeln!(s, "  execute time:         {:.3} ms", self.execute_ms);
        let _ = writeln!(s, "  syncs:                {}", self.syncs);
        let _ = writeln!(s, "  forced syncs:         {}", self.forced_sync_count());
        for f in &self.forced_syncs {
            let _ = writeln!(s, "    {} x{}", f.location, f.count);
        }
        let _ = writeln!(s, "  traced nodes:         {}", self.traced_nodes);
        let _ = writeln!(s, "  host->device bytes:   {}", self.host_to_device_bytes);
        let _ = writeln!(s, "  device->host bytes:   {}", self.device_to_host_bytes);
        let _ = writeln!(s, "  peak execution bytes: {}", self.peak_execution_bytes);
        let _ = writeln!(s, "  host waited on device: {:.3} ms", self.host_wait_ms);
        let _ = writeln!(s, "  device waited on host: {:.3} ms", self.device_idle_ms);
        let _ = writeln!(s, "  live buffer bytes:    {}", self.live_buffer_bytes);
        let _ = writeln!(s, "  peak buffer bytes:    {}", self.peak_buffer_bytes);
        if !self.compile_events.is_empty() {
            let _ = writeln!(s, "  compilations:");
            for e in &self.compile_events {
                let _ = writeln!(
                    s,
                    "    {} at {}: {} nodes, {} kernels ({} fused), {:.3} ms: {}",
                    e.hash, e.site, e.nodes, e.kernels, e.fused_kernels, e.compile_ms, e.reason
                );
            }
        }
        s
    }
}

/// A metrics store (one per device, plus the process-wide one).
#[derive(Debug, Default)]
pub struct Metrics {
    data: Mutex<MetricsReport>,
}

static GLOBAL: LazyLock<Metrics> = LazyLock::new(Metrics::default);

impl Metrics {
    fn lock(&self) -> MutexGuard<'_, MetricsReport> {
        self.data.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The current counters.
    pub fn snapshot(&self) -> MetricsReport {
        let mut r = self.lock().clone();
        r.live_buffer_bytes = crate::storage::live_buffer_bytes();
        r.peak_buffer_bytes = crate::storage::peak_buffer_bytes();
        r
    }

    /// The current counters as text.
    pub fn report(&self) -> String {
        self.snapshot().to_text()
    }

    /// Zero every counter.
    pub fn reset(&self) {
        *self.lock() = MetricsReport::default();
    }

    pub(crate) fn update(&self, f: impl Fn(&mut MetricsReport)) {
        f(&mut self.lock());
        f(&mut GLOBAL.lock());
    }

    pub(crate) fn record_compile(&self, event: CompileEvent) {
        self.update(|m| {
            m.compiles += 1;
            m.compile_ms += event.compile_ms;
            if m.compile_events.len() == MAX_EVENTS {
                m.compile_events.remove(0);
            }
            m.compile_events.push(event.clone());
        });
    }

    pub(crate) fn record_forced_sync(&self, location: &str) {
        self.update(|m| match m.forced_syncs.iter_mut().find(|f| f.location == location) {
            Some(f) => f.count += 1,
            None => m.forced_syncs.push(ForcedSync { location: location.to_string(), count: 1 }),
        });
    }
}

/// The process-wide metrics (all devices) as text.
pub fn report() -> String {
    GLOBAL.report()
}

/// The process-wide metrics (all devices).
pub fn snapshot() -> MetricsReport {
    GLOBAL.snapshot()
}
