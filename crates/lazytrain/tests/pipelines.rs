//! Fill-mask and feature-extraction pipelines against `transformers`'
//! pipelines (fixtures in lazytrain-models/tests/fixtures/pipelines.json).

use lazytrain::folder::save_folder;
use lazytrain::pipelines::{FeatureExtraction, FillMask, TextGeneration};
use lazytrain_core::Device;
use lazytrain_data::TextTokenizer;
use lazytrain_models::hub;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../lazytrain-models/tests/fixtures")
}

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("pipelines.json")).unwrap()).unwrap()
}

/// HF returns a flat list for one mask and a list per mask for several.
fn per_mask(v: &Value) -> Vec<Value> {
    let list = v.as_array().unwrap();
    if list[0].is_array() {
        list.clone()
    } else {
        vec![v.clone()]
    }
}

#[test]
fn fill_mask_matches_transformers_batched_and_alone() {
    let dev = Device::cpu();
    let pipe = FillMask::from_dir(&fixtures().join("tiny-bert"), &dev).unwrap();
    let want = expected();
    let texts: Vec<&str> = want["fill_texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let batched = pipe.predict(&texts, 3).unwrap();
    for (i, text) in texts.iter().enumerate() {
        let alone = pipe.predict(&[text], 3).unwrap();
        assert_eq!(alone[0].len(), batched[i].len());
        for (a, b) in alone[0].iter().flatten().zip(batched[i].iter().flatten()) {
            assert_eq!((a.token, &a.sequence), (b.token, &b.sequence));
            assert!((a.score - b.score).abs() < 1e-6, "padding changed a score");
        }
        let masks = per_mask(&want["fill"][i]);
        assert_eq!(masks.len(), batched[i].len(), "{text}");
        for (got_mask, want_mask) in batched[i].iter().zip(&masks) {
            for (got, want) in got_mask.iter().zip(want_mask.as_array().unwrap()) {
                assert_eq!(got.token as i64, want["token"].as_i64().unwrap(), "{text}");
                assert_eq!(got.token_str, want["token_str"].as_str().unwrap());
                assert_eq!(got.sequence, want["sequence"].as_str().unwrap());
                assert!((got.score as f64 - want["score"].as_f64().unwrap()).abs() < 1e-4);
            }
        }
    }
}

#[test]
fn fill_mask_needs_a_mask() {
    let pipe = FillMask::from_dir(&fixtures().join("tiny-bert"), &Device::cpu()).unwrap();
    let msg = pipe.predict(&["the cat is big"], 5).err().unwrap().to_string();
    assert!(msg.contains("no mask token [MASK]") && msg.contains("the cat is big"), "{msg}");
    // A long line is quoted by its head, not echoed whole.
    let long = "word ".repeat(20_000);
    let msg = pipe.predict(&["a [MASK] .", &long], 5).err().unwrap().to_string();
    assert!(msg.starts_with("text 2 (\"word word") && msg.contains("...) has no mask token"), "{msg}");
    assert!(msg.len() < 300, "{} bytes", msg.len());
}

/// Errors about one line of `--input` name the line (empty lines included);
/// a folder given as the input file is named as such.
#[test]
fn input_lines_are_named_in_errors() {
    let dir = lazytrain_core::ScratchDir::new("pipelines-lines").unwrap();
    let input = dir.join("texts.txt");
    std::fs::write(&input, "a [MASK] .\n\nthe [MASK] .\n").unwrap();
    let model = fixtures().join("tiny-bert");
    let run = |input: &Path, batch: &str| {
        let args = ["fill-mask", "--model", model.to_str().unwrap(), "--input", input.to_str().unwrap()];
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lazytrain"))
            .args(args)
            .args(["--batch-size", batch])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    let err = run(&input, "1");
    assert!(err.contains("texts.txt: line 2: text 1 (\"\") has no mask token [MASK]"), "{err}");
    let err = run(&input, "8");
    assert!(err.contains("texts.txt: the batch of lines 1 to 3: text 2 (\"\") has no mask token"), "{err}");
    let err = run(&dir, "1");
    assert!(err.contains("is a folder; give a text file"), "{err}");
}

/// A `top_k` beyond the vocabulary gives every token once, best first (as
/// Hugging Face's pipeline), not an allocation of `top_k` predictions.
#[test]
fn fill_mask_gives_at_most_the_vocabulary() {
    let pipe = FillMask::from_dir(&fixtures().join("tiny-bert"), &Device::cpu()).unwrap();
    let all = pipe.predict(&["the capital of france is [MASK] ."], usize::MAX).unwrap();
    let five = pipe.predict(&["the capital of france is [MASK] ."], 5).unwrap();
    let vocab = pipe.tokenizer().vocab_size();
    assert_eq!(all[0][0].len(), vocab);
    let tokens = |p: &[lazytrain::pipelines::MaskPrediction]| p.iter().map(|m| m.token).collect::<Vec<_>>();
    assert_eq!(tokens(&all[0][0][..5]), tokens(&five[0][0]));
    let mut seen = tokens(&all[0][0]);
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), vocab, "every token once");
}

#[test]
fn feature_extraction_matches_transformers() {
    let dev = Device::cpu();
    let pipe = FeatureExtraction::from_dir(&fixtures().join("tiny-bert"), &dev).unwrap();
    let want = expected();
    let texts: Vec<&str> = want["feature_texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let got = pipe.extract(&texts).unwrap();
    for (i, features) in got.iter().enumerate() {
        let rows = want["features"][i][0].as_array().unwrap();
        assert_eq!(features.len(), rows.len(), "tokens of {}", texts[i]);
        for (g, w) in features.iter().zip(rows) {
            for (a, b) in g.iter().zip(w.as_array().unwrap()) {
                assert!((*a as f64 - b.as_f64().unwrap()).abs() < 1e-4);
            }
        }
    }
}

#[test]
fn exported_folders_load_back_and_pad_ids_are_checked() {
    let dev = Device::cpu();
    let src = fixtures().join("tiny-bert");
    let (model, _) = hub::load_masked_lm(&src, &dev).unwrap();
    let tokenizer = TextTokenizer::from_path(&src).unwrap();
    let out = lazytrain_core::ScratchDir::new("export").unwrap();
    save_folder(&out, &model, model.config(), &tokenizer).unwrap();
    for file in
        ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    {
        assert!(out.join(file).exists(), "{file}");
    }
    let a = FillMask::from_dir(&src, &dev).unwrap().predict(&["the capital of france is [MASK] ."], 5).unwrap();
    let b = FillMask::from_dir(&out, &dev).unwrap().predict(&["the capital of france is [MASK] ."], 5).unwrap();
    assert_eq!(a, b);
    let (roberta, _) = hub::load_masked_lm(&fixtures().join("tiny-roberta"), &dev).unwrap();
    let msg = save_folder(&out, &roberta, roberta.config(), &tokenizer).err().unwrap().to_string();
    assert!(msg.contains("pad_token_id 1") && msg.contains("pads with id 0"), "{msg}");
    let mut small = model.config().clone();
    small.vocab_size = 10;
    let msg = lazytrain::folder::check_tokenizer_fits(&small, &tokenizer).err().unwrap().to_string();
    assert!(msg.contains("but the model's vocab_size is 10"), "{msg}");
}

/// `text-generation` on the tiny GPT-2 fixture: greedy text equals
/// transformers' pipeline (prompt + continuation, byte-level decoding
/// included), each text alone and both in one batch, two compiles per batch shape.
#[test]
fn text_generation_matches_transformers() {
    let dev = Device::cpu();
    let dir = fixtures().join("tiny-gpt2");
    let want: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("outputs.json")).unwrap()).unwrap();
    let pipe = TextGeneration::from_dir(&dir, &dev).unwrap();
    let texts: Vec<&str> = want["pipeline_texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let new_tokens = want["pipeline_max_new_tokens"].as_u64().unwrap() as usize;
    let config = pipe.config_for(Some(new_tokens)).unwrap();
    let (together, stats) = pipe.generate(&texts, &config).unwrap();
    assert_eq!(stats.compiles, 2, "one prefill and one decode graph");
    for (i, text) in texts.iter().enumerate() {
        let expected = &want["pipeline"][i][0]["generated_text"];
        assert_eq!(together[i][0].generated_text, expected.as_str().unwrap(), "{text} in a batch");
        let (alone, stats) = pipe.generate(&[text], &config).unwrap();
        assert_eq!(alone[0][0].generated_text, expected.as_str().unwrap(), "{text} alone");
        // A batch of one is a new shape once; the second text reuses both graphs.
        assert_eq!(stats.compiles, if i == 0 { 2 } else { 0 }, "{stats:?}");
    }
}

/// A prompt longer than the model's positions, top-p outside (0, 1] and a
/// masked-LM folder are clear errors.
#[test]
fn text_generation_refuses_bad_input() {
    let dev = Device::cpu();
    let pipe = TextGeneration::from_dir(&fixtures().join("tiny-gpt2"), &dev).unwrap();
    let long = "the capital of ".repeat(40);
    let err = pipe.generate(&[&long], &pipe.config_for(Some(4)).unwrap()).unwrap_err().to_string();
    assert!(err.contains("exceeds the model's n_positions 64"), "{err}");
    let mut config = pipe.config_for(Some(4)).unwrap();
    config.do_sample = true;
    config.top_p = Some(1.2);
    let err = pipe.generate(&["the"], &config).unwrap_err().to_string();
    assert!(err.contains("top_p 1.2 must be in (0, 1]"), "{err}");
    let err = TextGeneration::from_dir(&fixtures().join("tiny-bert"), &dev).err().unwrap().to_string();
    assert!(err.contains("needs a gpt2 config"), "{err}");
    // Without an eos token, generation can only stop at a limit the user gives.
    let (mut model, _) = hub::load_causal_lm(&fixtures().join("tiny-gpt2"), &dev).unwrap();
    model.transformer.config.eos_token_id = None;
    let tokenizer = TextTokenizer::from_path(&fixtures().join("tiny-gpt2")).unwrap();
    let pipe = TextGeneration::new(model, tokenizer, &dev).unwrap();
    let err = pipe.config_for(None).unwrap_err().to_string();
    assert!(err.contains("no eos_token_id") && err.contains("--max-new-tokens"), "{err}");
    assert_eq!(pipe.config_for(Some(3)).unwrap().eos_token_id, None);
}

/// A classifier folder: tiny-bert-cls's weights with tiny-bert's tokenizer.
fn classifier_folder(name: &str) -> lazytrain_core::ScratchDir {
    let dir = lazytrain_core::ScratchDir::new(&format!("pipelines-{name}")).unwrap();
    for (from, file) in [("tiny-bert-cls", "config.json"), ("tiny-bert-cls", "model.safetensors")]
        .into_iter()
        .chain([("tiny-bert", "tokenizer.json"), ("tiny-bert", "tokenizer_config.json")])
    {
        std::fs::copy(fixtures().join(from).join(file), dir.join(file)).unwrap();
    }
    dir
}

fn lazytrain(args: &[&str], stdin: Option<&str>) -> (String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_lazytrain"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    assert!(out.status.success(), "lazytrain {args:?} failed: {stderr}");
    (stdout, stderr)
}

/// 600 lines through `text-classification --input FILE --json`: 600 JSON
/// lines in order, each equal to the text classified alone; texts that
/// begin with `-`; stdin; JSON Lines; one compile per length bucket.
#[test]
fn text_classification_streams_a_file_in_order() {
    let dir = classifier_folder("stream");
    let words = ["the", "capital", "of", "france", "is", "paris", "a", "big", "red", "cat", "-", "--toxic"];
    let texts: Vec<String> = (0..600)
        .map(|i: usize| {
            (0..1 + (i * 7) % 23).map(|j| words[(i * 31 + j * 17) % words.len()]).collect::<Vec<_>>().join(" ")
        })
        .collect();
    assert!(texts.iter().any(|t| t.starts_with('-')), "some texts begin with a dash");
    let file = dir.join("texts.txt");
    std::fs::write(&file, texts.join("\n") + "\n").unwrap();
    let model = dir.to_str().unwrap();
    let (stdout, stderr) = lazytrain(
        &["text-classification", "--model", model, "--input", file.to_str().unwrap(), "--json", "--verbose"],
        None,
    );
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 600);
    // One graph per 16-token bucket (the texts need at most two) at the batch size.
    assert!(stderr.contains("600 texts") && stderr.contains("graphs compiled"), "{stderr}");
    let compiled: u64 = stderr.split(", ").last().unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(compiled <= 2, "{stderr}");
    let pipe = lazytrain::pipelines::TextClassification::from_dir(&dir, &Device::cpu()).unwrap();
    for (i, (text, line)) in texts.iter().zip(&lines).enumerate() {
        let alone = &pipe.predict(&[text.as_str()], 1).unwrap()[0][0];
        assert_eq!(line[0]["label"], alone.label.as_str(), "line {i}: {text}");
        let score = line[0]["score"].as_f64().unwrap() as f32;
        assert!((score - alone.score).abs() < 1e-5, "line {i}: {score} vs {}", alone.score);
    }
    // Standard input, JSON Lines, and positional texts after `--`.
    let (stdout, _) = lazytrain(
        &["text-classification", "--model", model, "--input", "-", "--text-column", "body", "--json"],
        Some("{\"body\": \"the cat\"}\n{\"body\": \"--toxic substances\"}\n"),
    );
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    let (stdout, _) = lazytrain(&["text-classification", "--model", model, "--json", "--", "--toxic cat", "-a"], None);
    assert_eq!(serde_json::from_str::<Value>(&stdout).unwrap().as_array().unwrap().len(), 2, "{stdout}");
}

/// `--model org/name` resolves offline in a cache laid out as
/// `huggingface_hub` lays it out (refs/main → snapshots/<commit>), and a
/// model missing from it is an error naming the paths tried.
#[test]
fn models_load_by_hub_id_from_the_local_cache() {
    let cache = lazytrain_core::ScratchDir::new("pipelines-hub").unwrap();
    let repo = cache.join("models--some-org--tiny-bert");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), format!("{commit}\n")).unwrap();
    for file in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixtures().join("tiny-bert").join(file), snapshot.join(file)).unwrap();
    }
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_lazytrain"))
            .args(args)
            .env("HF_HUB_CACHE", &cache)
            .output()
            .unwrap()
    };
    let text = "the capital of france is [MASK] .";
    let by_id = run(&["fill-mask", "--model", "some-org/tiny-bert", "--json", text]);
    assert!(by_id.status.success(), "{}", String::from_utf8_lossy(&by_id.stderr));
    let by_path = run(&["fill-mask", "--model", fixtures().join("tiny-bert").to_str().unwrap(), "--json", text]);
    assert_eq!(by_id.stdout, by_path.stdout, "the same model");
    let pinned = run(&["fill-mask", "--model", "some-org/tiny-bert", "--revision", commit, "--json", text]);
    assert_eq!(pinned.stdout, by_path.stdout, "a commit as the revision");
    let missing = run(&["fill-mask", "--model", "some-org/absent", text]);
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && err.contains("models--some-org--absent/refs/main"), "{err}");
    assert!(err.contains("never downloads") && err.contains("huggingface-cli download some-org/absent"), "{err}");
    // A file is not mistaken for a Hub id.
    let file = fixtures().join("tiny-bert/config.json");
    let not_a_folder = run(&["fill-mask", "--model", file.to_str().unwrap(), text]);
    let err = String::from_utf8_lossy(&not_a_folder.stderr);
    assert!(!not_a_folder.status.success() && err.contains("config.json is a file; give a model folder"), "{err}");
}

/// Counts that would size an allocation are refused by the flag parser,
/// naming the flag, before anything loads.
#[test]
fn out_of_range_counts_are_refused_by_name() {
    let model = fixtures().join("tiny-bert");
    let model = model.to_str().unwrap();
    for (args, flag) in [
        (vec!["fill-mask", "--model", model, "--top-k", "0", "a [MASK]"], "--top-k"),
        (vec!["text-classification", "--model", model, "--top-k", "0", "a text"], "--top-k"),
        (vec!["fill-mask", "--model", model, "--input", "-", "--batch-size", "65537"], "--batch-size"),
        (vec!["bench", "--replicas", "1025"], "--replicas"),
        (vec!["demo", "--sentences", "18446744073709551615"], "--sentences"),
        (vec!["demo", "--countries", "10001"], "--countries"),
        (vec!["train-tokenizer", "--files", "x.txt", "--output", "t", "--model-max-length", "0"], "--model-max-length"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lazytrain")).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(&format!("for '{flag}")), "{args:?}: {stderr}");
    }
}

/// `export` writes into a new or empty folder; one that holds files (a
/// training run, another model) is refused unless `--overwrite` says to
/// replace them, and a file in the way is named.
#[test]
fn export_refuses_a_folder_holding_files_unless_told() {
    let src = fixtures().join("tiny-bert");
    let out = lazytrain_core::ScratchDir::new("export-guard").unwrap();
    let target = out.join("model");
    let export = |extra: &[&str]| {
        let mut args = vec!["export", "--model", src.to_str().unwrap(), "--output", target.to_str().unwrap()];
        args.extend_from_slice(extra);
        let run = std::process::Command::new(env!("CARGO_BIN_EXE_lazytrain")).args(&args).output().unwrap();
        (run.status.success(), String::from_utf8(run.stderr).unwrap())
    };
    assert!(export(&[]).0, "a new folder");
    let (ok, err) = export(&[]);
    assert!(
        !ok && err.contains("already holds 5 entries (config.json, model.safetensors, special_tokens_map.json, ...)")
    );
    assert!(err.contains("pass --overwrite"), "{err}");
    std::fs::write(target.join("trainer_state.json"), "{}").unwrap();
    assert!(export(&["--overwrite"]).0, "told to replace");
    assert!(target.join("trainer_state.json").exists(), "other files stay");
    std::fs::remove_dir_all(&target).unwrap();
    std::fs::write(&target, "not a folder").unwrap();
    let (ok, err) = export(&[]);
    assert!(!ok && err.contains("is a file; name a folder"), "{err}");
}
