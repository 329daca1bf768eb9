//! What `lazytrain train` is given, checked before anything is built: the
//! model (a preset, a folder or a cached Hub id), its tokenizer, prepared
//! data, and that data, tokenizer and model agree — so a mismatch is named
//! at once instead of failing deep inside a step.

use lazytrain::hub_cache;
use lazytrain::{Error, Result};
use lazytrain_data::TextTokenizer;
use lazytrain_models::PRESETS;
use lazytrain_storage::StorageUrl;
use std::path::{Path, PathBuf};

/// What `--model` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A preset to train from scratch, sized to the tokenizer.
    Preset(String),
    /// A model folder (a local one or a Hub snapshot).
    Folder(PathBuf),
}

impl ModelSource {
    /// Resolve `spec`: a folder with `config.json`, a preset, or a Hub id
    /// in the local cache at `revision`.
    pub fn resolve(spec: &str, revision: Option<&str>) -> Result<ModelSource> {
        let url = lazytrain_storage::StorageUrl::parse(spec)?;
        if url.is_remote() {
            return Ok(ModelSource::Folder(lazytrain_storage::fetch_folder(&url)?));
        }
        let path = Path::new(spec);
        if path.join("config.json").is_file() {
            return Ok(ModelSource::Folder(path.to_path_buf()));
        }
        if PRESETS.contains(&spec) {
            return Ok(ModelSource::Preset(spec.to_string()));
        }
        if path.is_dir() {
            return Err(Error::Input(format!(
                "--model {spec} is a folder without config.json; a model folder holds config.json and model.safetensors"
            )));
        }
        let cached = match hub_cache::is_hub_id(spec) {
            true => match hub_cache::resolve(spec, revision) {
                Ok(dir) => return Ok(ModelSource::Folder(dir)),
                Err(e) => format!("; {e}"),
            },
            false => String::new(),
        };
        Err(Error::Input(format!(
            "--model {spec} is neither a preset ({}) nor a model folder (no {spec}/config.json){cached}",
            PRESETS.join(", ")
        )))
    }

    /// The spec the model builders take: the preset name or the folder.
    pub fn spec(&self) -> String {
        match self {
            ModelSource::Preset(name) => name.clone(),
            ModelSource::Folder(dir) => dir.display().to_string(),
        }
    }
}

/// The tokenizer to train with: `--tokenizer` (a folder or a cached Hub
/// id), else the model folder's own. A preset needs one; a model folder
/// with its own tokenizer refuses another (its ids would mean other words).
pub fn tokenizer_for(
    model: &ModelSource,
    tokenizer: Option<&str>,
    revision: Option<&str>,
) -> Result<(PathBuf, TextTokenizer)> {
    let dir = match (tokenizer, model) {
        (Some(spec), _) => hub_cache::model_folder(spec, revision)?,
        (None, ModelSource::Folder(dir)) => dir.clone(),
        (None, ModelSource::Preset(name)) => {
            return Err(Error::Input(format!(
                "a preset ({name}) needs --tokenizer DIR: its vocabulary and special tokens come from the tokenizer \
                 (train one with `lazytrain train-tokenizer`)"
            )))
        }
    };
    let chosen = TextTokenizer::from_path(&dir)?;
    if let ModelSource::Folder(model_dir) = model {
        let own = model_dir.join("tokenizer.json");
        if own.is_file() && model_dir != &dir {
            let own = TextTokenizer::from_path(model_dir)?;
            if own.content_hash()? != chosen.content_hash()? {
                return Err(Error::Input(format!(
                    "the model in {} comes with its own tokenizer ({} tokens), but --tokenizer {} is another one \
                     ({} tokens): the model's ids would mean other words; leave out --tokenizer to use the model's",
                    model_dir.display(),
                    own.vocab_size(),
                    dir.display(),
                    chosen.vocab_size()
                )));
            }
        }
    }
    Ok((dir, chosen))
}

/// Refuse a path that is not a `prepare`/`prepare-classification` output
/// (a folder without `manifest.json`, or a file that is not a shard):
/// raw text given as data would otherwise fail as a corrupt shard.
pub fn check_prepared(url: &StorageUrl) -> Result<()> {
    // A bucket prefix is checked by reading its manifest (find_split).
    let Some(path) = url.local_path() else { return Ok(()) };
    let shard = path.is_file() && path.extension().is_some_and(|e| e == "tfrecord");
    let pattern = path.to_string_lossy().contains('*');
    if shard || pattern || path.join("manifest.json").is_file() {
        return Ok(());
    }
    let what = if path.is_dir() {
        "a folder without manifest.json"
    } else if path.exists() {
        "a file"
    } else {
        "missing"
    };
    Err(Error::Input(format!(
        "{} is not prepared data ({what}); run `lazytrain prepare --tokenizer TOKENIZER --files {} --output DATA` \
         (or `prepare-classification` for labelled rows) and pass the DATA folder",
        path.display(),
        path.display()
    )))
}

/// Refuse data prepared by another tokenizer than the one training reads
/// it with (the manifest records the tokenizer's hash and size).
pub fn check_data_tokenizer(
    data: &StorageUrl,
    (hash, vocab_size): (&str, usize),
    tokenizer: &TextTokenizer,
    tokenizer_dir: &Path,
) -> Result<()> {
    let ours = tokenizer.content_hash()?;
    if ours == hash {
        return Ok(());
    }
    Err(Error::Input(format!(
        "{} was prepared with another tokenizer (hash {hash}, {vocab_size} tokens) than {} (hash {ours}, {} tokens): \
         its ids would mean other words; prepare the data again with --tokenizer {}, or train with the tokenizer it \
         was prepared with",
        data,
        tokenizer_dir.display(),
        tokenizer.vocab_size(),
        tokenizer_dir.display()
    )))
}
