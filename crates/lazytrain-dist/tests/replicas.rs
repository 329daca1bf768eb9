//! Data-parallel replicas: equivalence with one large batch, one compile
//! for the group, failure handling.

use lazytrain_core::backend::ReferenceBackend;
use lazytrain_core::{DType, Device, Tensor};
use lazytrain_dist::{optimizer_step, spawn, spawn_with, Launcher, SpawnConfig, SpawnError, ThreadLauncher};
use lazytrain_nn::init::Initializer;
use lazytrain_nn::optim::{AdamW, AdamWConfig, Optimizer, ParamGroup};
use lazytrain_nn::{named_parameters, Linear, Module, NnError};
use std::sync::Arc;
use std::time::{Duration, Instant};

const FEATURES: usize = 6;
const HIDDEN: usize = 8;
const BATCH: usize = 8;

/// A two-layer regression network.
struct Mlp {
    first: Linear,
    second: Linear,
}

impl Module for Mlp {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.first.visit_parameters(&format!("{prefix}first."), visit);
        self.second.visit_parameters(&format!("{prefix}second."), visit);
    }
}

impl Mlp {
    fn new(device: &Device) -> Result<Mlp, NnError> {
        let mut init = Initializer::new(7, device);
        Ok(Mlp {
            first: Linear::new(&mut init, FEATURES, HIDDEN, true)?,
            second: Linear::new(&mut init, HIDDEN, 1, true)?,
        })
    }

    fn loss(&self, x: &Tensor, y: &Tensor) -> Result<Tensor, NnError> {
        let pred = self.second.forward(&self.first.forward(x)?.tanh()?)?;
        Ok(pred.sub(y)?.square()?.mean_all()?)
    }
}

/// Rows `rows` of step `step`'s global batch.
fn batch(step: usize, rows: std::ops::Range<usize>, device: &Device) -> Result<(Tensor, Tensor), NnError> {
    let x: Vec<f32> = rows
        .clone()
        .flat_map(|r| (0..FEATURES).map(move |f| ((step * 31 + r * 7 + f * 3) % 11) as f32 / 5.0 - 1.0))
        .collect();
    let y: Vec<f32> = rows.clone().map(|r| ((step + r) % 5) as f32 / 2.0 - 1.0).collect();
    Ok((Tensor::from_vec(x, [rows.len(), FEATURES], device)?, Tensor::from_vec(y, [rows.len(), 1], device)?))
}

/// A replica's parameters, compiles and cache hits.
type ReplicaOutcome = (Vec<Vec<f32>>, u64, u64);

/// Train `steps` steps on `replicas` replicas (global batch `BATCH` split
/// evenly); each replica returns its parameters and its device's metrics.
fn train(
    replicas: usize,
    steps: usize,
    fail: Option<(usize, usize)>,
) -> Result<Vec<ReplicaOutcome>, SpawnError<NnError>> {
    train_with(&ThreadLauncher::default(), replicas, steps, fail)
}

/// [`train`] on the replicas `launcher` yields.
fn train_with(
    launcher: &dyn Launcher,
    replicas: usize,
    steps: usize,
    fail: Option<(usize, usize)>,
) -> Result<Vec<ReplicaOutcome>, SpawnError<NnError>> {
    spawn_with(launcher, &SpawnConfig::new(replicas), |replica| {
        let device = replica.device();
        let model = Mlp::new(device)?;
        let params = named_parameters(&model);
        let mut opt = AdamW::new(
            vec![ParamGroup { params: params.clone(), weight_decay: 0.01 }],
            AdamWConfig { lr: 0.05, ..AdamWConfig::default() },
        )?;
        let per = BATCH / replica.world_size();
        for step in 0..steps {
            if fail == Some((replica.rank(), step)) {
                return Err(NnError::Invalid {
                    what: "test",
                    detail: format!("replica {} gives up at step {step}", replica.rank()),
                });
            }
            let (x, y) = batch(step, replica.rank() * per..(replica.rank() + 1) * per, device)?;
            model.loss(&x, &y)?.backward()?;
            optimizer_step(&mut opt, replica)?;
            opt.zero_grad();
            device.mark_step()?;
        }
        let values = params.iter().map(|(_, p)| p.to_vec::<f32>()).collect::<Result<Vec<_>, _>>()?;
        let metrics = device.metrics();
        Ok((values, metrics.compiles, metrics.cache_hits))
    })
}

#[test]
fn two_replicas_with_half_batches_match_one_replica_with_the_whole_batch() {
    let single = train(1, 10, None).unwrap();
    let pair = train(2, 10, None).unwrap();
    assert_eq!(pair[0].0, pair[1].0, "replicas hold bit-identical parameters");
    let mut worst = 0f32;
    for (a, b) in single[0].0.iter().flatten().zip(pair[0].0.iter().flatten()) {
        worst = worst.max((a - b).abs() / a.abs().max(1e-3));
    }
    assert!(worst < 1e-5, "relative difference {worst}");
    // The parameters moved: the comparison is not between two initial states.
    let init = Mlp::new(&Device::cpu()).unwrap();
    let first = named_parameters(&init)[0].1.to_vec::<f32>().unwrap();
    assert!(first.iter().zip(&single[0].0[0]).any(|(a, b)| (a - b).abs() > 1e-3));
}

#[test]
fn the_step_compiles_once_for_all_replicas() {
    let single = train(1, 4, None).unwrap();
    let four = train(4, 4, None).unwrap();
    let compiles: u64 = four.iter().map(|r| r.1).sum();
    assert!(single[0].1 > 0);
    assert_eq!(compiles, single[0].1, "four replicas compile what one compiles");
    let hits: u64 = four.iter().map(|r| r.2).sum();
    assert_eq!(hits + compiles, 4 * (single[0].1 + single[0].2), "every other sync is a cache hit");
}

#[test]
fn a_failing_replica_stops_the_group_with_its_error() {
    let started = Instant::now();
    let error = train(2, 10, Some((1, 3))).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    match error {
        SpawnError::Replica { rank, error } => {
            assert_eq!(rank, 1);
            assert!(error.to_string().contains("gives up at step 3"), "{error}");
        }
        other => panic!("expected replica 1's error, got {other}"),
    }
}

#[test]
fn a_panicking_replica_stops_the_group() {
    let started = Instant::now();
    let result: Result<Vec<()>, SpawnError<NnError>> = spawn(&SpawnConfig::new(3), |replica| {
        let x = Tensor::ones([4], DType::F32, replica.device())?;
        for step in 0..5 {
            if replica.rank() == 2 && step == 2 {
                panic!("replica 2 hit a bug");
            }
            let _ = x.all_reduce(lazytrain_core::ir::AllReduceOp::Sum)?.to_vec::<f32>()?;
        }
        Ok(())
    });
    assert!(started.elapsed() < Duration::from_secs(5));
    match result {
        Err(SpawnError::Panicked { rank: 2, message }) => assert!(message.contains("hit a bug")),
        other => panic!("expected replica 2's panic, got {:?}", other.err().map(|e| e.to_string())),
    }
}

#[test]
fn replicas_that_run_different_step_counts_fail_instead_of_hanging() {
    let result: Result<Vec<()>, SpawnError<NnError>> = spawn(&SpawnConfig::new(2), |replica| {
        let x = Tensor::ones([4], DType::F32, replica.device())?;
        for _ in 0..(2 + replica.rank()) {
            let _ = x.all_reduce(lazytrain_core::ir::AllReduceOp::Sum)?.to_vec::<f32>()?;
        }
        Ok(())
    });
    let error = result.unwrap_err().to_string();
    assert!(error.contains("same number of steps"), "{error}");
}

#[test]
fn all_reduce_sums_and_averages_over_replicas() {
    let results = spawn(&SpawnConfig::new(3), |replica| -> Result<_, NnError> {
        let x = Tensor::from_vec(vec![replica.rank() as f32, 1.0], [2], replica.device())?;
        let sum = x.all_reduce(lazytrain_core::ir::AllReduceOp::Sum)?;
        let mean = x.all_reduce(lazytrain_core::ir::AllReduceOp::Mean)?;
        Ok((sum.to_vec::<f32>()?, mean.to_vec::<f32>()?, replica.is_master()))
    })
    .unwrap();
    for (rank, (sum, mean, master)) in results.into_iter().enumerate() {
        assert_eq!(sum, vec![3.0, 3.0]);
        assert_eq!(mean, vec![1.0, 1.0]);
        assert_eq!(master, rank == 0);
    }
}

#[test]
fn replicas_on_the_reference_backend_train_like_the_cpu_backend() {
    let reference = ThreadLauncher { backend: Some(Arc::new(ReferenceBackend)) };
    let names = spawn_with(&reference, &SpawnConfig::new(2), |replica| -> Result<_, NnError> {
        Ok(replica.device().backend_name())
    })
    .unwrap();
    assert_eq!(names, vec!["reference", "reference"]);
    let oracle = train_with(&reference, 2, 5, None).unwrap();
    let cpu = train(2, 5, None).unwrap();
    assert_eq!(oracle[0].0, oracle[1].0, "replicas hold bit-identical parameters");
    for (a, b) in oracle[0].0.iter().flatten().zip(cpu[0].0.iter().flatten()) {
        // AdamW normalises updates, so summation-order differences show at 1e-6.
        assert!((a - b).abs() <= 1e-5 + 1e-4 * a.abs(), "reference {a} vs cpu {b}");
    }
}

#[test]
fn a_launcher_that_cannot_form_the_group_is_a_setup_error() {
    struct Broken;
    impl Launcher for Broken {
        fn replicas(&self, _: &SpawnConfig) -> Result<Vec<lazytrain_dist::ReplicaSetup>, String> {
            Err("rank 3 did not join".into())
        }
    }
    let result: Result<Vec<()>, SpawnError<NnError>> = spawn_with(&Broken, &SpawnConfig::new(2), |_| Ok(()));
    match result {
        Err(SpawnError::Setup(message)) => assert!(message.contains("rank 3 did not join"), "{message}"),
        other => panic!("expected a setup error, got {:?}", other.err().map(|e| e.to_string())),
    }
}

#[test]
fn replicas_that_trace_different_graphs_fail_with_both_hashes() {
    let started = Instant::now();
    let result: Result<Vec<()>, SpawnError<NnError>> = spawn(&SpawnConfig::new(2), |replica| {
        let x = Tensor::ones([4], DType::F32, replica.device())?;
        // Same shapes and lengths, different computation on replica 1.
        let y = if replica.rank() == 1 { x.exp()? } else { x.neg()? };
        let _ = y.all_reduce(lazytrain_core::ir::AllReduceOp::Sum)?.to_vec::<f32>()?;
        Ok(())
    });
    assert!(started.elapsed() < Duration::from_secs(5));
    let error = result.unwrap_err().to_string();
    assert!(error.contains("traced different step graphs"), "{error}");
    assert!(error.contains("replica 0 runs graph") && error.contains("replica 1 runs graph"), "{error}");
}

#[test]
fn replicas_start_from_replica_0s_weights_and_seed() {
    use lazytrain_dist::{broadcast_from_master, check_same_as_master};
    let results = spawn(&SpawnConfig::new(3), |replica| -> Result<_, NnError> {
        let device = replica.device();
        let w = Tensor::from_vec(vec![replica.rank() as f32 + 0.5; 4], [2, 2], device)?;
        let b = Tensor::from_vec(vec![replica.rank() as i64], [1], device)?;
        broadcast_from_master(device, &[w.clone(), b.clone()])?;
        check_same_as_master(device, "seed", 42, "give every replica the same seed")?;
        Ok((w.to_vec::<f32>()?, b.to_vec::<i64>()?))
    })
    .unwrap();
    assert!(results.iter().all(|r| *r == (vec![0.5; 4], vec![0])), "{results:?}");
    let mismatch: Result<Vec<()>, SpawnError<NnError>> = spawn(&SpawnConfig::new(2), |replica| {
        check_same_as_master(replica.device(), "seed", 7 + replica.rank() as u64, "give every replica the same seed")?;
        Ok(())
    });
    let error = mismatch.unwrap_err().to_string();
    assert!(error.contains("replica 1 has seed 8 but replica 0 has 7; give every replica the same seed"), "{error}");
}

/// Collectives carry the step tag: a replica that skipped a step reduces
/// with the others' next step and fails naming both steps instead of
/// averaging two steps' gradients.
#[test]
fn replicas_a_step_apart_fail_naming_both_steps() {
    let result: Result<Vec<()>, SpawnError<NnError>> = spawn(&SpawnConfig::new(2), |replica| {
        let x = Tensor::ones([4], DType::F32, replica.device())?;
        let steps: &[u64] = if replica.rank() == 0 { &[0, 1, 2] } else { &[0, 2, 3] };
        for &step in steps {
            replica.device().set_step_tag(step);
            let _ = x.all_reduce(lazytrain_core::ir::AllReduceOp::Sum)?.to_vec::<f32>()?;
        }
        Ok(())
    });
    let error = result.unwrap_err().to_string();
    assert!(
        error.contains("disagree on the step of an all_reduce") && error.contains("step 1") && error.contains("step 2"),
        "{error}"
    );
}
