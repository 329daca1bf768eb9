//! Memory known before a step runs: a new executable's planned peak is
//! checked against the memory the system has available before its first
//! run, and a dry run compiles and plans a step without running it.

use super::Device;
use crate::backend::Executable;
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;

/// Bytes the system can still give this process (`/proc/meminfo`'s
/// `MemAvailable`), when the platform says.
pub fn available_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The available memory to check a step against; `LAZYTRAIN_MEMORY_CHECK=off`
/// turns the check off.
fn memory_to_check_against() -> Option<u64> {
    if std::env::var("LAZYTRAIN_MEMORY_CHECK").is_ok_and(|v| v == "off") {
        return None;
    }
    available_memory_bytes()
}

/// Refuse to run `exe` for the first time when its planned peak, beyond the
/// `resident` bytes its inputs already hold, exceeds the available memory.
pub(super) fn check_fits(exe: &dyn Executable, resident: u64) -> Result<()> {
    let stats = exe.stats();
    if stats.allocated_bytes > 0 || stats.kept_bytes > 0 {
        // It ran before (on fresh memory, or on buffers another graph
        // handed over): its memory is known to fit.
        return Ok(());
    }
    let needed = (stats.peak_bytes as u64).saturating_sub(resident);
    match memory_to_check_against() {
        Some(available) if needed > available => Err(Error::OutOfMemory {
            needed_bytes: needed,
            available_bytes: available,
            largest_buffers: stats.largest_buffers.iter().copied().filter(|&b| b > 0).collect(),
            stats: Box::new(stats),
        }),
        _ => Ok(()),
    }
}

impl Device {
    /// Make the next sync a dry run: it compiles the live graph and plans
    /// its memory, then fails its tensors with [`Error::DryRun`] (which
    /// carries the plan) instead of running — PyTorch/XLA users learn of an
    /// out-of-memory step only after a long compile; this tells before.
    pub fn plan_next_sync(&self) {
        self.inner.plan_only.store(true, Ordering::SeqCst);
    }
}
