//! Collectives: how the replicas of a data-parallel run exchange values
//! inside a step and meet between steps. The executable calls
//! [`Collective::all_reduce`] for `all_reduce` nodes; the host calls
//! [`Collective::barrier`] and, when a replica fails,
//! [`Collective::abort`]. The implementations live in `lazytrain-dist`:
//! threads of one process, and threads then processes over MPI (feature
//! `mpi`); NCCL would implement the same trait.

use crate::ir::AllReduceOp;
use crate::storage::{DeviceMemory, HostData};
use std::sync::Arc;

/// A group of replicas that reduce values together.
pub trait Collective: Send + Sync {
    /// The number of replicas in the group.
    fn world_size(&self) -> usize;

    /// Replace `data` on replica `rank` by the elementwise reduction of every
    /// replica's `data`, in place. All replicas call this with the same
    /// dtype and length, in the same order (they run the same executable).
    /// Returns an error when the group was aborted (another replica failed),
    /// the replicas disagree, or the collective cannot reach `data`'s memory
    /// (host collectives reduce host memory).
    fn all_reduce(&self, rank: usize, data: &mut DeviceMemory, op: AllReduceOp) -> Result<(), String>;

    /// [`Collective::all_reduce`] for the step `tag` (the training step the
    /// graph was cut in, [`Device::set_step_tag`](crate::Device::set_step_tag)):
    /// a collective that can compares the replicas' tags and fails, naming
    /// both steps, when one replica reduces another step's values (it
    /// skipped or repeated a step). The default ignores the tag.
    fn all_reduce_tagged(&self, rank: usize, data: &mut DeviceMemory, op: AllReduceOp, tag: u64) -> Result<(), String> {
        let _ = tag;
        self.all_reduce(rank, data, op)
    }

    /// Replace `data` on every replica by replica 0's `data` (initial
    /// weights, a seed: so replicas cannot start apart). Every replica calls
    /// it with the same dtype and length; others are an error.
    fn broadcast(&self, rank: usize, data: &mut DeviceMemory) -> Result<(), String>;

    /// Check that every replica is about to run the same graph (structural
    /// `hash`) before its first collective, so replicas that traced
    /// different steps fail with an error naming them instead of hanging or
    /// reducing mismatched buffers. Called in the place of the graph's
    /// first collective (serialised with the replica's other collectives).
    fn agree_on_graph(&self, rank: usize, hash: u64) -> Result<(), String>;

    /// Wait until every replica of the group calls `barrier` (a host-side
    /// meeting, e.g. PyTorch/XLA's `rendezvous`). Call it with the replica's
    /// device drained (`Device::rendezvous` does): across processes it
    /// shares MPI's communicator with the all-reduces, which must not run
    /// at the same time. In one process it never pairs with the
    /// synchronisation inside [`Collective::all_reduce`]. Fails when the
    /// group was aborted.
    fn barrier(&self, rank: usize) -> Result<(), String>;

    /// [`Collective::barrier`] for a wait as long as one replica's host work
    /// (the master's last uploads, of any size over any link): no collective
    /// timeout applies, while an abort (and, across processes, a dead
    /// process) still ends it. Every other replica must reach it or abort.
    /// The default is [`Collective::barrier`], for groups without a timeout.
    fn patient_barrier(&self, rank: usize) -> Result<(), String> {
        self.barrier(rank)
    }

    /// Stop the group because replica `rank` failed with `message`: replicas
    /// waiting in (or later entering) a collective or a barrier get an
    /// error naming `rank` and `message`. The first abort wins.
    fn abort(&self, rank: usize, message: &str);

    /// Replica `rank` has returned for good: replicas that wait for it in a
    /// collective (because they run more steps) must fail instead of
    /// waiting forever. Not a failure of the group.
    fn finished(&self, rank: usize);

    /// The replica and message of the first abort, if the group was aborted.
    fn abort_reason(&self) -> Option<(usize, String)>;
}

/// Where a device sits in a replica group.
#[derive(Clone)]
pub struct ReplicaLink {
    /// This replica's rank (0 is the master).
    pub rank: usize,
    /// The group's collective.
    pub collective: Arc<dyn Collective>,
}

impl std::fmt::Debug for ReplicaLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "replica {} of {}", self.rank, self.collective.world_size())
    }
}

/// The error of replicas that run different graphs, from every replica's
/// graph hash in rank order (`None` when they agree).
pub fn graph_disagreement(hashes: &[u64]) -> Option<String> {
    let first = hashes.first()?;
    let (other, hash) = hashes.iter().enumerate().find(|(_, h)| *h != first)?;
    Some(format!(
        "replicas traced different step graphs: replica 0 runs graph {first:016x}, replica {other} runs graph \
         {hash:016x}; every replica must trace the same step (same model, shapes, options and number of micro-batches)"
    ))
}

/// What an executable needs from its device besides the inputs.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunContext<'a> {
    /// The replica group, when the device is one replica of several.
    pub replica: Option<&'a ReplicaLink>,
    /// The step the graph was cut in, which its collectives carry.
    pub step_tag: u64,
}

impl RunContext<'_> {
    /// Reduce `data` over the replica group (a no-op for a lone device,
    /// where sum and mean over one replica are the identity).
    pub fn all_reduce(&self, data: &mut DeviceMemory, op: AllReduceOp) -> Result<(), String> {
        match self.replica {
            Some(link) if link.collective.world_size() > 1 => {
                link.collective.all_reduce_tagged(link.rank, data, op, self.step_tag)
            }
            _ => Ok(()),
        }
    }

    /// [`RunContext::all_reduce`] of host data (what host backends compute in).
    pub fn all_reduce_host(&self, data: &mut HostData, op: AllReduceOp) -> Result<(), String> {
        let mut memory = DeviceMemory::Host(std::mem::replace(data, HostData::F32(Vec::new())));
        let result = self.all_reduce(&mut memory, op);
        match memory {
            DeviceMemory::Host(reduced) => *data = reduced,
            DeviceMemory::Backend(_) => unreachable!("a collective reduces in place"),
        }
        result
    }
}
