//! Third-party parsers that panic on malformed files (the `tokenizers` and
//! `parquet` crates do, on some): their panics become errors, and their
//! messages do not reach stderr.

/// Run `f`, turning a panic into its message without printing it (the
/// panic hook is set aside meanwhile; one caller at a time).
pub(crate) fn quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    static HOOK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = HOOK.lock().unwrap_or_else(|p| p.into_inner());
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    outcome.map_err(|panic| lazytrain_core::panic_message(&*panic))
}
