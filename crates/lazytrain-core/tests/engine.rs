//! Tracing, sync, the compile cache and the metrics it reports.

use lazytrain_core::{DType, Device, Result, Tensor};

/// One "training-like" step: new data every time, a learning-rate input.
fn step(dev: &Device, w: &Tensor, batch: usize, lr: f32, seed: u64) -> Result<(Tensor, Tensor)> {
    let data: Vec<f32> = (0..batch * 8).map(|i| ((i as u64 * 31 + seed * 17) % 13) as f32 / 13.0).collect();
    let x = Tensor::from_vec(data, [batch, 8], dev)?;
    let lr = Tensor::scalar(lr, dev);
    let y = x.matmul(w)?.tanh()?;
    let loss = y.square()?.mean_all()?;
    let new_w = w.sub(&x.matmul_transposed(&y, true, false)?.mul(&lr)?)?;
    Ok((loss, new_w))
}

#[test]
fn hundred_steps_compile_once() -> Result<()> {
    let dev = Device::cpu();
    let mut w = Tensor::from_vec(vec![0.1f32; 8 * 4], [8, 4], &dev)?;
    let mut losses = Vec::new();
    for i in 0..100 {
        let (loss, new_w) = step(&dev, &w, 16, 0.01 * (1.0 + i as f32), i)?;
        w = new_w;
        dev.mark_step()?;
        losses.push(loss.item::<f32>()?);
    }
    let m = dev.metrics();
    assert_eq!((m.compiles, m.cache_hits), (1, 99), "{}", dev.metrics_report());
    assert_eq!(m.executions, 100);
    assert_eq!(m.forced_sync_count(), 0, "reads after mark_step must not force syncs");
    assert!(losses.iter().all(|l| l.is_finite()));
    assert_ne!(losses[0], losses[99], "new data and weights every step");
    Ok(())
}

#[test]
fn changing_a_batch_dimension_recompiles_and_names_the_input() -> Result<()> {
    let dev = Device::cpu();
    let w = Tensor::from_vec(vec![0.1f32; 8 * 4], [8, 4], &dev)?;
    for batch in [4, 4, 6] {
        let (_loss, _new_w) = step(&dev, &w, batch, 0.1, 0)?;
        dev.mark_step()?;
    }
    let m = dev.metrics();
    assert_eq!((m.compiles, m.cache_hits), (2, 1));
    let reason = &m.compile_events[1].reason;
    assert!(reason.contains("input 0 changed shape from f32[4, 8] to f32[6, 8]"), "{reason}");
    assert_eq!(m.compile_events[0].reason, "first compile at this site");
    assert!(dev.metrics_report().contains(reason.as_str()));
    Ok(())
}

#[test]
fn a_changed_constant_is_explained() -> Result<()> {
    let dev = Device::cpu();
    let x = Tensor::from_vec(vec![1f32, 2.0], [2], &dev)?;
    for scale in [2.0, 3.0] {
        let _y = x.mul_scalar(scale)?;
        dev.sync()?;
    }
    let m = dev.metrics();
    assert_eq!(m.compiles, 2);
    assert!(
        m.compile_events[1].reason.contains("constant at node %0 changed from 2.0 to 3.0"),
        "{}",
        m.compile_events[1].reason
    );
    Ok(())
}

#[test]
fn reading_mid_step_is_a_forced_sync_with_its_line() -> Result<()> {
    let dev = Device::cpu();
    let x = Tensor::from_vec(vec![1f32, 2.0, 3.0], [3], &dev)?;
    let y = x.exp()?;
    let line = line!() + 1;
    let v = y.to_vec::<f32>()?;
    assert!((v[2] - 3f32.exp()).abs() < 1e-6);
    let m = dev.metrics();
    assert_eq!(m.forced_sync_count(), 1);
    assert!(m.forced_syncs[0].location.contains(&format!("engine.rs:{line}:")), "{:?}", m.forced_syncs);
    // Reading a value that is already computed costs nothing.
    let _ = y.to_vec::<f32>()?;
    assert_eq!(dev.metrics().forced_sync_count(), 1);
    Ok(())
}

#[test]
fn tracing_is_lazy_and_hash_consed() -> Result<()> {
    let dev = Device::cpu();
    let x = Tensor::from_vec(vec![1f32, 2.0], [2], &dev)?;
    let a = x.exp()?.add(&x)?;
    let b = x.exp()?.add(&x)?;
    assert!(a.is_pending() && b.is_pending());
    assert_eq!(dev.live_nodes(), 3, "parameter, exp and add exist once");
    assert_eq!(dev.metrics().executions, 0, "nothing ran yet");
    dev.sync()?;
    assert!(!a.is_pending());
    assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?);
    assert_eq!(dev.live_nodes(), 0);
    Ok(())
}

#[test]
fn dropped_intermediates_are_not_outputs() -> Result<()> {
    let dev = Device::cpu();
    let x = Tensor::from_vec(vec![1f32, 2.0], [2], &dev)?;
    let kept = {
        let tmp = x.exp()?;
        tmp.mul_scalar(2.0)?
    };
    dev.sync()?;
    assert_eq!(dev.metrics().compile_events[0].nodes, 4, "parameter, exp, constant, mul");
    let v = kept.to_vec::<f32>()?;
    assert!((v[1] - 2.0 * 2f32.exp()).abs() < 1e-5);
    Ok(())
}

#[test]
fn same_seed_same_draws_new_seed_new_draws() -> Result<()> {
    let draw = |seed: i64| -> Result<(Vec<f32>, Vec<f32>)> {
        let dev = Device::cpu();
        let s = Tensor::scalar(seed, &dev);
        let a = Tensor::rand_uniform([64], DType::F32, &s)?;
        let b = Tensor::rand_uniform([64], DType::F32, &s)?;
        dev.sync()?;
        Ok((a.to_vec()?, b.to_vec()?))
    };
    let (a1, b1) = draw(5)?;
    let (a2, b2) = draw(5)?;
    let (a3, _) = draw(6)?;
    assert_eq!((&a1, &b1), (&a2, &b2));
    assert_ne!(a1, b1, "two draws in one graph use different streams");
    assert_ne!(a1, a3);
    let mut expected = vec![0f32; 64];
    lazytrain_core::random::uniform_f32(5, 0, &mut expected);
    assert_eq!(a1, expected);
    Ok(())
}

#[test]
fn creation_and_all_reduce_with_one_replica() -> Result<()> {
    let dev = Device::cpu();
    let z = Tensor::zeros([2, 2], DType::F32, &dev)?;
    let f = Tensor::full([3], 2.5, DType::F32, &dev)?;
    let r = Tensor::arange(4, DType::I64, &dev)?;
    let i = Tensor::iota([2, 3], 1, DType::I32, &dev)?;
    let s = f.all_reduce(lazytrain_core::ir::AllReduceOp::Mean)?;
    assert_eq!(z.to_vec::<f32>()?, vec![0.0; 4]);
    assert_eq!(s.to_vec::<f32>()?, vec![2.5; 3]);
    assert_eq!(r.to_vec::<i64>()?, vec![0, 1, 2, 3]);
    assert_eq!(i.to_vec::<i32>()?, vec![0, 1, 2, 0, 1, 2]);
    assert_eq!(Tensor::ones([1], DType::I64, &dev)?.item::<i64>()?, 1);
    assert_eq!(
        format!("{}", Tensor::from_vec(vec![1i64, 2, 3, 4], [2, 2], &dev)?),
        "tensor([[1, 2], [3, 4]], dtype=i64)"
    );
    Ok(())
}

#[test]
fn metrics_track_bytes_and_serialise() -> Result<()> {
    let dev = Device::cpu();
    let x = Tensor::from_vec(vec![1f32; 256], [256], &dev)?;
    let y = x.add_scalar(1.0)?;
    dev.sync()?;
    let _ = y.to_vec::<f32>()?;
    let m = dev.metrics();
    assert_eq!(m.host_to_device_bytes, 1024);
    assert_eq!(m.device_to_host_bytes, 1024);
    assert!(m.live_buffer_bytes >= 2048);
    let json = serde_json::to_string(&m).unwrap();
    let back: lazytrain_core::metrics::MetricsReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back.compiles, 1);
    assert!(lazytrain_core::metrics::report().contains("compiles:"));
    Ok(())
}

/// Reducing an empty axis gives the reduction's identity (0 for a sum,
/// -inf for a max), never a pooled buffer's stale contents.
#[test]
fn reducing_an_empty_axis_gives_the_identity() -> Result<()> {
    let dev = Device::cpu();
    // A first graph leaves non-zero buffers in the pool.
    let x = Tensor::from_vec((0..12).map(|v| v as f32 + 1.0).collect(), [4, 3], &dev)?;
    let _ = x.mul_scalar(3.0)?.sum(&[-1], false)?.to_vec::<f32>()?;
    let empty = x.narrow(-1, 0, 0)?;
    assert_eq!(empty.sum(&[-1], false)?.to_vec::<f32>()?, [0.0; 4]);
    assert_eq!(empty.mul_scalar(2.0)?.sum(&[-1], false)?.to_vec::<f32>()?, [0.0; 4]);
    assert_eq!(empty.max(&[-1], false)?.to_vec::<f32>()?, [f32::NEG_INFINITY; 4]);
    assert_eq!(x.narrow(0, 0, 0)?.sum(&[0], false)?.to_vec::<f32>()?, [0.0; 3]);
    Ok(())
}

/// The same steps on the CPU backend (fused kernels, in place, gemm) and on
/// the reference backend (one naive kernel per node) give the same losses
/// and weights, and only the CPU backend fuses.
#[test]
fn the_cpu_and_reference_backends_agree_on_training_steps() -> Result<()> {
    let mut runs = Vec::new();
    for name in lazytrain_core::backend::BACKEND_NAMES {
        let dev = Device::on_backend(name)?;
        assert_eq!(dev.backend_name(), name);
        let mut w = Tensor::from_vec((0..32).map(|i| (i as f32 - 16.0) / 40.0).collect(), [8, 4], &dev)?;
        let mut losses = Vec::new();
        for i in 0..5 {
            let (loss, new_w) = step(&dev, &w, 16, 0.05, i)?;
            w = new_w;
            dev.mark_step()?;
            losses.push(loss.item::<f32>()?);
        }
        let fused: usize = dev.metrics().compile_events.iter().map(|e| e.fused_kernels).sum();
        runs.push((losses, w.to_vec::<f32>()?, fused));
    }
    let (cpu, reference) = (&runs[0], &runs[1]);
    assert!(cpu.2 > 0, "the CPU backend fuses the tanh/square chain");
    assert_eq!(reference.2, 0, "the reference backend runs every node alone");
    for (a, b) in cpu.0.iter().chain(&cpu.1).zip(reference.0.iter().chain(&reference.1)) {
        assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "cpu {a} vs reference {b}");
    }
    assert_ne!(cpu.0[0], cpu.0[4], "the steps changed the weights");
    Ok(())
}

#[test]
fn an_unknown_backend_is_named_with_the_choices() {
    let e = Device::on_backend("tpu").unwrap_err().to_string();
    assert!(e.contains("unknown backend `tpu`") && e.contains("cpu, reference"), "{e}");
}

/// A backend that lowers like the CPU backend but counts the copies into
/// and out of its memory.
#[derive(Default)]
struct CountingBackend {
    cpu: lazytrain_core::backend::CpuBackend,
    copies_in: std::sync::atomic::AtomicUsize,
    copies_out: std::sync::atomic::AtomicUsize,
}

impl lazytrain_core::backend::Backend for CountingBackend {
    fn name(&self) -> &'static str {
        "counting"
    }

    fn capabilities(&self) -> lazytrain_core::schedule::Capabilities {
        self.cpu.capabilities()
    }

    fn lower(
        &self,
        schedule: &lazytrain_core::schedule::Schedule,
    ) -> Result<std::sync::Arc<dyn lazytrain_core::backend::Executable>> {
        self.cpu.lower(schedule)
    }

    fn copy_in(&self, data: lazytrain_core::HostData) -> Result<lazytrain_core::Buffer> {
        self.copies_in.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.cpu.copy_in(data)
    }

    fn copy_out(&self, buffer: &lazytrain_core::Buffer) -> Result<lazytrain_core::HostData> {
        self.copies_out.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.cpu.copy_out(buffer)
    }
}

/// Host values enter a device through its backend's `copy_in` and leave
/// through its `copy_out`, so a backend with memory of its own sees them.
#[test]
fn tensors_enter_and_leave_through_the_backend() -> Result<()> {
    use lazytrain_core::backend::Backend;
    use std::sync::atomic::Ordering;
    let backend = std::sync::Arc::new(CountingBackend::default());
    let cache = std::sync::Arc::new(lazytrain_core::cache::CompileCache::new());
    let dev = Device::with_backend(backend.clone(), cache, 0);
    let a = Tensor::from_vec(vec![1.0f32, 2.0], [2], &dev)?;
    let lr = Tensor::scalar(3.0f32, &dev);
    let y = a.mul(&lr)?;
    assert_eq!(y.to_vec::<f32>()?, vec![3.0, 6.0]);
    assert_eq!(backend.copies_in.load(Ordering::SeqCst), 2, "from_vec and scalar copy in");
    assert_eq!(backend.copies_out.load(Ordering::SeqCst), 1, "to_vec copies out");
    let zeros = backend.alloc(DType::BF16, 3)?;
    assert_eq!(zeros.wait().unwrap(), &lazytrain_core::HostData::BF16(vec![half::bf16::ZERO; 3]));
    Ok(())
}

/// Memory only its backend can read (an accelerator's).
#[derive(Debug)]
struct AcceleratorMemory(usize);

impl lazytrain_core::BackendMemory for AcceleratorMemory {
    fn dtype(&self) -> DType {
        DType::F32
    }

    fn len(&self) -> usize {
        self.0
    }

    fn duplicate(&self) -> std::result::Result<Box<dyn lazytrain_core::BackendMemory>, String> {
        Ok(Box::new(AcceleratorMemory(self.0)))
    }
}

/// A buffer in a backend's own memory is one the host kernels refuse to
/// read, with a message that says how to read it.
#[test]
fn backend_memory_is_not_read_as_host_memory() {
    use lazytrain_core::{Buffer, DeviceMemory};
    let buffer = Buffer::from_memory(DeviceMemory::Backend(Box::new(AcceleratorMemory(4))));
    assert_eq!(buffer.dtype(), DType::F32);
    let e = buffer.wait().unwrap_err();
    assert!(e.contains("device memory") && e.contains("copy_out"), "{e}");
    let copy = buffer.wait_memory().unwrap().duplicate().unwrap();
    assert_eq!((copy.dtype(), copy.size_in_bytes(), copy.host().is_none()), (DType::F32, 16, true));
    assert!(buffer.into_host().is_err());
}

/// A backend whose executables panic when they run.
struct PanickingBackend;

struct PanickingExecutable;

impl lazytrain_core::backend::Executable for PanickingExecutable {
    fn run(
        &self,
        _: Vec<std::sync::Arc<lazytrain_core::Buffer>>,
        _: &lazytrain_core::collective::RunContext,
    ) -> Result<Vec<std::sync::Arc<lazytrain_core::Buffer>>> {
        panic!("a kernel bug")
    }

    fn stats(&self) -> lazytrain_core::backend::ExecutableStats {
        Default::default()
    }
}

impl lazytrain_core::backend::Backend for PanickingBackend {
    fn name(&self) -> &'static str {
        "panicking"
    }

    fn capabilities(&self) -> lazytrain_core::schedule::Capabilities {
        lazytrain_core::schedule::Capabilities::UNFUSED
    }

    fn lower(
        &self,
        _: &lazytrain_core::schedule::Schedule,
    ) -> Result<std::sync::Arc<dyn lazytrain_core::backend::Executable>> {
        Ok(std::sync::Arc::new(PanickingExecutable))
    }
}

/// A step that panics on an asynchronous device's worker fails its outputs
/// and the next `wait` with the panic's message; nothing waits forever and
/// the device keeps working.
#[test]
fn a_panicking_step_on_an_asynchronous_device_is_an_error_not_a_hang() -> Result<()> {
    let options = lazytrain_core::DeviceOptions { asynchronous: true, ..Default::default() };
    let cache = std::sync::Arc::new(lazytrain_core::cache::CompileCache::new());
    let dev = Device::new(std::sync::Arc::new(PanickingBackend), cache, options)?;
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], &dev)?;
    let y = x.exp()?;
    dev.sync()?;
    let e = y.to_vec::<f32>().unwrap_err().to_string();
    assert!(e.contains("the step panicked: a kernel bug"), "{e}");
    let e = dev.wait().unwrap_err().to_string();
    assert!(e.contains("a kernel bug"), "{e}");
    let z = x.neg()?;
    dev.sync()?;
    assert!(z.to_vec::<f32>().is_err(), "the worker still runs (and fails) the next step");
    Ok(())
}

/// A group member that only records aborts (its collectives fail).
#[derive(Default)]
struct RecordingGroup {
    aborted: std::sync::Mutex<Option<(usize, String)>>,
}

impl lazytrain_core::collective::Collective for RecordingGroup {
    fn world_size(&self) -> usize {
        2
    }
    fn all_reduce(
        &self,
        _: usize,
        _: &mut lazytrain_core::DeviceMemory,
        _: lazytrain_core::ir::AllReduceOp,
    ) -> std::result::Result<(), String> {
        Err("not in this test".into())
    }
    fn broadcast(&self, _: usize, _: &mut lazytrain_core::DeviceMemory) -> std::result::Result<(), String> {
        Err("not in this test".into())
    }
    fn agree_on_graph(&self, _: usize, _: u64) -> std::result::Result<(), String> {
        Ok(())
    }
    fn barrier(&self, _: usize) -> std::result::Result<(), String> {
        Ok(())
    }
    fn abort(&self, rank: usize, message: &str) {
        self.aborted.lock().unwrap().get_or_insert((rank, message.to_string()));
    }
    fn finished(&self, _: usize) {}
    fn abort_reason(&self) -> Option<(usize, String)> {
        self.aborted.lock().unwrap().clone()
    }
}

/// A replica whose asynchronous step panics aborts its group, so the other
/// replicas stop waiting for it at their collectives and barriers.
#[test]
fn a_panicking_asynchronous_step_aborts_the_replica_group() -> Result<()> {
    let group = std::sync::Arc::new(RecordingGroup::default());
    let link = lazytrain_core::collective::ReplicaLink { rank: 1, collective: group.clone() };
    let options = lazytrain_core::DeviceOptions { asynchronous: true, replica: Some(link), ordinal: 1 };
    let cache = std::sync::Arc::new(lazytrain_core::cache::CompileCache::new());
    let dev = Device::new(std::sync::Arc::new(PanickingBackend), cache, options)?;
    let y = Tensor::from_vec(vec![1.0f32, 2.0], [2], &dev)?.exp()?;
    dev.sync()?;
    assert!(dev.wait().is_err());
    let (rank, message) = group.aborted.lock().unwrap().clone().expect("the group was aborted");
    assert_eq!(rank, 1);
    assert!(message.contains("the step panicked: a kernel bug"), "{message}");
    assert!(y.to_vec::<f32>().is_err());
    Ok(())
}

/// A step whose planned peak exceeds the available memory fails when it is
/// compiled, before anything is allocated, naming what it needs; a dry run
/// plans a step and runs nothing.
#[test]
fn memory_is_known_before_a_step_runs() -> Result<()> {
    let dev = Device::cpu();
    let n = 400_000; // an outer product of 640 GB
    let a = Tensor::from_vec(vec![1.0f32; n], [n, 1], &dev)?;
    let b = Tensor::from_vec(vec![1.0f32; n], [1, n], &dev)?;
    let total = a.matmul(&b)?.sum_all()?;
    match dev.sync() {
        Err(lazytrain_core::Error::OutOfMemory { needed_bytes, available_bytes, largest_buffers, .. }) => {
            assert!(needed_bytes >= 4 * (n * n) as u64 && needed_bytes > available_bytes);
            assert_eq!(largest_buffers[0], 4 * (n * n) as u64, "the product is the largest buffer");
        }
        other => panic!("expected an out-of-memory error before running, got {other:?}"),
    }
    assert!(total.to_vec::<f32>().unwrap_err().to_string().contains("more memory at its peak"));
    // A dry run compiles and plans, runs nothing.
    let x = Tensor::from_vec(vec![1.0f32; 1024], [32, 32], &dev)?;
    let y = x.matmul(&x)?.exp()?;
    dev.plan_next_sync();
    match dev.sync() {
        Err(lazytrain_core::Error::DryRun { stats, input_bytes }) => {
            assert_eq!(input_bytes, 4096);
            assert!(stats.peak_bytes >= 4096 && stats.kernels >= 1, "{stats:?}");
        }
        other => panic!("expected a dry run, got {other:?}"),
    }
    assert!(y.to_vec::<f32>().is_err(), "nothing ran");
    let z = x.exp()?;
    assert_eq!(z.to_vec::<f32>()?[0], 1f32.exp(), "the next sync runs again");
    Ok(())
}
