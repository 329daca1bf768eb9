//! `lazytrain demo --task causal-lm`: the GPT-2 workflow on the embedded
//! corpus — a byte-level BPE tokenizer with `<|endoftext|>`, shards, a tiny
//! GPT-2 trained and evaluated, a Hugging Face folder, and greedy
//! text-generation completing "the capital of X is" from the saved model.

use crate::cli_train::{open_split, preset_config};
use crate::demo::{pretraining_args, print_report, train_and_report, DemoArgs};
use lazytrain::pipelines::TextGeneration;
use lazytrain::trainer::{install_interrupt_handler, Trainer};
use lazytrain_core::Device;
use lazytrain_data::corpus::demo_corpus;
use lazytrain_data::prepare::{prepare, PrepareOptions};
use lazytrain_data::train_tokenizer::{train_tokenizer, SubwordModel};
use lazytrain_data::TokenizerStyle;
use lazytrain_models::Gpt2LMHeadModel;
use lazytrain_nn::init::Initializer;
use std::time::Instant;

/// Run the causal-LM demo and print a report.
pub fn run(args: &DemoArgs) -> lazytrain::Result<()> {
    let start = Instant::now();
    let out = &args.output_dir;
    let io = |e: std::io::Error| lazytrain::Error::Input(format!("{}: {e}", out.display()));
    std::fs::create_dir_all(out).map_err(io)?;
    let corpus = demo_corpus(args.seed, args.countries, args.sentences);
    std::fs::write(out.join("corpus.txt"), corpus.sentences.join("\n")).map_err(io)?;
    println!("1/5 corpus: {} sentences about {} countries", corpus.sentences.len(), corpus.countries.len());

    let tokenizer = train_tokenizer(&corpus.sentences, SubwordModel::Bpe, 600, TokenizerStyle::Gpt2)?;
    println!("2/5 tokenizer: GPT-2 byte-level BPE, {} tokens, <|endoftext|> between sentences", tokenizer.vocab_size());

    let block_size = 32;
    let options = PrepareOptions {
        block_size,
        num_shards: 2,
        validation_fraction: 0.02,
        seed: args.seed,
        progress: false,
        ..Default::default()
    };
    let manifest = prepare(&tokenizer, &corpus.sentences, &out.join("gpt2-data"), &options)?;
    println!("3/5 data: {} training blocks of {block_size} tokens", manifest.train_records());

    let device = Device::cpu();
    let training = pretraining_args(args, &out.join("gpt2"));
    // gpt2-tiny (2 layers, 128 hidden) with 4 heads of 32, like the masked-LM demo's model.
    let mut config = preset_config("gpt2-tiny", &tokenizer)?;
    config.num_attention_heads = 4;
    let model = Gpt2LMHeadModel::new(&mut Initializer::new(args.seed, &device), &config)?;
    let train = open_split(&lazytrain_storage::StorageUrl::Local(out.join("gpt2-data")), "train", false)?;
    let eval = open_split(&lazytrain_storage::StorageUrl::Local(out.join("gpt2-data")), "validation", false)?;
    install_interrupt_handler();
    let mut trainer = Trainer::for_causal_lm(training, model, tokenizer, train, Some(eval), block_size, &device)?
        .with_progress_bar(true);
    let result = train_and_report(&mut trainer)?;

    let pipe = TextGeneration::from_dir(&out.join("gpt2"), &device)?;
    let texts: Vec<String> = corpus.countries.iter().map(|c| format!("the capital of {} is", c.name)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let (answers, stats) = pipe.generate(&refs, &pipe.config_for(Some(4))?)?;
    println!("5/5 text-generation with the saved model ({}):", out.join("gpt2").display());
    let mut correct = 0;
    for ((country, text), answer) in corpus.countries.iter().zip(&texts).zip(&answers) {
        let generated = &answer[0].generated_text;
        let next_word = generated[text.len()..].split_whitespace().next().unwrap_or("");
        let ok = next_word == country.capital;
        correct += usize::from(ok);
        println!("  {generated:<48} {}", if ok { "correct" } else { "WRONG" });
    }
    println!(
        "  ({} tokens in {:.2} s, {} graphs compiled for {} prompts)",
        stats.new_tokens,
        stats.seconds,
        stats.compiles,
        texts.len()
    );
    let flops_per_token = crate::cli_bench::anchor_flops_per_token(trainer.model.config(), block_size);
    print_report(args, start, &result, flops_per_token, &device)?;
    println!("  answers correct    {correct}/{}", corpus.countries.len());
    Ok(())
}
