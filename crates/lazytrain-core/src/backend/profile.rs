//! Per-kernel-kind timing (`LAZYTRAIN_PROFILE=1`): where a step's time goes.

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};

static ENABLED: LazyLock<AtomicBool> =
    LazyLock::new(|| AtomicBool::new(std::env::var("LAZYTRAIN_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0")));
static TABLE: LazyLock<Mutex<FxHashMap<&'static str, (u64, u64)>>> = LazyLock::new(Mutex::default);

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
        _ => "other",
    }
}

pub(crate) fn record(kind: &'static str, nanos: u64) {
    let mut table = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    let entry = table.entry(kind).or_default();
    entry.0 += nanos;
    entry.1 += 1;
}

/// Time shares by kernel kind since the last reset, largest first.
pub fn report() -> String {
    let table = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    let total: u64 = table.values().map(|v| v.0).sum::<u64>().max(1);
    let mut rows: Vec<_> = table.iter().collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.1 .0));
    let mut out = String::from("kernel time by kind:\n");
    for (kind, (nanos, calls)) in rows {
        out.push_str(&format!(
            "  {kind:<15} {:>9.1} ms  {:>5.1} %  ({calls} calls)\n",
            *nanos as f64 / 1e6,
            100.0 * *nanos as f64 / total as f64
        ));
    }
    out
}

/// Clear the table.
pub fn reset() {
    TABLE.lock().unwrap_or_else(|p| p.into_inner()).clear();
}
