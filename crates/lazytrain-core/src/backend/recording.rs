//! A backend wrapper that keeps the [`ExecutableStats`] of every graph it
//! lowers: for tests and tools that check what the compiler made of a step
//! (how many kernels, which ran as epilogues or by loops of their own).

use super::{Backend, Executable, ExecutableStats};
use crate::collective::RunContext;
use crate::error::Result;
use crate::schedule::{Capabilities, Schedule};
use crate::storage::{Buffer, HostData};
use crate::DType;
use std::sync::{Arc, Mutex};

/// `inner`, with the stats of each executable it lowered, in order.
pub struct RecordingBackend<B> {
    inner: B,
    stats: Mutex<Vec<ExecutableStats>>,
}

impl<B: Backend> RecordingBackend<B> {
    /// Wrap `inner`.
    pub fn new(inner: B) -> RecordingBackend<B> {
        RecordingBackend { inner, stats: Mutex::new(Vec::new()) }
    }

    /// The stats of every executable lowered so far, in order.
    pub fn lowered(&self) -> Vec<ExecutableStats> {
        self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl<B: Backend> Backend for RecordingBackend<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn lower(&self, schedule: &Schedule) -> Result<Arc<dyn Executable>> {
        let executable = self.inner.lower(schedule)?;
        self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(executable.stats());
        Ok(executable)
    }

    fn execute(
        &self,
        executable: &dyn Executable,
        inputs: Vec<Arc<Buffer>>,
        context: &RunContext,
    ) -> Result<Vec<Arc<Buffer>>> {
        self.inner.execute(executable, inputs, context)
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<Buffer> {
        self.inner.alloc(dtype, len)
    }

    fn copy_in(&self, data: HostData) -> Result<Buffer> {
        self.inner.copy_in(data)
    }

    fn copy_out(&self, buffer: &Buffer) -> Result<HostData> {
        self.inner.copy_out(buffer)
    }
}
