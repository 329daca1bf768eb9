//! `lazytrain bench --json` on BERT-tiny's anchor shapes: the report's
//! fields, one compile per step shape, a loss that falls, the masked-LM
//! head at the collator's capacity, and steady steps that fault in no
//! memory (no buffer of theirs is mapped afresh, the matmul library's
//! packing buffers included).

use serde_json::Value;
use std::process::Command;

/// One `lazytrain bench` run with `args` after `--model tiny --json`.
fn bench(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_lazytrain"))
        .args(["bench", "--model", "tiny", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// True when the FMA probe runs vector chains here (AVX2 and FMA or wider).
fn vector_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[test]
fn bench_reports_steady_steps_that_compile_nothing_and_fault_in_no_memory() {
    for (args, head, rows) in [
        (&["--steps", "2"][..], "masked-positions", 800),
        (&["--steps", "2", "--mlm-dense-head"][..], "dense", 32 * 128),
    ] {
        let report = bench(args);
        let number = |key: &str| report[key].as_f64().unwrap_or_else(|| panic!("{key} in {report}"));
        assert_eq!(report["mlm_head"], head);
        assert_eq!(number("mlm_head_rows") as usize, rows);
        assert_eq!(number("params") as usize, 1_536_128, "the anchor's BERT-tiny");
        // The first step's graph (no optimizer state yet) and the steady one.
        assert_eq!((number("compiles"), number("cache_hits")), (2.0, 3.0), "{report}");
        assert!(number("loss") < number("first_loss"), "{report}");
        assert!(number("step_ms_median") > 0.0 && number("gemm_peak_gflops") > 0.0);
        let (model, executed) = (number("model_gflops"), number("executed_gflops"));
        match head {
            "dense" => assert_eq!(model, executed),
            _ => assert!(executed < model, "{report}"),
        }
        // No step runs its matmul work faster than the FMA units can (on
        // CPUs whose vector FMAs the probe uses; elsewhere its scalar chains
        // are only a lower bound).
        let share = number("executed_of_fma_peak");
        assert!(number("fma_peak_gflops") > 0.0 && share > 0.0, "{report}");
        assert!(share < 1.0 || !vector_fma(), "{report}");
        if cfg!(target_os = "linux") {
            // A fresh step buffer of the smallest activation ([32, 128, 128]
            // f32) alone would fault in 512 pages.
            assert!(number("page_faults_per_step") < 64.0, "{report}");
        }
    }
}
