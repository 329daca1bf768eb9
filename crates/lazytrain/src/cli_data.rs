//! `lazytrain train-tokenizer` and `lazytrain prepare`.

use crate::cli_storage::{local_input, matched_inputs, staging, tokenizer_path, OutputFolder};
use clap::Args;
use lazytrain_data::formats::{read_into, DocumentSink, InputFormat, TextSource};
use lazytrain_data::prepare::{Packing, Preparation, PrepareOptions};
use lazytrain_data::train_tokenizer::{Normalization, SubwordModel, TokenizerTraining};
use lazytrain_data::{DataError, TextTokenizer, TokenizerStyle};
use lazytrain_storage::StorageUrl;
use std::path::Path;
use std::time::Instant;

/// Where the texts of input files are: their format and column.
#[derive(Args)]
pub struct InputColumns {
    /// The input format: txt, jsonl, csv, tsv, parquet or arrow (Arrow IPC streams and files, Feather) (default:
    /// from each file's extension).
    #[arg(long)]
    format: Option<String>,
    /// The column (JSON field) holding the text in jsonl, csv, tsv, parquet and arrow files.
    #[arg(long, default_value = "text")]
    text_column: String,
}

impl InputColumns {
    /// Give the documents of `files` to `docs` as they are read, with a
    /// notice of skipped null rows. A bucket object is downloaded while
    /// the input before it is read, and removed once read itself, so local
    /// disk holds two inputs at a time, not the corpus.
    fn stream(&self, files: &[StorageUrl], docs: &mut dyn DocumentSink) -> lazytrain::Result<()> {
        let format = self.format.as_deref().map(InputFormat::parse).transpose()?;
        let source = TextSource { format, text_column: self.text_column.clone() };
        let staging = staging("inputs")?;
        let nulls_before = docs.counts().1;
        let inputs = matched_inputs(files)?;
        std::thread::scope(|scope| {
            let fetch = |n: usize| {
                let (input, staging) = (&inputs[n], &staging);
                scope.spawn(move || local_input(input, n, staging))
            };
            let mut next = (!inputs.is_empty()).then(|| fetch(0));
            for (n, input) in inputs.iter().enumerate() {
                let fetched = next.take().expect("each input is fetched before its turn").join();
                let local = fetched.map_err(|panic| {
                    let why = lazytrain_core::panic_message(&*panic);
                    lazytrain::Error::Input(format!("{input}: the download failed ({why})"))
                })??;
                next = (n + 1 < inputs.len()).then(|| fetch(n + 1));
                read_into(&local, &source, docs).map_err(|e| named_as_given(e, &local, input))?;
                if input.is_remote() {
                    std::fs::remove_file(&local)
                        .map_err(|e| lazytrain::Error::Input(format!("{}: {e}", local.display())))?;
                }
            }
            Ok::<(), lazytrain::Error>(())
        })?;
        let nulls = docs.counts().1 - nulls_before;
        if nulls > 0 {
            eprintln!("note: skipped {nulls} rows whose `{}` is null or missing", self.text_column);
        }
        Ok(())
    }
}

/// `error` about the downloaded copy `local` of `input`, naming `input`
/// (the bucket object the user gave) instead.
fn named_as_given(error: DataError, local: &Path, input: &StorageUrl) -> DataError {
    match error {
        DataError::Io { path, detail } if Path::new(&path) == local => {
            DataError::Io { path: input.to_string(), detail }
        }
        other => other,
    }
}

/// Options for `lazytrain train-tokenizer`.
#[derive(Args)]
pub struct TrainTokenizerArgs {
    /// Text files: .txt (one document per line), .jsonl, .csv, .tsv, .parquet, a `datasets` .arrow file or
    /// .feather (`.gz` or `.zst` for the line formats); paths and quoted patterns ('texts/*.txt'), or gs://,
    /// s3:// objects and patterns (gs://b/texts/*.txt).
    #[arg(long, required = true, num_args = 1..)]
    files: Vec<StorageUrl>,
    #[command(flatten)]
    input: InputColumns,
    /// unigram, wordpiece or bpe.
    #[arg(long, default_value = "unigram")]
    model: String,
    /// Target vocabulary size.
    #[arg(long, default_value_t = 8192)]
    vocab_size: usize,
    /// bert ([CLS] [SEP] [MASK] ...), roberta (<s> </s> <mask> ...) or gpt2
    /// (<|endoftext|> only; with --model bpe, GPT-2's byte-level BPE).
    #[arg(long, default_value = "bert")]
    style: String,
    /// style (the style's own: BERT's lowercasing normaliser, NFC for roberta, none for gpt2) or
    /// nfkc-lowercase (NFKC then lowercase, as SentencePiece-style recipes use).
    #[arg(long, default_value = "style")]
    normalizer: String,
    /// Maximum sequence length recorded in tokenizer_config.json.
    #[arg(long, default_value_t = 512, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    model_max_length: usize,
    /// Output folder, or a gs://, s3:// prefix.
    #[arg(long)]
    output: StorageUrl,
}

/// Train and save a tokenizer.
pub fn train(args: &TrainTokenizerArgs) -> lazytrain::Result<()> {
    let start = Instant::now();
    let model = SubwordModel::parse(&args.model)?;
    let style = TokenizerStyle::parse(&args.style)?;
    let normalization = Normalization::parse(&args.normalizer)?;
    // The words are counted as the files are read.
    let mut training = TokenizerTraining::new(model, args.vocab_size, style, normalization)?;
    args.input.stream(&args.files, &mut training)?;
    let (documents, _) = training.counts();
    let tokenizer = training.finish()?;
    let n = tokenizer.vocab_size();
    match n.cmp(&args.vocab_size) {
        std::cmp::Ordering::Greater => eprintln!(
            "note: the vocabulary has {n} tokens, more than --vocab-size {}: it holds every character of the text \
             (byte-level BPE all 256 bytes) and the special tokens",
            args.vocab_size
        ),
        std::cmp::Ordering::Less => eprintln!(
            "note: the text gave {n} tokens of the {} --vocab-size asks for (too little text, or too few distinct words)",
            args.vocab_size
        ),
        std::cmp::Ordering::Equal => {}
    }
    let output = OutputFolder::new(&args.output)?;
    tokenizer.save(&output.path(), args.model_max_length)?;
    output.publish(&["tokenizer.json"])?;
    println!(
        "trained a {} {:?}-style tokenizer ({} tokens) on {} documents in {:.1} s -> {}",
        args.model,
        style,
        tokenizer.vocab_size(),
        documents,
        start.elapsed().as_secs_f64(),
        args.output
    );
    Ok(())
}

/// Options for `lazytrain prepare`.
#[derive(Args)]
pub struct PrepareArgs {
    /// A tokenizer folder (or tokenizer.json), or a gs://, s3:// folder.
    #[arg(long)]
    tokenizer: StorageUrl,
    /// Text files: .txt (one document per line), .jsonl, .csv, .tsv, .parquet, a `datasets` .arrow file or
    /// .feather (`.gz` or `.zst` for the line formats); paths and quoted patterns ('texts/*.txt'), or gs://,
    /// s3:// objects and patterns (gs://b/texts/*.txt).
    #[arg(long, required = true, num_args = 1..)]
    files: Vec<StorageUrl>,
    /// Held-out files whose blocks are all validation blocks (HF's --validation_file); the
    /// --validation-fraction of the training files is then 0 unless given.
    #[arg(long, num_args = 1..)]
    validation_files: Vec<StorageUrl>,
    #[command(flatten)]
    input: InputColumns,
    /// Tokens per block.
    #[arg(long, default_value_t = 128)]
    block_size: usize,
    /// Training shards.
    #[arg(long, default_value_t = 8)]
    num_shards: usize,
    /// Fraction of the training files' blocks held out for validation (default 0.01, or 0 with
    /// --validation-files).
    #[arg(long)]
    validation_fraction: Option<f64>,
    /// Seed of the split.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// group-texts (HF run_mlm.py: each document with its special tokens, concatenated, cut) or
    /// wrapped (RoBERTa's stream: documents joined by </s>, cut into block-size - 2 pieces, each
    /// wrapped as <s> piece </s>).
    #[arg(long, default_value = "group-texts")]
    packing: String,
    /// Output folder, or a gs://, s3:// prefix.
    #[arg(long)]
    output: StorageUrl,
}

/// Tokenize, pack and shard.
pub fn run_prepare(args: &PrepareArgs) -> lazytrain::Result<()> {
    let start = Instant::now();
    let tokenizer = TextTokenizer::from_path(&tokenizer_path(&args.tokenizer)?)?;
    if let Some(both) = args.validation_files.iter().find(|v| args.files.contains(v)) {
        eprintln!(
            "warning: {both} is both a training and a validation file: the eval loss will score text the model \
             trained on"
        );
    }
    let held_out = !args.validation_files.is_empty();
    let options = PrepareOptions {
        block_size: args.block_size,
        num_shards: args.num_shards,
        validation_fraction: args.validation_fraction.unwrap_or(if held_out { 0.0 } else { 0.01 }),
        seed: args.seed,
        progress: true,
        packing: Packing::parse(&args.packing)?,
    };
    let output = OutputFolder::new(&args.output)?;
    // The documents are tokenized and written as the files are read.
    let mut preparation = Preparation::new(&tokenizer, &output.path(), &options, held_out)?;
    args.input.stream(&args.files, &mut preparation)?;
    if held_out {
        preparation.held_out()?;
        args.input.stream(&args.validation_files, &mut preparation)?;
    }
    let manifest = preparation.finish()?;
    output.publish(&["manifest.json"])?;
    println!(
        "{} documents, {} tokens -> {} train and {} validation blocks of {} ({} tokens dropped) in {:.1} s -> {}",
        manifest.documents,
        manifest.tokens,
        manifest.train_records(),
        manifest.validation.iter().map(|s| s.records).sum::<u64>(),
        manifest.block_size,
        manifest.dropped_tokens,
        start.elapsed().as_secs_f64(),
        args.output
    );
    Ok(())
}

/// Options for `lazytrain bench-loader`.
#[derive(Args)]
pub struct BenchLoaderArgs {
    /// A prepared folder (shards + manifest), or a gs://, s3:// prefix.
    #[arg(long)]
    data: StorageUrl,
    /// The tokenizer the data was prepared with.
    #[arg(long)]
    tokenizer: StorageUrl,
    /// Rows per batch.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Batches to time.
    #[arg(long, default_value_t = 200)]
    batches: u64,
    /// Skip corrupt records (counted in a warning) instead of failing.
    #[arg(long)]
    skip_corrupt: bool,
}

/// Time the DeviceLoader alone: read, collate (masking for a masked-LM
/// tokenizer, the blocks as labels for GPT-2's), upload.
pub fn bench_loader(args: &BenchLoaderArgs) -> lazytrain::Result<()> {
    use lazytrain::trainer::task::TaskCollator;
    use lazytrain_data::collator::{CausalLmCollator, MlmCollator};
    use lazytrain_data::dataset::EpochSampler;
    use lazytrain_data::loader::{DeviceLoader, LoaderPlan};
    let tokenizer_dir = tokenizer_path(&args.tokenizer)?;
    let tokenizer = TextTokenizer::from_path(&tokenizer_dir)?;
    // The same checks as `train`: the tokenizer that prepared the data, and
    // every record the manifest lists.
    if let Ok(manifest) = lazytrain_data::prepare::Manifest::read_url(&args.data) {
        let prepared_with = (manifest.tokenizer_hash.as_str(), manifest.vocab_size);
        crate::cli_inputs::check_data_tokenizer(&args.data, prepared_with, &tokenizer, &tokenizer_dir)?;
    }
    let data = crate::cli_train::open_split(&args.data, "train", args.skip_corrupt)?;
    let collator = match tokenizer.special().mask {
        Some(_) => TaskCollator::MaskedLm(MlmCollator::for_tokenizer(&tokenizer, 0.15, 0)?),
        None => TaskCollator::CausalLm(CausalLmCollator { pad_id: tokenizer.special().pad, pad_to_multiple_of: 8 }),
    };
    let device = lazytrain_core::Device::cpu();
    let plan = LoaderPlan {
        batch_size: args.batch_size,
        prefetch: 2,
        start_epoch: 0,
        start_sample: 0,
        max_batches: Some(args.batches),
        epochs: u64::MAX,
    };
    let sampler = EpochSampler::new(data.len(), 0, true, 0, 1)?;
    let start = Instant::now();
    let mut rows = 0usize;
    for batch in DeviceLoader::new(data, sampler, collator, plan, &device)? {
        rows += batch?.input_ids.dims()[0];
    }
    let secs = start.elapsed().as_secs_f64();
    let io = lazytrain_storage::storage_metrics();
    println!(
        "{{\"sequences\": {rows}, \"seconds\": {secs:.3}, \"sequences_per_s\": {:.1}, \"bucket_requests\": {}, \
         \"bucket_retries\": {}, \"bucket_mb_read\": {:.1}}}",
        rows as f64 / secs,
        io.requests,
        io.retries,
        io.bytes_read as f64 / 1e6
    );
    Ok(())
}
