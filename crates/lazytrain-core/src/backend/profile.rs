//! Per-kernel-kind timing (`LAZYTRAIN_PROFILE=1`): where a step's time goes.
//! A process-wide aggregate over every device, for the report: it only
//! records, and no device reads it to decide anything.

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

static ENABLED: LazyLock<AtomicBool> =
    LazyLock::new(|| AtomicBool::new(std::env::var("LAZYTRAIN_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0")));
static TABLE: LazyLock<Mutex<Tables>> = LazyLock::new(Mutex::default);
/// Nanoseconds the pool's kept-warm threads have spent finding no work.
static IDLE_NANOS: AtomicU64 = AtomicU64::new(0);

/// How many of the most expensive kernels the report lists by default.
const TOP_KERNELS: usize = 15;

/// How many kernels the report lists: `LAZYTRAIN_PROFILE=N` with N > 1
/// lists N, any other value that turns profiling on lists [`TOP_KERNELS`].
fn top_kernels() -> usize {
    std::env::var("LAZYTRAIN_PROFILE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 1)
        .unwrap_or(TOP_KERNELS)
}

/// What one kernel kind, or one kernel, has accumulated.
#[derive(Default, Clone, Copy)]
struct Totals {
    nanos: u64,
    calls: u64,
    /// Nanoseconds the other threads of the pool found no work meanwhile.
    idle: u64,
}

/// Accumulated [`Totals`] per kernel kind and per kernel label.
#[derive(Default)]
struct Tables {
    kinds: FxHashMap<&'static str, Totals>,
    kernels: FxHashMap<String, Totals>,
}

/// True when kernels are being timed.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Turn timing on or off (the default comes from `LAZYTRAIN_PROFILE`).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// The kind a kernel is reported under.
pub(crate) fn kind_of(op: &crate::ir::Op) -> &'static str {
    use crate::ir::Op;
    match op {
        Op::Dot { .. } => "matmul",
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Cast => "elementwise",
        Op::Reduce { .. } => "reduction",
        Op::Gather { .. } | Op::ScatterAdd { .. } => "gather/scatter",
        Op::Reshape
        | Op::Permute(_)
        | Op::Expand
        | Op::Slice { .. }
        | Op::Concat { .. }
        | Op::Pad { .. }
        | Op::StopGradient => "copies",
        Op::AllReduce(_) => "collective",
        Op::Parameter(_) | Op::Constant(_) | Op::Iota { .. } | Op::RngUniform { .. } => "other",
    }
}

/// Count `nanos` of a kept-warm pool thread finding no work to do.
pub(crate) fn add_idle(nanos: u64) {
    IDLE_NANOS.fetch_add(nanos, Ordering::Relaxed);
}

/// Nanoseconds of idle pool threads counted so far: read before and after
/// a kernel, the difference is what its split left idle.
pub(crate) fn idle_nanos() -> u64 {
    IDLE_NANOS.load(Ordering::Relaxed)
}

/// Add one call of a kernel of `kind` described by `label` (op and shapes)
/// that took `nanos` while the pool's other threads idled for `idle`.
pub(crate) fn record(kind: &'static str, label: &str, nanos: u64, idle: u64) {
    let mut tables = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    let add = |entry: &mut Totals| {
        entry.nanos += nanos;
        entry.calls += 1;
        entry.idle += idle;
    };
    add(tables.kinds.entry(kind).or_default());
    match tables.kernels.get_mut(label) {
        Some(entry) => add(entry),
        None => add(tables.kernels.entry(label.to_string()).or_default()),
    }
}

/// Time shares by kernel kind since the last reset, largest first, then
/// the most expensive kernels (by op and shapes), so the next bottleneck
/// is visible.
pub fn report() -> String {
    let tables = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    let total: u64 = tables.kinds.values().map(|v| v.nanos).sum::<u64>().max(1);
    let share = |nanos: u64| 100.0 * nanos as f64 / total as f64;
    let mut kinds: Vec<_> = tables.kinds.iter().collect();
    kinds.sort_by_key(|row| std::cmp::Reverse(row.1.nanos));
    let idle: u64 = tables.kinds.values().map(|v| v.idle).sum();
    let mut out =
        format!("kernel time by kind (idle: time other pool threads found no work, {:.1} ms in all):\n", ms(idle));
    for (kind, totals) in kinds {
        let Totals { nanos, calls, idle } = *totals;
        out.push_str(&format!(
            "  {kind:<17} {:>9.1} ms  {:>5.1} %  ({calls} calls, idle {:.1} ms)\n",
            ms(nanos),
            share(nanos),
            ms(idle)
        ));
    }
    let mut kernels: Vec<_> = tables.kernels.iter().collect();
    kernels.sort_by_key(|row| std::cmp::Reverse(row.1.nanos));
    let top = top_kernels();
    out.push_str(&format!("top {top} kernels:\n"));
    for (label, totals) in kernels.into_iter().take(top) {
        let Totals { nanos, calls, idle } = *totals;
        out.push_str(&format!(
            "  {:>9.1} ms  {:>5.1} %  {calls:>5} calls  idle {:>7.1} ms  {label}\n",
            ms(nanos),
            share(nanos),
            ms(idle)
        ));
    }
    let routes = crate::kernels::gemm_tuning::describe();
    if !routes.is_empty() {
        out.push_str("gemm routes kept after trials (the planned route's best time, the direct call's):\n");
        out.push_str(&routes);
    }
    out
}

/// Nanoseconds as milliseconds.
fn ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}

/// Clear the table.
pub fn reset() {
    let mut tables = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    tables.kinds.clear();
    tables.kernels.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_ranks_kinds_and_kernels_by_time() {
        record("matmul", "dot [8, 4] [4, 2] -> [8, 2] f32", 3_000_000, 500_000);
        record("matmul", "dot [8, 4] [4, 2] -> [8, 2] f32", 1_000_000, 0);
        record("copies", "reshape [8, 2] -> [16] f32", 1_000_000, 0);
        let report = report();
        let line = |needle: &str| report.lines().position(|l| l.contains(needle)).expect(needle);
        assert!(line("matmul") < line("copies"), "{report}");
        assert!(line("dot [8, 4]") < line("reshape [8, 2]"), "{report}");
        let dot = report.lines().nth(line("dot [8, 4]")).unwrap();
        assert!(dot.contains("4.0 ms") && dot.contains("2 calls") && dot.contains("idle     0.5 ms"), "{dot}");
    }
}
