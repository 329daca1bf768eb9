//! `Uploader`: a background thread that uploads folders (checkpoints) in
//! order through a bounded queue, so training never waits on the network
//! unless the store falls behind by more than the queue holds.

use crate::ops::{delete, list, upload_file};
use crate::url::StorageUrl;
use crate::{metrics, Result, StorageError};
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// One folder to upload, and what to delete once it is there.
pub struct UploadJob {
    /// A name for reports (`checkpoint-40`).
    pub label: String,
    /// Objects deleted before anything is uploaded (the marker of a folder
    /// about to be overwritten, so it is never complete half-way).
    pub delete_first: Vec<StorageUrl>,
    /// Files to upload, in this order: `(local file, destination)`.
    pub files: Vec<(PathBuf, StorageUrl)>,
    /// Uploaded after every file of `files` succeeded: the marker that makes
    /// the folder complete (`trainer_state.json`).
    pub commit: Option<(PathBuf, StorageUrl)>,
    /// Remote folders to remove after the upload (rotation): each loses its
    /// `marker` first, so a half-deleted folder is never taken as complete.
    pub remove: Vec<StorageUrl>,
    /// The marker's file name inside each folder of `remove`.
    pub marker: String,
    /// A local folder to delete when the job is done (a staging copy).
    pub cleanup: Option<PathBuf>,
}

/// How one job ended.
#[derive(Debug)]
pub struct UploadReport {
    /// The job's label.
    pub label: String,
    /// `Ok` or the error that stopped it.
    pub result: Result<()>,
}

/// The background uploader (see the module docs).
pub struct Uploader {
    queue: Option<SyncSender<UploadJob>>,
    worker: Option<JoinHandle<()>>,
    reports: Arc<Mutex<Vec<UploadReport>>>,
}

impl Uploader {
    /// An uploader whose queue holds `capacity` jobs beyond the one running.
    pub fn new(capacity: usize) -> Uploader {
        let (queue, jobs) = sync_channel::<UploadJob>(capacity);
        let reports = Arc::new(Mutex::new(Vec::new()));
        let done = reports.clone();
        let worker = std::thread::Builder::new()
            .name("lazytrain-upload".into())
            .spawn(move || {
                for job in jobs {
                    let label = job.label.clone();
                    let cleanup = job.cleanup.clone();
                    let result = run(job);
                    if result.is_err() {
                        metrics::count_failed_upload();
                    }
                    if let Some(dir) = cleanup {
                        let _ = std::fs::remove_dir_all(dir);
                    }
                    done.lock().unwrap_or_else(|p| p.into_inner()).push(UploadReport { label, result });
                }
            })
            .expect("a thread can be spawned");
        Uploader { queue: Some(queue), worker: Some(worker), reports }
    }

    /// Queue `job`; blocks while the queue is full (back-pressure).
    pub fn submit(&self, job: UploadJob) {
        if let Some(queue) = &self.queue {
            // The worker only stops when the queue closes, so this cannot fail.
            let _ = queue.send(job);
        }
    }

    /// Reports of the jobs finished since the last call.
    pub fn take_reports(&self) -> Vec<UploadReport> {
        std::mem::take(&mut *self.reports.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Wait for every queued job (no more can be submitted); returns the
    /// reports not taken yet.
    pub fn finish(&mut self) -> Vec<UploadReport> {
        self.close();
        self.take_reports()
    }

    fn close(&mut self) {
        self.queue.take();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

impl Drop for Uploader {
    fn drop(&mut self) {
        self.close();
    }
}

fn run(job: UploadJob) -> Result<()> {
    for object in &job.delete_first {
        delete(object)?;
    }
    for (from, to) in job.files.iter().chain(&job.commit) {
        upload_file(from, to)?;
    }
    for folder in &job.remove {
        remove_folder(folder, &job.marker)?;
    }
    Ok(())
}

/// Delete every object under `folder`, `marker` first, so that a folder
/// half deleted is never taken as complete.
pub fn remove_folder(folder: &StorageUrl, marker: &str) -> Result<()> {
    delete(&folder.join(marker))?;
    match list(folder) {
        Ok(objects) => objects.iter().try_for_each(|object| delete(&object.url)),
        Err(StorageError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}
