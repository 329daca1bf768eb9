//! Host-side element storage and device buffers.

use crate::dtype::DType;
use half::{bf16, f16};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// A flat, typed vector of elements on the host.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// `f32` elements.
    F32(Vec<f32>),
    /// `f64` elements.
    F64(Vec<f64>),
    /// `bf16` elements.
    BF16(Vec<bf16>),
    /// `f16` elements.
    F16(Vec<f16>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `u8` elements.
    U8(Vec<u8>),
    /// `bool` elements.
    Bool(Vec<bool>),
}

/// Apply one expression to whichever typed vector a [`HostData`] holds.
macro_rules! with_host_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::storage::HostData::F32($v) => $body,
            $crate::storage::HostData::F64($v) => $body,
            $crate::storage::HostData::BF16($v) => $body,
            $crate::storage::HostData::F16($v) => $body,
            $crate::storage::HostData::I64($v) => $body,
            $crate::storage::HostData::I32($v) => $body,
            $crate::storage::HostData::U8($v) => $body,
            $crate::storage::HostData::Bool($v) => $body,
        }
    };
}

impl HostData {
    /// `len` zero elements of `dtype`, written into memory of their own.
    ///
    /// `vec![0.0; len]` would not write them: a large zeroed allocation is
    /// fresh pages that all map the kernel's shared zero page, and the first
    /// write to each (an optimizer state updated in place by the first
    /// step) then copies it and flushes its old mapping from every core
    /// running one of the process's threads, an interrupt per page per
    /// core. On a 2-core virtual machine those flushes took a quarter of
    /// BERT-base's first four steps (`perf`: `do_wp_page` under the fused
    /// update kernels' stores); with the zeros written up front (one
    /// ordinary fault per page) its first step took 4.6-6.8 s instead of
    /// 7.1-9.6, and the run's system time fell from 8-11 s to 3-4.
    pub fn zeros(dtype: DType, len: usize) -> HostData {
        let mut data = HostData::with_capacity(dtype, len);
        with_host_data!(&mut data, v => write_zeros(v, len));
        data
    }

    /// An empty buffer of `dtype` with room for `capacity` elements, so it
    /// can be resized up to that without reallocating.
    pub fn with_capacity(dtype: DType, capacity: usize) -> HostData {
        match dtype {
            DType::F32 => HostData::F32(allocation(capacity)),
            DType::F64 => HostData::F64(allocation(capacity)),
            DType::BF16 => HostData::BF16(allocation(capacity)),
            DType::F16 => HostData::F16(allocation(capacity)),
            DType::I64 => HostData::I64(allocation(capacity)),
            DType::I32 => HostData::I32(allocation(capacity)),
            DType::U8 => HostData::U8(allocation(capacity)),
            DType::Bool => HostData::Bool(allocation(capacity)),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
            HostData::BF16(_) => DType::BF16,
            HostData::F16(_) => DType::F16,
            HostData::I64(_) => DType::I64,
            HostData::I32(_) => DType::I32,
            HostData::U8(_) => DType::U8,
            HostData::Bool(_) => DType::Bool,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        with_host_data!(self, v => v.len())
    }

    /// The number of elements the allocation holds without growing.
    pub fn capacity(&self) -> usize {
        with_host_data!(self, v => v.capacity())
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes.
    pub fn size_in_bytes(&self) -> usize {
        self.len() * self.dtype().size_in_bytes()
    }

    /// Element `i` widened to `f64` (for printing and tests).
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            HostData::F32(v) => v[i] as f64,
            HostData::F64(v) => v[i],
            HostData::BF16(v) => v[i].to_f64(),
            HostData::F16(v) => v[i].to_f64(),
            HostData::I64(v) => v[i] as f64,
            HostData::I32(v) => v[i] as f64,
            HostData::U8(v) => v[i] as f64,
            HostData::Bool(v) => v[i] as u8 as f64,
        }
    }

    /// All elements widened to `f64`.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self.get_f64(i)).collect()
    }

    /// Resize to `len` elements of `dtype`, keeping the allocation when the
    /// dtype already matches (contents are unspecified afterwards).
    pub fn reset(&mut self, dtype: DType, len: usize) {
        if self.dtype() != dtype {
            *self = HostData::zeros(dtype, len);
            return;
        }
        match self {
            HostData::F32(v) => v.resize(len, 0.0),
            HostData::F64(v) => v.resize(len, 0.0),
            HostData::BF16(v) => v.resize(len, bf16::ZERO),
            HostData::F16(v) => v.resize(len, f16::ZERO),
            HostData::I64(v) => v.resize(len, 0),
            HostData::I32(v) => v.resize(len, 0),
            HostData::U8(v) => v.resize(len, 0),
            HostData::Bool(v) => v.resize(len, false),
        }
    }
}

/// Fill empty `values` (with room for them) with `len` elements of
/// `T::default()` (zero for every element type here), stored one by one:
/// the allocation escapes before the stores, so they
/// cannot be folded into a zeroed allocation that leaves the pages unmapped
/// (see [`HostData::zeros`]).
fn write_zeros<T: Copy + Default>(values: &mut Vec<T>, len: usize) {
    std::hint::black_box(values.as_mut_ptr());
    values.resize(len, T::default());
}

/// The smallest allocation (in bytes) backed by huge pages where the
/// system allows it: a step's activations and gradients (megabytes each)
/// are read and written in strides across many pages, and 2 MiB pages keep
/// their addresses in the TLB (Linux's transparent huge pages, in the
/// usual `madvise` mode only for memory that asks).
const HUGE_PAGES_FROM: usize = 4 << 20;

/// An empty vector with room for `capacity` values, its pages not yet
/// touched; a large one asks the kernel for huge pages (a hint: without
/// them nothing changes).
fn allocation<T>(capacity: usize) -> Vec<T> {
    let values: Vec<T> = Vec::with_capacity(capacity);
    let bytes = capacity * std::mem::size_of::<T>();
    #[cfg(target_os = "linux")]
    if bytes >= HUGE_PAGES_FROM {
        // The pages the allocation touches, whole: an allocation mapped on
        // its own then stays one mapping. One that the C allocator serves
        // from its heap (after freeing large blocks it maps fewer) marks at
        // most the edge pages it shares with its neighbours, whose values
        // the advice leaves alone.
        const PAGE: usize = 4096;
        let start = values.as_ptr() as usize / PAGE * PAGE;
        let end = (values.as_ptr() as usize + bytes).next_multiple_of(PAGE);
        // SAFETY: the range covers the vector's allocation and at most the
        // rest of its first and last pages; MADV_HUGEPAGE only changes how
        // pages are backed, never their contents. A refusal (a system
        // without transparent huge pages) leaves the memory as it was.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
    values
}

/// Host element types that [`HostData`] can hold, for typed `from_vec`/`to_vec`.
pub trait Element: Copy + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
    /// Wrap a vector.
    fn into_host(v: Vec<Self>) -> HostData;
    /// Unwrap a vector of this type, if that is what `data` holds.
    fn from_host(data: &HostData) -> Option<&[Self]>;
}

macro_rules! impl_element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn into_host(v: Vec<Self>) -> HostData {
                HostData::$variant(v)
            }
            fn from_host(data: &HostData) -> Option<&[Self]> {
                match data {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
impl_element!(f32, F32);
impl_element!(f64, F64);
impl_element!(bf16, BF16);
impl_element!(f16, F16);
impl_element!(i64, I64);
impl_element!(i32, I32);
impl_element!(u8, U8);
impl_element!(bool, Bool);

static LIVE_BUFFER_BYTES: AtomicI64 = AtomicI64::new(0);
static PEAK_BUFFER_BYTES: AtomicI64 = AtomicI64::new(0);

/// Bytes held by device buffers alive right now, across all devices.
pub fn live_buffer_bytes() -> u64 {
    LIVE_BUFFER_BYTES.load(Ordering::Relaxed).max(0) as u64
}

/// The most bytes device buffers have held at once since the process started.
pub fn peak_buffer_bytes() -> u64 {
    PEAK_BUFFER_BYTES.load(Ordering::Relaxed).max(0) as u64
}

/// Memory a backend keeps where the host cannot read it directly (an
/// accelerator's). The backend that made it reads and writes it; the host
/// sees its contents through that backend's `copy_out`.
pub trait BackendMemory: std::any::Any + Send + Sync + std::fmt::Debug {
    /// The element type.
    fn dtype(&self) -> DType;
    /// The number of elements.
    fn len(&self) -> usize;
    /// True when there are no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// A copy in new memory of the same backend (a device-to-device copy).
    fn duplicate(&self) -> std::result::Result<Box<dyn BackendMemory>, String>;
}

/// The memory behind a [`Buffer`]: host memory (where the CPU and reference
/// backends compute) or a backend's own.
#[derive(Debug)]
pub enum DeviceMemory {
    /// Elements in host memory.
    Host(HostData),
    /// Memory only its backend can read (see [`BackendMemory`]).
    Backend(Box<dyn BackendMemory>),
}

impl DeviceMemory {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            DeviceMemory::Host(data) => data.dtype(),
            DeviceMemory::Backend(memory) => memory.dtype(),
        }
    }

    /// Size in bytes.
    pub fn size_in_bytes(&self) -> usize {
        match self {
            DeviceMemory::Host(data) => data.size_in_bytes(),
            DeviceMemory::Backend(memory) => memory.len() * memory.dtype().size_in_bytes(),
        }
    }

    /// A copy in new memory of the same kind.
    pub fn duplicate(&self) -> std::result::Result<DeviceMemory, Arc<str>> {
        match self {
            DeviceMemory::Host(data) => Ok(DeviceMemory::Host(data.clone())),
            DeviceMemory::Backend(memory) => memory.duplicate().map(DeviceMemory::Backend).map_err(Arc::from),
        }
    }

    /// The host data, when the memory is on the host.
    pub fn host(&self) -> Option<&HostData> {
        match self {
            DeviceMemory::Host(data) => Some(data),
            DeviceMemory::Backend(_) => None,
        }
    }

    /// The host data, writable, when the memory is on the host.
    pub fn host_mut(&mut self) -> Option<&mut HostData> {
        match self {
            DeviceMemory::Host(data) => Some(data),
            DeviceMemory::Backend(_) => None,
        }
    }
}

/// What a host-memory backend says about memory it cannot read.
fn not_on_the_host(memory: &dyn BackendMemory) -> Arc<str> {
    format!(
        "the buffer ({} {} elements) is in a backend's device memory, not on the host; read it through that backend's copy_out",
        memory.len(),
        memory.dtype()
    )
    .into()
}

/// Memory owned by a device: host memory for the CPU and reference
/// backends, or a backend's own ([`DeviceMemory`]).
///
/// A buffer may be *in flight*: created when its step was enqueued on an
/// asynchronous device and filled when the step finishes. Reading it waits.
#[derive(Debug)]
pub struct Buffer {
    dtype: DType,
    value: OnceLock<std::result::Result<DeviceMemory, Arc<str>>>,
    filled: (Mutex<bool>, Condvar),
    bytes: AtomicI64,
}

impl Buffer {
    /// Take ownership of host data as a device buffer.
    pub fn new(data: HostData) -> Buffer {
        Buffer::from_memory(DeviceMemory::Host(data))
    }

    /// Take ownership of a backend's memory as a device buffer.
    pub fn from_memory(memory: DeviceMemory) -> Buffer {
        let buffer = Buffer::in_flight(memory.dtype());
        buffer.fulfil(Ok(memory));
        buffer
    }

    /// A buffer whose value a running step will provide ([`Buffer::fulfil`]).
    pub(crate) fn in_flight(dtype: DType) -> Buffer {
        Buffer { dtype, value: OnceLock::new(), filled: (Mutex::new(false), Condvar::new()), bytes: AtomicI64::new(0) }
    }

    /// Provide the value (or the failure) of an in-flight buffer and wake
    /// its readers. A second call is ignored.
    pub(crate) fn fulfil(&self, value: std::result::Result<DeviceMemory, Arc<str>>) {
        let bytes = value.as_ref().map_or(0, |d| d.size_in_bytes() as i64);
        if self.value.set(value).is_ok() {
            self.bytes.store(bytes, Ordering::Relaxed);
            let live = LIVE_BUFFER_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes;
            PEAK_BUFFER_BYTES.fetch_max(live, Ordering::Relaxed);
        }
        let mut done = self.filled.0.lock().unwrap_or_else(|p| p.into_inner());
        *done = true;
        self.filled.1.notify_all();
    }

    /// Bytes this buffer holds now, without waiting (0 while in flight).
    pub fn resident_bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed).max(0) as u64
    }

    /// True once the value (or its failure) is known.
    pub fn is_ready(&self) -> bool {
        self.value.get().is_some()
    }

    /// The memory; waits while the buffer is in flight. The error is the
    /// failure of the step that should have computed it.
    pub fn wait_memory(&self) -> std::result::Result<&DeviceMemory, Arc<str>> {
        if self.value.get().is_none() {
            let mut done = self.filled.0.lock().unwrap_or_else(|p| p.into_inner());
            while !*done {
                done = self.filled.1.wait(done).unwrap_or_else(|p| p.into_inner());
            }
        }
        match self.value.get() {
            Some(Ok(memory)) => Ok(memory),
            Some(Err(message)) => Err(message.clone()),
            None => Err("the buffer was never filled".into()),
        }
    }

    /// The elements in host memory (what host backends compute on); waits
    /// while the buffer is in flight. Fails when the step that should have
    /// computed it failed, or the memory is a backend's own.
    pub fn wait(&self) -> std::result::Result<&HostData, Arc<str>> {
        match self.wait_memory()? {
            DeviceMemory::Host(data) => Ok(data),
            DeviceMemory::Backend(memory) => Err(not_on_the_host(memory.as_ref())),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Give the memory back (waiting while in flight).
    pub fn into_memory(mut self) -> std::result::Result<DeviceMemory, Arc<str>> {
        self.wait_memory()?;
        match self.value.take() {
            Some(Ok(memory)) => Ok(memory),
            Some(Err(message)) => Err(message),
            None => Err("the buffer was never filled".into()),
        }
    }

    /// Give the memory back as host data (waiting while in flight); fails
    /// for a backend's own memory.
    pub fn into_host(self) -> std::result::Result<HostData, Arc<str>> {
        match self.into_memory()? {
            DeviceMemory::Host(data) => Ok(data),
            DeviceMemory::Backend(memory) => Err(not_on_the_host(memory.as_ref())),
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        LIVE_BUFFER_BYTES.fetch_sub(self.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The rest of the line of `field` (such as `Rss:`) of the memory
    /// mapping that holds `address` (`/proc/self/smaps`), if one does.
    fn mapping_field(address: usize, field: &str) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((start, end)) = first.split_once('-').filter(|(s, _)| !s.ends_with(':')) {
                let (start, end) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16));
                inside = matches!((start, end), (Ok(s), Ok(e)) if (s..e).contains(&address));
            } else if inside && first == field {
                return Some(line[first.len()..].trim().to_string());
            }
        }
        None
    }

    /// Kibibytes resident of the memory mapping that holds `address`.
    fn resident_kib_of_mapping(address: usize) -> Option<u64> {
        mapping_field(address, "Rss:")?.split_whitespace().next()?.parse().ok()
    }

    /// A large buffer's mapping asks for huge pages (where the system has
    /// transparent huge pages).
    #[test]
    fn large_buffers_ask_for_huge_pages() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            eprintln!("skipped: this system has no transparent huge pages");
            return;
        }
        let asks = |data: &HostData| {
            let HostData::F32(v) = data else { unreachable!("f32 buffers") };
            let flags = mapping_field(v.as_ptr() as usize, "VmFlags:").expect("the buffer lies in a mapping");
            flags.split_whitespace().any(|f| f == "hg")
        };
        let large = HostData::with_capacity(DType::F32, HUGE_PAGES_FROM / 4);
        let zeros = HostData::zeros(DType::F32, 3 * HUGE_PAGES_FROM / 4);
        assert!(asks(&large) && asks(&zeros));
    }

    /// A large zero buffer is resident in full before anything writes to it
    /// (its pages are its own, not the shared zero page), for f32 and bf16.
    #[test]
    fn large_zero_buffers_are_written_out() {
        let len = 16 << 20;
        for dtype in [DType::F32, DType::BF16] {
            let zeros = HostData::zeros(dtype, len);
            let (address, bytes) = match &zeros {
                HostData::F32(v) => (v.as_ptr() as usize, v.len() * 4),
                HostData::BF16(v) => (v.as_ptr() as usize, v.len() * 2),
                other => unreachable!("asked for f32 or bf16, got {}", other.dtype()),
            };
            let resident = resident_kib_of_mapping(address).expect("the buffer lies in a mapping");
            assert!(resident as usize * 1024 >= bytes, "{dtype}: {resident} KiB resident of {bytes} bytes");
            assert!((0..len).step_by(4099).all(|i| zeros.get_f64(i) == 0.0), "{dtype}: zeros");
        }
    }
}
