//! Per-kernel-kind timing (`LAZYTRAIN_PROFILE=1`): where a step's time goes.
//! A process-wide aggregate over every device, for the report: it only
//! records, and no device reads it to decide anything.

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};

static ENABLED: LazyLock<AtomicBool> =
    LazyLock::new(|| AtomicBool::new(std::env::var("LAZYTRAIN_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0")));
static TABLE: LazyLock<Mutex<Tables>> = LazyLock::new(Mutex::default);

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

/// Accumulated `(nanoseconds, calls)` per kernel kind and per kernel label.
#[derive(Default)]
struct Tables {
    kinds: FxHashMap<&'static str, (u64, u64)>,
    kernels: FxHashMap<String, (u64, u64)>,
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

/// Add one call of a kernel of `kind` described by `label` (op and shapes).
pub(crate) fn record(kind: &'static str, label: &str, nanos: u64) {
    let mut tables = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    let entry = tables.kinds.entry(kind).or_default();
    entry.0 += nanos;
    entry.1 += 1;
    let entry = match tables.kernels.get_mut(label) {
        Some(entry) => entry,
        None => tables.kernels.entry(label.to_string()).or_default(),
    };
    entry.0 += nanos;
    entry.1 += 1;
}

/// Time shares by kernel kind since the last reset, largest first, then
/// the most expensive kernels (by op and shapes), so the next bottleneck
/// is visible.
pub fn report() -> String {
    let tables = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    let total: u64 = tables.kinds.values().map(|v| v.0).sum::<u64>().max(1);
    let share = |nanos: u64| 100.0 * nanos as f64 / total as f64;
    let mut kinds: Vec<_> = tables.kinds.iter().collect();
    kinds.sort_by_key(|row| std::cmp::Reverse(row.1 .0));
    let mut out = String::from("kernel time by kind:\n");
    for (kind, &(nanos, calls)) in kinds {
        out.push_str(&format!(
            "  {kind:<17} {:>9.1} ms  {:>5.1} %  ({calls} calls)\n",
            nanos as f64 / 1e6,
            share(nanos)
        ));
    }
    let mut kernels: Vec<_> = tables.kernels.iter().collect();
    kernels.sort_by_key(|row| std::cmp::Reverse(row.1 .0));
    let top = top_kernels();
    out.push_str(&format!("top {top} kernels:\n"));
    for (label, &(nanos, calls)) in kernels.into_iter().take(top) {
        out.push_str(&format!(
            "  {:>9.1} ms  {:>5.1} %  {calls:>5} calls  {label}\n",
            nanos as f64 / 1e6,
            share(nanos)
        ));
    }
    out
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
        record("matmul", "dot [8, 4] [4, 2] -> [8, 2] f32", 3_000_000);
        record("matmul", "dot [8, 4] [4, 2] -> [8, 2] f32", 1_000_000);
        record("copies", "reshape [8, 2] -> [16] f32", 1_000_000);
        let report = report();
        let line = |needle: &str| report.lines().position(|l| l.contains(needle)).expect(needle);
        assert!(line("matmul") < line("copies"), "{report}");
        assert!(line("dot [8, 4]") < line("reshape [8, 2]"), "{report}");
        let dot = report.lines().nth(line("dot [8, 4]")).unwrap();
        assert!(dot.contains("4.0 ms") && dot.contains("2 calls"), "{dot}");
    }
}
