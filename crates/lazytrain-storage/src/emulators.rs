//! Local emulators speaking the real wire protocols, for tests: `moto` in
//! server mode (S3) and `gcp-storage-emulator` (GCS JSON/XML APIs). Each is
//! a child process on a free loopback port, stopped on drop. When the
//! program is not installed, [`Emulator::start`] returns `None` and says so
//! on stderr, so a test can skip with a printed reason (`.ci/run` installs
//! both).

use crate::stores::{no_retries, register_store};
use crate::url::Cloud;
use object_store::aws::AmazonS3Builder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::ClientOptions;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which emulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmulatorKind {
    /// `moto_server` (S3).
    Moto,
    /// `gcp-storage-emulator` (GCS).
    Gcs,
}

/// A running emulator (stopped on drop).
pub struct Emulator {
    kind: EmulatorKind,
    child: Child,
    port: u16,
}

impl Emulator {
    /// Start `kind` on a free port; `None` (with a printed reason) when the
    /// program is not installed or does not come up.
    pub fn start(kind: EmulatorKind) -> Option<Emulator> {
        let (program, hint) = match kind {
            EmulatorKind::Moto => ("moto_server", "pip install 'moto[server]'"),
            EmulatorKind::Gcs => ("gcp-storage-emulator", "pip install gcp-storage-emulator"),
        };
        let port = free_port();
        let mut command = match kind {
            EmulatorKind::Moto => {
                let mut command = Command::new(program);
                command.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
                command
            }
            EmulatorKind::Gcs => {
                // scripts/gcs_emulator.py completes the emulator's XML API; it
                // runs on the Python that has the emulator installed.
                let Some(bin) = find_in_path(program) else {
                    skip(&format!("`{program}` is not installed; {hint}"));
                    return None;
                };
                let python = bin.parent().map(|dir| dir.join("python3")).filter(|p| p.is_file());
                let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/gcs_emulator.py");
                let mut command = Command::new(python.unwrap_or_else(|| "python3".into()));
                command.args([
                    script,
                    "start",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    &port.to_string(),
                    "--in-memory",
                    "-q",
                ]);
                command
            }
        };
        let child = match command.stdout(Stdio::null()).stderr(Stdio::null()).spawn() {
            Ok(child) => child,
            Err(e) => {
                skip(&format!("`{program}` is not installed ({e}); {hint}"));
                return None;
            }
        };
        let emulator = Emulator { kind, child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                skip(&format!("`{program}` did not listen on port {port} within 30 s"));
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(emulator)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Create `bucket` (one raw request of the store's own API).
    pub fn create_bucket(&self, bucket: &str) {
        let request = match self.kind {
            EmulatorKind::Moto => {
                format!(
                    "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    self.port
                )
            }
            EmulatorKind::Gcs => {
                let body = format!("{{\"name\": \"{bucket}\"}}");
                format!(
                    "POST /storage/v1/b?project=test HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    self.port,
                    body.len()
                )
            }
        };
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("the emulator listens");
        stream.write_all(request.as_bytes()).expect("request sent");
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response);
        assert!(response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200"), "{response}");
    }

    /// Store `bytes` as `bucket/name` through the store's own upload API
    /// (S3 PUT, GCS JSON media upload) — for seeding data where the
    /// emulator's side of object_store's write path is incomplete (the GCS
    /// emulator's XML PUT answers without an ETag).
    pub fn seed(&self, bucket: &str, name: &str, bytes: &[u8]) {
        let head = match self.kind {
            EmulatorKind::Moto => format!("PUT /{bucket}/{name} HTTP/1.1\r\n"),
            EmulatorKind::Gcs => {
                format!(
                    "POST /upload/storage/v1/b/{bucket}/o?uploadType=media&name={} HTTP/1.1\r\n",
                    name.replace('/', "%2F")
                )
            }
        };
        let request = format!(
            "{head}Host: 127.0.0.1:{}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            bytes.len()
        );
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("the emulator listens");
        stream.write_all(request.as_bytes()).and_then(|()| stream.write_all(bytes)).expect("request sent");
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response);
        let response = String::from_utf8_lossy(&response);
        assert!(response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200"), "{response}");
    }

    /// Use this emulator for `bucket` in this process.
    pub fn register(&self, bucket: &str) {
        crate::stores::install_crypto_provider();
        let options = ClientOptions::new().with_allow_http(true);
        match self.kind {
            EmulatorKind::Moto => {
                let store = AmazonS3Builder::new()
                    .with_bucket_name(bucket)
                    .with_endpoint(self.endpoint())
                    .with_region("us-east-1")
                    .with_access_key_id("test")
                    .with_secret_access_key("test")
                    .with_client_options(options)
                    .with_retry(no_retries())
                    .build()
                    .expect("an S3 client for the emulator");
                register_store(Cloud::S3, bucket, Arc::new(store));
            }
            EmulatorKind::Gcs => {
                let store = GoogleCloudStorageBuilder::new()
                    .with_bucket_name(bucket)
                    .with_base_url(&self.endpoint())
                    .with_credentials(crate::stores::emulator_credentials())
                    .with_client_options(options)
                    .with_retry(no_retries())
                    .build()
                    .expect("a GCS client for the emulator");
                register_store(Cloud::Gcs, bucket, Arc::new(store));
            }
        }
    }

    /// The environment a child process needs to reach this emulator.
    pub fn env(&self) -> Vec<(String, String)> {
        let pairs: Vec<(&str, String)> = match self.kind {
            EmulatorKind::Moto => vec![
                ("AWS_ENDPOINT_URL", self.endpoint()),
                ("AWS_ALLOW_HTTP", "true".into()),
                ("AWS_ACCESS_KEY_ID", "test".into()),
                ("AWS_SECRET_ACCESS_KEY", "test".into()),
                ("AWS_REGION", "us-east-1".into()),
            ],
            EmulatorKind::Gcs => vec![("STORAGE_EMULATOR_HOST", format!("127.0.0.1:{}", self.port))],
        };
        pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// Stop the emulator (as if the service went away).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Say why a test is skipped, on the real stderr: the test harness captures
/// `eprintln!` of passing tests, and a skip must not pass silently.
fn skip(reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped: {reason}");
}

fn find_in_path(program: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(program)).find(|p| p.is_file())
}

fn free_port() -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("a loopback port");
    listener.local_addr().expect("bound").port()
}
