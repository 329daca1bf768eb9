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
use std::sync::{Arc, Mutex};
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
    /// program is not installed. One that is installed but does not come
    /// up after three tries (on three ports) panics: that is a broken
    /// environment, not a reason to skip.
    pub fn start(kind: EmulatorKind) -> Option<Emulator> {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Emulator::start_on(kind, free_port()) {
                Ok(emulator) => return Some(emulator),
                Err(None) => return None,
                Err(Some(failure)) => failures.push(failure),
            }
        }
        panic!("the {kind:?} emulator did not start: {}", failures.join("; "));
    }

    /// `Err(None)`: not installed (skip); `Err(Some(why))`: did not come up.
    fn start_on(kind: EmulatorKind, port: u16) -> Result<Emulator, Option<String>> {
        let (program, hint) = match kind {
            EmulatorKind::Moto => ("moto_server", "pip install 'moto[server]'"),
            EmulatorKind::Gcs => ("gcp-storage-emulator", "pip install gcp-storage-emulator"),
        };
        let Some(bin) = find_in_path(program) else {
            skip(&format!("`{program}` is not installed; {hint}"));
            return Err(None);
        };
        let mut command = match kind {
            EmulatorKind::Moto => {
                let mut command = Command::new(&bin);
                command.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
                command
            }
            EmulatorKind::Gcs => {
                // scripts/gcs_emulator.py completes the emulator's XML API; it
                // runs on the Python that has the emulator installed.
                let python = bin.parent().map(|dir| dir.join("python3")).filter(|p| p.is_file());
                let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/gcs_emulator.py");
                let mut command = Command::new(python.unwrap_or_else(|| "python3".into()));
                let port = port.to_string();
                command.args([script, "start", "--host", "127.0.0.1", "--port", &port, "--in-memory", "-q"]);
                command
            }
        };
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Some(format!("`{program}` could not be run: {e}")))?;
        let mut emulator = Emulator { kind, child, port };
        // Ready when this process (not another on the port) answers HTTP.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = emulator.child.try_wait() {
                return Err(Some(format!("`{program}` exited ({status}) on port {port}")));
            }
            if emulator.request("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", &[]).is_some() {
                return Ok(emulator);
            }
            if Instant::now() > deadline {
                return Err(Some(format!("`{program}` did not answer on port {port} within 30 s")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Send one raw request; the response when one came (`HTTP/1.x ...`).
    fn request(&self, head: &str, body: &[u8]) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body)).ok()?;
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response);
        let response = String::from_utf8_lossy(&response).into_owned();
        response.starts_with("HTTP/1.").then_some(response)
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
        self.expect_ok(&request, &[]);
    }

    /// Send a request (retried a few times: a server just up may drop the
    /// first connections) and require a 200.
    fn expect_ok(&self, head: &str, body: &[u8]) {
        let mut response = None;
        for _ in 0..5 {
            response = self.request(head, body);
            if response.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let response =
            response.unwrap_or_else(|| panic!("the {:?} emulator on port {} did not answer", self.kind, self.port));
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
        self.expect_ok(&request, bytes);
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

/// A loopback port no other emulator of this process was given (tests
/// start emulators in parallel, and the OS may hand a just-released port
/// out again).
fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("a loopback port");
        let port = listener.local_addr().expect("bound").port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}
