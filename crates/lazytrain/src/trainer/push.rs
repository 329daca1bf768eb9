//! Checkpoint sync: `push_to` + `hub_strategy` (the PushToHub role).
//!
//! Each saved checkpoint is hard-linked into a staging folder (so local
//! rotation cannot pull files from under the upload) and queued on a
//! bounded background [`Uploader`]: training goes on while it uploads, and
//! waits only when the store falls two checkpoints behind. A remote
//! checkpoint is complete when its `trainer_state.json` is there, and that
//! file goes last; rotation deletes it first. When training ends the final
//! model is pushed and every upload waited for; any that failed make the
//! run end with an error naming them (the local output is complete).

use super::args::{HubStrategy, TrainingArguments};
use super::checkpoint::{checkpoints, step_of, DOWNLOAD_TAG};
use crate::{Error, Result};
use lazytrain_storage::{list, StorageError, StorageUrl, UploadJob, UploadReport, Uploader};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The file that makes a checkpoint folder complete.
const MARKER: &str = "trainer_state.json";
/// Checkpoint uploads queued beyond the one running.
const QUEUE: usize = 2;

/// Uploads checkpoints and the final model (master replica only).
pub struct CheckpointSync {
    target: StorageUrl,
    strategy: HubStrategy,
    save_total_limit: Option<usize>,
    uploader: Uploader,
    /// Steps of the checkpoint folders uploaded (or queued) under `target`.
    remote_steps: BTreeSet<u64>,
    failures: Vec<String>,
}

impl CheckpointSync {
    /// Sync for `args`, when `push_to` is set.
    pub fn for_args(args: &TrainingArguments) -> Result<Option<CheckpointSync>> {
        let Some(url) = &args.push_to else { return Ok(None) };
        let target = StorageUrl::parse(url)?;
        let remote_steps = remote_checkpoints(&target)?.into_iter().map(|(step, _)| step).collect();
        // Staged copies a killed run left behind.
        let _ = std::fs::remove_dir_all(Path::new(&args.output_dir).join(".push-staging"));
        Ok(Some(CheckpointSync {
            target,
            strategy: args.hub_strategy,
            save_total_limit: args.save_total_limit,
            uploader: Uploader::new(QUEUE),
            remote_steps,
            failures: Vec::new(),
        }))
    }

    /// Queue the checkpoint just saved at `checkpoint` (after local rotation
    /// of `output_dir`, whose surviving checkpoints the remote one mirrors).
    pub fn checkpoint_saved(&mut self, checkpoint: &Path, output_dir: &Path) -> Result<()> {
        self.collect_reports();
        let name = checkpoint.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let step = step_of(checkpoint).unwrap_or(0);
        let (folder, model_too, remove) = match self.strategy {
            HubStrategy::End => return Ok(()),
            HubStrategy::EverySave => (name.clone(), false, self.rotated(step, output_dir)),
            HubStrategy::Checkpoint => ("last-checkpoint".to_string(), true, vec![self.target.join("last-checkpoint")]),
            HubStrategy::AllCheckpoints => (name.clone(), true, Vec::new()),
        };
        let staging = stage(checkpoint, output_dir)?;
        let mut files = files_of(&staging, &self.target.join(&folder));
        if model_too {
            // The model at the top of `push_to`, as a Hub repository holds it.
            files.extend(model_files(&staging).map(|(local, file)| (local, self.target.join(&file))));
        }
        let commit = Some((staging.join(MARKER), self.target.join(&folder).join(MARKER)));
        // `last-checkpoint` is replaced: its marker goes (in the background,
        // like everything here) before the new files.
        let (before, after) = match self.strategy {
            HubStrategy::Checkpoint => (remove.iter().map(|folder| folder.join(MARKER)).collect(), Vec::new()),
            HubStrategy::End | HubStrategy::EverySave | HubStrategy::AllCheckpoints => (Vec::new(), remove),
        };
        if folder != "last-checkpoint" {
            self.remote_steps.insert(step);
        }
        self.uploader.submit(UploadJob {
            label: format!("{name} -> {}", self.target.join(&folder)),
            delete_first: before,
            files,
            commit,
            remove: after,
            marker: MARKER.to_string(),
            cleanup: Some(staging),
        });
        Ok(())
    }

    /// The remote checkpoint folders to delete after uploading `step`: those
    /// no longer kept locally, when `save_total_limit` is set.
    fn rotated(&mut self, step: u64, output_dir: &Path) -> Vec<StorageUrl> {
        if self.save_total_limit.is_none() {
            return Vec::new();
        }
        let kept: BTreeSet<u64> = checkpoints(output_dir).iter().filter_map(|p| step_of(p)).collect();
        let gone: Vec<u64> = self.remote_steps.iter().copied().filter(|s| *s != step && !kept.contains(s)).collect();
        for s in &gone {
            self.remote_steps.remove(s);
        }
        gone.into_iter().map(|s| self.target.join(&format!("checkpoint-{s}"))).collect()
    }

    /// Push the final model folder in `output_dir` (every strategy) when
    /// `push_final`, wait for every upload, and fail naming those that did
    /// not complete.
    pub fn finish(mut self, output_dir: &Path, push_final: bool) -> Result<()> {
        if push_final {
            self.push_final(output_dir)?;
        }
        if std::env::var("LAZYTRAIN_FAULT_INJECT").is_ok_and(|v| v == "slow-final-push") {
            // Tests: uploads that outlast the collective timeout.
            std::thread::sleep(std::time::Duration::from_secs(4));
        }
        let reports = self.uploader.finish();
        self.record(reports);
        match self.failures.is_empty() {
            true => Ok(()),
            false => Err(Error::Input(format!(
                "training finished and everything is saved in {}, but pushing to {} failed: {}; run again with \
                 --resume-from-checkpoint true to push from the newest checkpoint",
                output_dir.display(),
                self.target,
                self.failures.join("; ")
            ))),
        }
    }

    fn push_final(&mut self, output_dir: &Path) -> Result<()> {
        let staging = stage(output_dir, output_dir)?;
        let files: Vec<(PathBuf, StorageUrl)> =
            model_files(&staging).map(|(local, file)| (local, self.target.join(&file))).collect();
        self.uploader.submit(UploadJob {
            label: format!("the final model -> {}", self.target),
            delete_first: Vec::new(),
            files,
            commit: Some((staging.join(MARKER), self.target.join(MARKER))).filter(|(local, _)| local.is_file()),
            remove: Vec::new(),
            marker: MARKER.to_string(),
            cleanup: Some(staging),
        });
        Ok(())
    }

    fn collect_reports(&mut self) {
        let reports = self.uploader.take_reports();
        self.record(reports);
    }

    fn record(&mut self, reports: Vec<UploadReport>) {
        for report in reports {
            if let Err(e) = report.result {
                eprintln!("warning: uploading {} failed: {e}; it is not marked complete there", report.label);
                self.failures.push(format!("{} ({e})", report.label));
            }
        }
    }
}

/// Hard links (copies where links fail) of the files directly in `dir`,
/// in `output_dir/.push-staging/…`.
fn stage(dir: &Path, output_dir: &Path) -> Result<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let io = |p: &Path, e: std::io::Error| Error::Input(format!("{}: {e}", p.display()));
    let staging = output_dir.join(".push-staging").join(format!(
        "{}-{}",
        std::process::id(),
        COUNT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&staging).map_err(|e| io(&staging, e))?;
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let path = entry.map_err(|e| io(dir, e))?.path();
        if path.is_file() {
            let to = staging.join(path.file_name().expect("a file has a name"));
            if std::fs::hard_link(&path, &to).is_err() {
                std::fs::copy(&path, &to).map_err(|e| io(&to, e))?;
            }
        }
    }
    Ok(staging)
}

/// Every staged file but the marker, to go under `to`.
fn files_of(staging: &Path, to: &StorageUrl) -> Vec<(PathBuf, StorageUrl)> {
    let mut names: Vec<String> = std::fs::read_dir(staging)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().and_then(|e| e.file_name().into_string().ok()))
        .filter(|name| name != MARKER)
        .collect();
    names.sort();
    names.into_iter().map(|name| (staging.join(&name), to.join(&name))).collect()
}

/// The model folder's files among the staged ones (what `from_pretrained` reads).
fn model_files(staging: &Path) -> impl Iterator<Item = (PathBuf, String)> + '_ {
    let training_state = ["optimizer.safetensors", "scheduler.json", "rng_state.json", "training_args.json", MARKER];
    files_of(staging, &StorageUrl::Local(PathBuf::new())).into_iter().filter_map(move |(local, _)| {
        let name = local.file_name()?.to_string_lossy().into_owned();
        (!training_state.contains(&name.as_str())).then_some((local, name))
    })
}

/// Complete checkpoints under `target` (`checkpoint-N/` with a marker),
/// oldest first, as `(step, folder)`.
pub fn remote_checkpoints(target: &StorageUrl) -> Result<Vec<(u64, StorageUrl)>> {
    let objects = match list(target) {
        Ok(objects) => objects,
        Err(StorageError::NotFound { .. }) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let prefix = target.to_string();
    let mut found: Vec<(u64, StorageUrl)> = objects
        .iter()
        .filter_map(|o| {
            let relative = o.url.to_string().strip_prefix(&prefix)?.trim_start_matches('/').to_string();
            let folder = relative.strip_suffix(&format!("/{MARKER}"))?;
            let step = folder.strip_prefix("checkpoint-")?.parse().ok()?;
            Some((step, target.join(folder)))
        })
        .collect();
    found.sort_by_key(|(step, _)| *step);
    Ok(found)
}

/// The complete checkpoints under `target` (`checkpoint-N/`, then
/// `last-checkpoint/`): an earlier run's, when a fresh run pushes there.
pub fn earlier_remote_checkpoints(target: &StorageUrl) -> Result<Vec<StorageUrl>> {
    let mut found: Vec<StorageUrl> = remote_checkpoints(target)?.into_iter().map(|(_, folder)| folder).collect();
    let last = target.join("last-checkpoint");
    if remote_step(&last)?.is_some() {
        found.push(last);
    }
    Ok(found)
}

/// Delete the remote checkpoint `folders`, each's marker first, so that a
/// folder half deleted (the run killed meanwhile) is never taken as complete.
pub fn remove_remote_checkpoints(folders: &[StorageUrl]) -> Result<()> {
    for folder in folders {
        lazytrain_storage::remove_folder(folder, MARKER)?;
    }
    Ok(())
}

/// Bring the checkpoint to resume from to `output_dir`: for `true` with no
/// complete local checkpoint, the newest complete one under `push_to`
/// (the preempted-VM case); for a checkpoint URL, that one. Returns the
/// `resume_from_checkpoint` value to train with (a local path, or the
/// value unchanged).
pub fn fetch_resume_checkpoint(args: &TrainingArguments) -> Result<Option<String>> {
    let output_dir = Path::new(&args.output_dir);
    let remote = match args.resume_from_checkpoint.as_deref() {
        Some("true") if checkpoints(output_dir).is_empty() => {
            let Some(url) = &args.push_to else { return Ok(args.resume_from_checkpoint.clone()) };
            match newest_remote_checkpoint(&StorageUrl::parse(url)?)? {
                Some(folder) => folder,
                None => return Ok(args.resume_from_checkpoint.clone()),
            }
        }
        Some(value) => match StorageUrl::parse(value)? {
            url @ StorageUrl::Remote { .. } => url,
            StorageUrl::Local(_) => return Ok(args.resume_from_checkpoint.clone()),
        },
        None => return Ok(None),
    };
    let step = remote_step(&remote)?
        .ok_or_else(|| Error::Input(format!("{remote} is not a complete checkpoint (no {MARKER})")))?;
    // Named by its step locally (`last-checkpoint` too), where checkpoints live.
    let name = format!("checkpoint-{step}");
    let local = output_dir.join(&name);
    if !local.join(MARKER).is_file() {
        // Named like a checkpoint being written, so a killed download is
        // cleared as a leftover on the next start; unique to this call, as
        // every process of a job on this machine may download at once.
        static DOWNLOADS: AtomicU64 = AtomicU64::new(0);
        let call = DOWNLOADS.fetch_add(1, Ordering::Relaxed);
        let staging = output_dir.join(format!(".{name}{DOWNLOAD_TAG}{}-{call}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        for object in list(&remote)? {
            let relative = object.url.to_string()[remote.to_string().len()..].trim_start_matches('/').to_string();
            lazytrain_storage::download_file(&object.url, &staging.join(relative))?;
        }
        // An incomplete folder of that name is replaced; a complete one,
        // another process's download finished first, is kept (and this
        // one's dropped): it may already be reading it.
        if local.exists() && !local.join(MARKER).is_file() {
            let _ = std::fs::remove_dir_all(&local);
        }
        match std::fs::rename(&staging, &local) {
            Ok(()) => eprintln!("resuming from {remote} (downloaded to {})", local.display()),
            Err(_) if local.join(MARKER).is_file() => {
                let _ = std::fs::remove_dir_all(&staging);
                eprintln!("resuming from {remote} (downloaded to {} by another process)", local.display());
            }
            Err(e) => return Err(Error::Input(format!("{}: {e}", local.display()))),
        }
    }
    Ok(Some(local.display().to_string()))
}

/// The global step in a remote checkpoint's marker (`None` without one).
fn remote_step(folder: &StorageUrl) -> Result<Option<u64>> {
    let bytes = match lazytrain_storage::read(&folder.join(MARKER)) {
        Ok(bytes) => bytes,
        Err(StorageError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let state: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| Error::Input(format!("{}: {e}", folder.join(MARKER))))?;
    Ok(state["global_step"].as_u64())
}

/// The newest complete checkpoint under `target`: its `checkpoint-N/`
/// folders and `last-checkpoint/` (hub_strategy `checkpoint`) compared by step.
fn newest_remote_checkpoint(target: &StorageUrl) -> Result<Option<StorageUrl>> {
    let numbered = remote_checkpoints(target)?.pop();
    let last = target.join("last-checkpoint");
    let last = remote_step(&last)?.map(|step| (step, last));
    Ok(match (numbered, last) {
        (Some(a), Some(b)) => Some(if b.0 > a.0 { b.1 } else { a.1 }),
        (a, b) => a.or(b).map(|(_, folder)| folder),
    })
}
