//! Checkpoints: `checkpoint-{step}/` written whole or not at all.
//!
//! Files go into a temporary sibling folder, each fsynced; `trainer_state.json`
//! comes last; then the folder is renamed into place. A crash leaves either
//! the previous checkpoints or the new complete one, and a folder without
//! `trainer_state.json` is never taken for a checkpoint.

use super::args::TrainingArguments;
use super::state::{RngState, SchedulerState, TrainerState};
use crate::folder::save_folder;
use crate::{Error, Result};
use lazytrain_data::TextTokenizer;
use lazytrain_models::ModelConfig;
use lazytrain_nn::optim::Optimizer;
use lazytrain_nn::state::{save_safetensors, write_atomically};
use lazytrain_nn::Module;
use std::path::{Path, PathBuf};

/// What goes into a checkpoint.
pub struct CheckpointContents<'a> {
    /// The model (saved as a Hugging Face folder with its tokenizer).
    pub model: &'a dyn Module,
    /// Its configuration.
    pub config: &'a ModelConfig,
    /// The tokenizer.
    pub tokenizer: &'a TextTokenizer,
    /// The optimizer (moments and step count).
    pub optimizer: &'a dyn Optimizer,
    /// The LR schedule.
    pub scheduler: &'a SchedulerState,
    /// The random state.
    pub rng: &'a RngState,
    /// The trainer state.
    pub state: &'a TrainerState,
    /// The arguments.
    pub args: &'a TrainingArguments,
}

fn json_file(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::Input(e.to_string()))?;
    Ok(write_atomically(path, text.as_bytes())?)
}

/// The step of a `checkpoint-{step}` folder name.
pub(crate) fn step_of(path: &Path) -> Option<u64> {
    path.file_name()?.to_str()?.strip_prefix("checkpoint-")?.parse().ok()
}

/// Complete checkpoints in `output_dir`, oldest first.
pub fn checkpoints(output_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(output_dir) else { return Vec::new() };
    let mut found: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("trainer_state.json").is_file())
        .filter_map(|p| step_of(&p).map(|s| (s, p)))
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

/// The newest complete checkpoint, if any.
pub fn latest_checkpoint(output_dir: &Path) -> Option<PathBuf> {
    checkpoints(output_dir).pop()
}

/// Write `checkpoint-{step}` into `output_dir` atomically; returns its path.
/// On failure (a full disk, say) the temporary folder is removed and every
/// earlier checkpoint is left as it was.
pub fn save_checkpoint(output_dir: &Path, contents: &CheckpointContents) -> Result<PathBuf> {
    let step = contents.state.global_step;
    let final_dir = output_dir.join(format!("checkpoint-{step}"));
    let tmp = output_dir.join(format!(".checkpoint-{step}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let written = write_into(&tmp, contents).and_then(|()| {
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(|e| Error::Input(format!("{}: {e}", final_dir.display())))?;
        }
        std::fs::rename(&tmp, &final_dir).map_err(|e| Error::Input(format!("{}: {e}", final_dir.display())))?;
        if let Ok(d) = std::fs::File::open(output_dir) {
            let _ = d.sync_all();
        }
        Ok(())
    });
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        let previous = latest_checkpoint(output_dir)
            .map_or("no earlier checkpoint exists".to_string(), |p| format!("{} is intact", p.display()));
        return Err(Error::Input(format!("saving checkpoint-{step} failed ({e}); {previous}")));
    }
    Ok(final_dir)
}

fn write_into(dir: &Path, c: &CheckpointContents) -> Result<()> {
    save_folder(dir, c.model, c.config, c.tokenizer)?;
    if std::env::var("LAZYTRAIN_FAULT_INJECT").is_ok_and(|v| v == "abort-during-save") {
        // Fault injection for the crash-safety test: die like SIGKILL would,
        // halfway through a checkpoint.
        std::process::abort();
    }
    save_safetensors(&dir.join("optimizer.safetensors"), &c.optimizer.state_dict(), &[("format", "lazytrain")])?;
    json_file(&dir.join("scheduler.json"), c.scheduler)?;
    json_file(&dir.join("rng_state.json"), c.rng)?;
    json_file(&dir.join("training_args.json"), c.args)?;
    json_file(&dir.join("trainer_state.json"), c.state)
}

/// Delete the oldest checkpoints beyond `limit`, never the one just
/// `written` (which a resume continues from), the newest one, nor the best
/// one: with `limit = 1` and a best checkpoint older than the newest, both
/// stay (as in Hugging Face's Trainer). The best is matched by its folder's
/// name: the state may record it under another spelling of the output
/// folder (`out`, `./out`, an absolute path, a folder since moved).
pub fn rotate(output_dir: &Path, limit: usize, best: Option<&str>, written: &Path) -> Result<()> {
    let all = checkpoints(output_dir);
    let Some(newest) = all.last().cloned() else { return Ok(()) };
    let best_name = best.and_then(|b| Path::new(b).file_name().map(|n| n.to_os_string()));
    let written_name = written.file_name();
    let kept = |p: &Path| {
        p == newest || p.file_name() == written_name || (best_name.is_some() && p.file_name() == best_name.as_deref())
    };
    let mut excess = all.len().saturating_sub(limit.max(1));
    for path in all.iter().filter(|p| !kept(p)) {
        if excess == 0 {
            break;
        }
        let io = |e: std::io::Error| Error::Input(format!("{}: {e}", path.display()));
        // First make it incomplete (never a checkpoint again, whenever the
        // process dies), then remove the rest.
        std::fs::remove_file(path.join("trainer_state.json")).map_err(io)?;
        if std::env::var("LAZYTRAIN_FAULT_INJECT").is_ok_and(|v| v == "abort-during-rotation") {
            // Fault injection for the random-kill test: die mid-rotation.
            std::process::abort();
        }
        std::fs::remove_dir_all(path).map_err(io)?;
        excess -= 1;
    }
    Ok(())
}

/// Remove what a killed run can leave in `output_dir`: temporary
/// `.checkpoint-*.tmp-*` folders of a checkpoint being written, and
/// `checkpoint-*` folders without `trainer_state.json` (a rotation cut
/// short). Returns how many were removed.
pub fn remove_leftovers(output_dir: &Path) -> Result<usize> {
    let Ok(entries) = std::fs::read_dir(output_dir) else { return Ok(0) };
    let mut removed = 0;
    for path in entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_dir()) {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let temporary = name.starts_with(".checkpoint-") && name.contains(".tmp-") && !downloading_now(&name);
        let incomplete = step_of(&path).is_some() && !path.join("trainer_state.json").is_file();
        if temporary || incomplete {
            std::fs::remove_dir_all(&path).map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// What names a checkpoint download's folder: `.checkpoint-N` + this +
/// `PID-K` ([`super::push::fetch_resume_checkpoint`]).
pub(super) const DOWNLOAD_TAG: &str = ".tmp-download-";

/// Whether `name` is a checkpoint download's folder (`.checkpoint-N.tmp-download-PID-K`,
/// [`super::push::fetch_resume_checkpoint`]) whose process still runs: another
/// process of the same job on this machine, still downloading.
fn downloading_now(name: &str) -> bool {
    let Some((_, rest)) = name.split_once(DOWNLOAD_TAG) else { return false };
    let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
    pid.is_some_and(|pid| pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists())
}

/// Read a JSON file of a checkpoint.
pub fn read_json<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Result<T> {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::Input(format!("{}: cannot read ({e}); is this a complete checkpoint?", path.display())))?;
    serde_json::from_str(&text).map_err(|e| Error::Input(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder with complete `checkpoint-{step}` folders for `steps`.
    fn folder_with(name: &str, steps: &[u64]) -> lazytrain_core::ScratchDir {
        let dir = lazytrain_core::ScratchDir::new(&format!("rotate-{name}")).unwrap();
        for step in steps {
            let c = dir.join(format!("checkpoint-{step}"));
            std::fs::create_dir_all(&c).unwrap();
            std::fs::write(c.join("trainer_state.json"), "{}").unwrap();
        }
        dir
    }

    fn steps_in(dir: &Path) -> Vec<u64> {
        checkpoints(dir).iter().filter_map(|p| step_of(p)).collect()
    }

    #[test]
    fn rotation_keeps_the_newest_and_the_best_checkpoint() {
        let dir = folder_with("best-older", &[100, 200, 300]);
        let best = dir.join("checkpoint-100").display().to_string();
        rotate(&dir, 1, Some(&best), &dir.join("checkpoint-300")).unwrap();
        assert_eq!(steps_in(&dir), [100, 300], "limit 1 with an older best keeps best and newest");

        let dir = folder_with("best-newest", &[100, 200, 300]);
        let best = dir.join("checkpoint-300").display().to_string();
        rotate(&dir, 1, Some(&best), &dir.join("checkpoint-300")).unwrap();
        assert_eq!(steps_in(&dir), [300]);

        let dir = folder_with("no-best", &[100, 200, 300, 400]);
        rotate(&dir, 2, None, &dir.join("checkpoint-400")).unwrap();
        assert_eq!(steps_in(&dir), [300, 400]);

        let dir = folder_with("best-in-middle", &[100, 200, 300, 400]);
        let best = dir.join("checkpoint-200").display().to_string();
        rotate(&dir, 2, Some(&best), &dir.join("checkpoint-400")).unwrap();
        assert_eq!(steps_in(&dir), [200, 400]);
    }

    /// The best checkpoint recorded under another spelling of the folder
    /// (a run resumed with `./out` for `out`, or after the folder moved)
    /// is still kept; so is the checkpoint just written when the folder
    /// holds higher-numbered ones (a run resumed from an earlier checkpoint).
    #[test]
    fn rotation_keeps_the_best_by_name_and_the_one_just_written() {
        let dir = folder_with("best-elsewhere", &[100, 200, 300]);
        rotate(&dir, 1, Some("/somewhere/else/checkpoint-100"), &dir.join("checkpoint-300")).unwrap();
        assert_eq!(steps_in(&dir), [100, 300], "the best by its folder's name");

        let dir = folder_with("rolled-back", &[100, 200, 300, 400]);
        rotate(&dir, 1, None, &dir.join("checkpoint-200")).unwrap();
        assert_eq!(steps_in(&dir), [200, 400], "the checkpoint just written and the newest");
    }

    /// Leftovers go, but not a download another live process of the job is
    /// still making (pid 1 always runs); a dead process's download goes.
    #[test]
    fn leftovers_spare_a_live_processs_download() {
        let dir = folder_with("leftovers", &[100]);
        let mine = format!(".checkpoint-200.tmp-download-{}-0", std::process::id());
        let names =
            [".checkpoint-200.tmp-download-1-0", ".checkpoint-200.tmp-download-4294967290-3", ".checkpoint-300.tmp-7"];
        for name in names.iter().copied().chain([mine.as_str()]) {
            std::fs::create_dir_all(dir.join(name)).unwrap();
        }
        std::fs::create_dir_all(dir.join("checkpoint-400")).unwrap();
        assert_eq!(remove_leftovers(&dir).unwrap(), 4);
        let mut left: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, [".checkpoint-200.tmp-download-1-0", "checkpoint-100"]);
    }
}
