//! Asynchronous devices: `sync` enqueues the step and returns, the host
//! traces the next step while this one runs, and the results equal the
//! synchronous ones bit for bit.

use lazytrain_core::backend::{Backend, CpuBackend, Executable, ExecutableStats};
use lazytrain_core::cache::CompileCache;
use lazytrain_core::collective::RunContext;
use lazytrain_core::schedule::{Capabilities, Schedule};
use lazytrain_core::{Buffer, DType, Device, DeviceOptions, Tensor};
use lazytrain_dist::{optimizer_step, spawn, SpawnConfig};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::optim::{AdamW, AdamWConfig, Optimizer, ParamGroup};
use lazytrain_nn::{named_parameters, Linear, NnError};
use std::sync::{Arc, Condvar, Mutex};

/// A gate the test opens; executables wait at it before running.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

/// The CPU backend, whose executables wait at the gate.
struct GatedBackend(Arc<Gate>);

struct GatedExecutable(Arc<dyn Executable>, Arc<Gate>);

impl Backend for GatedBackend {
    fn name(&self) -> &'static str {
        "gated-cpu"
    }

    fn capabilities(&self) -> Capabilities {
        CpuBackend::default().capabilities()
    }

    fn lower(&self, schedule: &Schedule) -> lazytrain_core::Result<Arc<dyn Executable>> {
        Ok(Arc::new(GatedExecutable(CpuBackend::default().lower(schedule)?, self.0.clone())))
    }
}

impl Executable for GatedExecutable {
    fn run(&self, inputs: Vec<Arc<Buffer>>, context: &RunContext) -> lazytrain_core::Result<Vec<Arc<Buffer>>> {
        self.1.wait();
        self.0.run(inputs, context)
    }

    fn stats(&self) -> ExecutableStats {
        self.0.stats()
    }
}

/// Three steps of gradient descent on `w` for `sum((w * x - 1)^2)`; returns `w`.
fn descend(device: &Device, steps: usize) -> lazytrain_core::Result<Tensor> {
    let w = Tensor::from_vec(vec![0.5f32, -1.0, 2.0], [3], device)?;
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], device)?;
    for _ in 0..steps {
        let residual = w.mul(&x)?.sub(&Tensor::ones([3], DType::F32, device)?)?;
        let grad = residual.mul(&x)?.mul(&Tensor::full([], 2.0, DType::F32, device)?)?;
        w.assign(&w.sub(&grad.mul(&Tensor::full([], 0.05, DType::F32, device)?)?)?)?;
        device.mark_step()?;
    }
    Ok(w)
}

#[test]
fn the_host_traces_the_next_step_while_the_device_runs_this_one() {
    let gate = Arc::new(Gate::default());
    let options = DeviceOptions { asynchronous: true, ..DeviceOptions::default() };
    let device = Device::new(Arc::new(GatedBackend(gate.clone())), Arc::new(CompileCache::new()), options).unwrap();
    assert!(device.is_asynchronous());
    // Three steps are traced and enqueued while the first cannot even start.
    let w = descend(&device, 3).unwrap();
    let metrics = device.metrics();
    assert_eq!(metrics.executions, 0, "no step ran: the host went on without waiting");
    assert_eq!(metrics.syncs, 3);
    gate.open();
    let asynchronous = w.to_vec::<f32>().unwrap();
    let synchronous = descend(&Device::cpu(), 3).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(asynchronous, synchronous);
    device.wait().unwrap();
    assert_eq!(device.metrics().executions, 3);
    assert!(device.metrics_report().contains("host waited on device"));
}

#[test]
fn a_failed_asynchronous_step_surfaces_at_the_read_and_at_wait() {
    let device = Device::new(
        Arc::new(CpuBackend::default()),
        Arc::new(CompileCache::new()),
        DeviceOptions { asynchronous: true, ..DeviceOptions::default() },
    )
    .unwrap();
    let table = Tensor::from_vec(vec![1.0f32, 2.0], [2, 1], &device).unwrap();
    let ids = Tensor::from_vec(vec![5i64], [1], &device).unwrap();
    let picked = table.gather(0, &ids.reshape([1, 1]).unwrap()).unwrap();
    device.sync().unwrap();
    let read = picked.to_vec::<f32>().unwrap_err().to_string();
    assert!(read.contains("could not be computed"), "{read}");
    assert!(device.wait().is_err());
    assert!(device.wait().is_ok(), "the failure is reported once");
}

/// Ten AdamW steps of a linear model on 2 replicas; returns the losses and weights.
fn train(asynchronous: bool) -> Vec<(Vec<f32>, Vec<f32>)> {
    spawn(&SpawnConfig::new(2).asynchronous(asynchronous), |replica| -> Result<_, NnError> {
        let device = replica.device();
        let model = Linear::new(&mut Initializer::new(3, device), 4, 2, true)?;
        let params = named_parameters(&model);
        let mut opt =
            AdamW::new(vec![ParamGroup { params: params.clone(), weight_decay: 0.0 }], AdamWConfig::default())?;
        let mut losses = Vec::new();
        for step in 0..10 {
            let x: Vec<f32> = (0..8).map(|i| ((i * 5 + step * 3 + replica.rank()) % 7) as f32 - 3.0).collect();
            let x = Tensor::from_vec(x, [2, 4], device)?;
            let loss = model.forward(&x)?.tanh()?.mean_all()?;
            loss.backward()?;
            optimizer_step(&mut opt, replica)?;
            opt.zero_grad();
            device.mark_step()?;
            losses.push(loss);
        }
        // Reading after the loop: every step was enqueued without waiting.
        let losses = losses.iter().map(|l| l.item::<f32>()).collect::<Result<Vec<_>, _>>()?;
        Ok((losses, params[0].1.to_vec::<f32>()?))
    })
    .unwrap()
}

#[test]
fn asynchronous_replicas_compute_what_synchronous_ones_do() {
    let asynchronous = train(true);
    let synchronous = train(false);
    assert_eq!(asynchronous, synchronous);
    assert_eq!(asynchronous[0].1, asynchronous[1].1);
}

/// `rendezvous` on asynchronous replicas waits for the replica's own
/// enqueued steps, and never meets a device that is inside a collective:
/// with rank 1 late, rank 0's host reaches the rendezvous while its device
/// waits in the all-reduce (the two used to complete a barrier generation
/// together, without rank 1).
#[test]
fn rendezvous_waits_for_the_replicas_own_steps() {
    use lazytrain_core::ir::AllReduceOp;
    let sums = spawn(&SpawnConfig::new(2).asynchronous(true), |replica| -> Result<Vec<Vec<f32>>, NnError> {
        let device = replica.device();
        let mut sums = Vec::new();
        for step in 0..3 {
            if replica.rank() == 1 {
                std::thread::sleep(std::time::Duration::from_millis(150));
            }
            let value = (replica.rank() + 1) as f32 * (step + 1) as f32;
            let y = Tensor::from_vec(vec![value; 4], [4], device)?.all_reduce(AllReduceOp::Sum)?;
            device.mark_step()?;
            replica.rendezvous().map_err(|detail| NnError::Invalid { what: "rendezvous", detail })?;
            assert!(!y.is_pending(), "the rendezvous waited for this replica's step");
            sums.push(y.to_vec::<f32>()?);
        }
        Ok(sums)
    })
    .unwrap();
    for replica in &sums {
        for (step, s) in replica.iter().enumerate() {
            assert_eq!(s, &vec![3.0 * (step + 1) as f32; 4]);
        }
    }
}
