//! The cut: `sync` turns the live graph into a canonical graph, gets its
//! executable and runs (or enqueues) it; the pending tensors then hold
//! their buffers.

use super::execution::Job;
use super::trace::{canonicalize, fail_cells, Provided, TensorState};
use super::Device;
use crate::error::{Error, Result};
use crate::ir::{Graph, Op};
use crate::storage::Buffer;
use std::panic::Location;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Device {
    /// Cut the live graph here and run it: every live pending tensor gets its
    /// value. Returns once the values are computed.
    #[track_caller]
    pub fn sync(&self) -> Result<()> {
        self.sync_at(Location::caller(), false)
    }

    /// PyTorch/XLA's name for [`Device::sync`]: the end of a training step.
    #[track_caller]
    pub fn mark_step(&self) -> Result<()> {
        self.sync_at(Location::caller(), false)
    }

    /// Tag the graphs cut from now on with training step `step`: their
    /// collectives carry it, so replicas that reduce different steps' values
    /// (one skipped or repeated a step) fail naming both steps instead of
    /// silently averaging them. The Trainer sets it every step.
    pub fn set_step_tag(&self, step: u64) {
        self.inner.step_tag.store(step, Ordering::SeqCst);
    }

    /// The step tag of the graphs cut now.
    pub fn step_tag(&self) -> u64 {
        self.inner.step_tag.load(Ordering::SeqCst)
    }

    /// A sync caused by reading a pending value at `location`. It is not a
    /// step boundary: the random streams of the rest of the step continue
    /// after the ones already drawn (so a read between micro-batches does
    /// not make the next one reuse the first one's dropout masks).
    pub(crate) fn forced_sync(&self, location: &'static Location<'static>) -> Result<()> {
        self.inner.metrics.record_forced_sync(&location.to_string());
        self.sync_at(location, true)
    }

    fn sync_at(&self, location: &'static Location<'static>, mid_step: bool) -> Result<()> {
        let mut live = self.lock_live();
        let taken = std::mem::take(&mut *live);
        if mid_step {
            live.next_rng_stream = taken.next_rng_stream;
        }
        let mut cells = Vec::new();
        let mut outputs = Vec::new();
        for weak in &taken.pending {
            if let Some(cell) = weak.upgrade() {
                if let TensorState::Pending(id) = *cell.lock_state() {
                    outputs.push(id);
                    cells.push(cell.clone());
                }
            }
        }
        if outputs.is_empty() {
            return Ok(());
        }
        self.inner.metrics.update(|m| m.syncs += 1);
        let cut_start = Instant::now();
        let traced_nodes = taken.builder.len() as u64;
        self.inner.metrics.update(|m| m.traced_nodes += traced_nodes);
        let mut taken_params = taken.params;
        let mut traced = taken.builder.finish(outputs, taken_params.len());
        provide_values(&mut traced, &mut taken_params, taken.provided);
        let (mut graph, param_order) = canonicalize(traced);
        let mut params: Vec<Option<Arc<Buffer>>> = taken_params.into_iter().map(Some).collect();
        let inputs: Vec<Arc<Buffer>> = param_order.iter().filter_map(|&k| params[k].take()).collect();
        // A buffer only this sync still holds is donated: the executable may
        // write the step's new values into it.
        graph.donated = inputs.iter().map(|b| Arc::strong_count(b) == 1).collect();
        let hash = graph.structural_hash();
        let agreement = self.inner.runner.agreement_for(&graph, hash, location);
        let executable = match self.executable_for(graph, hash, location, cut_start) {
            Ok(exe) => exe,
            Err(e) => return Err(fail_cells(&cells, e)),
        };
        let input_bytes: u64 = inputs.iter().map(|b| b.resident_bytes()).sum();
        if self.inner.plan_only.swap(false, Ordering::SeqCst) {
            let e = Error::DryRun { stats: Box::new(executable.stats()), input_bytes };
            return Err(fail_cells(&cells, e));
        }
        if let Err(e) = super::memory::check_fits(&*executable, input_bytes) {
            return Err(fail_cells(&cells, e));
        }
        if let Some(worker) = &self.inner.worker {
            // Asynchronous: the outputs become in-flight buffers now and the
            // worker fills them; the host goes on tracing.
            let buffers: Vec<Arc<Buffer>> =
                cells.iter().map(|cell| Arc::new(Buffer::in_flight(cell.dtype()))).collect();
            let outputs = buffers.iter().map(Arc::downgrade).collect();
            for (cell, buffer) in cells.iter().zip(buffers) {
                *cell.lock_state() = TensorState::Ready(buffer);
            }
            self.inner.queue.state.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
            let step_tag = self.step_tag();
            let job = Job { executable, inputs, outputs, agreement, step_tag };
            let sent = worker.lock().unwrap_or_else(|p| p.into_inner()).sender.as_ref().map(|s| s.send(job));
            if !matches!(sent, Some(Ok(()))) {
                self.inner.queue.state.lock().unwrap_or_else(|p| p.into_inner()).0 -= 1;
                let e =
                    Error::Execution { node: 0, op: "device", detail: "the device's worker thread has stopped".into() };
                return Err(fail_cells(&cells, e));
            }
            return Ok(());
        }
        let results = match self.inner.runner.run(&*executable, inputs, agreement, self.step_tag()) {
            Ok(results) => results,
            Err(e) => return Err(fail_cells(&cells, e)),
        };
        for (cell, buffer) in cells.iter().zip(results) {
            *cell.lock_state() = TensorState::Ready(buffer);
        }
        drop(live);
        Ok(())
    }
}

/// Turn each cast node of `graph` whose value a buffer already holds (a
/// weight's kept narrow copy, see `tensor::narrow_copy`) into a parameter
/// reading that buffer: the graph computes the same values, one kernel
/// fewer. A node is replaced only while it is the cast of the buffer it
/// was provided for.
fn provide_values(graph: &mut Graph, params: &mut Vec<Arc<Buffer>>, provided: Vec<Provided>) {
    for Provided { id, source, value } in provided {
        let Some(node) = graph.nodes.get(id.index()) else { continue };
        let casts_source = node.op == Op::Cast
            && node.dtype == value.dtype()
            && node.inputs.first().is_some_and(|input| match graph.nodes[input.index()].op {
                Op::Parameter(k) => params.get(k).is_some_and(|p| Arc::ptr_eq(p, &source)),
                _ => false,
            });
        if casts_source {
            let node = &mut graph.nodes[id.index()];
            node.op = Op::Parameter(params.len());
            node.inputs.clear();
            params.push(value);
        }
    }
    graph.num_params = params.len();
}
