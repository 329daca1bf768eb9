//! State dicts: name → tensor maps for modules and optimizers, and their
//! safetensors files (written atomically: temporary file, fsync, rename).

use crate::module::{named_parameters, Module};
use crate::{NnError, Result};
use lazytrain_core::{DType, Device, HostData, Tensor};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::Path;

/// An ordered map of names to tensors.
#[derive(Clone, Default)]
pub struct StateDict {
    entries: Vec<(String, Tensor)>,
}

impl StateDict {
    /// An empty state dict.
    pub fn new() -> StateDict {
        StateDict::default()
    }

    /// Append an entry.
    pub fn push(&mut self, name: String, tensor: Tensor) {
        self.entries.push((name, tensor));
    }

    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// Entries in order.
    pub fn entries(&self) -> &[(String, Tensor)] {
        &self.entries
    }

    /// Names in order.
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl FromIterator<(String, Tensor)> for StateDict {
    fn from_iter<I: IntoIterator<Item = (String, Tensor)>>(iter: I) -> StateDict {
        StateDict { entries: iter.into_iter().collect() }
    }
}

/// A module's parameters as a state dict.
pub fn state_dict(module: &dyn Module) -> StateDict {
    named_parameters(module).into_iter().collect()
}

/// Load `state` into `module`'s parameters (in place).
pub fn load_state_dict(module: &dyn Module, state: &StateDict) -> Result<()> {
    check_and_load("module", &state_dict(module), state)
}

/// The most lines of tensor problems an error lists.
pub const MAX_LISTED_PROBLEMS: usize = 40;

/// Keep the first [`MAX_LISTED_PROBLEMS`] lines of a tensor-problem list and
/// count the rest in a last line, so that a config and checkpoint that
/// disagree everywhere make an error one can read.
pub fn shorten_problems(problems: &mut Vec<String>) {
    if problems.len() > MAX_LISTED_PROBLEMS {
        let more = problems.len() - MAX_LISTED_PROBLEMS;
        problems.truncate(MAX_LISTED_PROBLEMS);
        problems.push(format!("  ... and {more} more"));
    }
}

/// Check that `incoming` has exactly `own`'s names, shapes and dtypes (one
/// error listing every missing, unexpected and mismatched tensor), then
/// assign each incoming value to its own tensor.
pub(crate) fn check_and_load(target: &str, own: &StateDict, incoming: &StateDict) -> Result<()> {
    let mut problems = Vec::new();
    for (name, t) in own.entries() {
        match incoming.get(name) {
            None => problems.push(format!("  missing: {name} (expected {}{})", t.dtype(), t.shape())),
            Some(v) if v.shape() != t.shape() || v.dtype() != t.dtype() => problems.push(format!(
                "  wrong shape: {name}: expected {}{}, found {}{}",
                t.dtype(),
                t.shape(),
                v.dtype(),
                v.shape()
            )),
            Some(_) => {}
        }
    }
    for (name, v) in incoming.entries() {
        if own.get(name).is_none() {
            problems.push(format!("  unexpected: {name} ({}{})", v.dtype(), v.shape()));
        }
    }
    if !problems.is_empty() {
        shorten_problems(&mut problems);
        return Err(NnError::StateMismatch { target: target.to_string(), problems });
    }
    for (name, t) in own.entries() {
        if let Some(v) = incoming.get(name) {
            let v = if v.device() == t.device() { v.clone() } else { copy_to(v, t.device())? };
            t.assign(&v)?;
        }
    }
    Ok(())
}

fn copy_to(t: &Tensor, device: &Device) -> Result<Tensor> {
    Ok(Tensor::from_host(t.to_host()?, t.shape().clone(), device)?)
}

fn to_safetensors_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

fn host_bytes(data: &HostData) -> Vec<u8> {
    match data {
        HostData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::U8(v) => v.clone(),
        HostData::Bool(v) => v.iter().map(|&b| b as u8).collect(),
    }
}

fn chunks<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    bytes.chunks_exact(N).map(|c| c.try_into().expect("exact chunks"))
}

fn bytes_to_host(dtype: Dtype, bytes: &[u8]) -> Option<HostData> {
    Some(match dtype {
        Dtype::F32 => HostData::F32(chunks(bytes).map(f32::from_le_bytes).collect()),
        Dtype::F64 => HostData::F64(chunks(bytes).map(f64::from_le_bytes).collect()),
        Dtype::BF16 => HostData::BF16(chunks(bytes).map(half::bf16::from_le_bytes).collect()),
        Dtype::F16 => HostData::F16(chunks(bytes).map(half::f16::from_le_bytes).collect()),
        Dtype::I64 => HostData::I64(chunks(bytes).map(i64::from_le_bytes).collect()),
        Dtype::I32 => HostData::I32(chunks(bytes).map(i32::from_le_bytes).collect()),
        Dtype::U8 => HostData::U8(bytes.to_vec()),
        Dtype::BOOL => HostData::Bool(bytes.iter().map(|&b| b != 0).collect()),
        _ => return None,
    })
}

fn file_error(path: &Path, detail: impl Into<String>) -> NnError {
    NnError::File { path: path.display().to_string(), detail: detail.into() }
}

/// Write `state` to a safetensors file with `metadata` in its header. The
/// file appears whole or not at all: it is written under a temporary name,
/// fsynced, then renamed over `path`.
pub fn save_safetensors(path: &Path, state: &StateDict, metadata: &[(&str, &str)]) -> Result<()> {
    let mut owned = Vec::with_capacity(state.len());
    for (name, t) in state.entries() {
        owned.push((name.clone(), to_safetensors_dtype(t.dtype()), t.dims().to_vec(), host_bytes(&t.to_host()?)));
    }
    let views = owned
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| file_error(path, format!("tensor {name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta: HashMap<String, String> = metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| file_error(path, e.to_string()))?;
    write_atomically(path, &bytes)
}

/// Write `bytes` to `path` atomically ([`lazytrain_core::atomic_file`]).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    lazytrain_core::atomic_file::write_atomically(path, bytes)
        .map_err(|e| file_error(path, format!("cannot write: {e}")))
}

/// Read every tensor of a safetensors file onto `device`, in file order.
pub fn load_safetensors(path: &Path, device: &Device) -> Result<StateDict> {
    let bytes = std::fs::read(path).map_err(|e| file_error(path, format!("cannot read: {e}")))?;
    let file = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| {
        file_error(path, format!("not a valid safetensors file ({e}); it may be truncated or corrupt, re-save it"))
    })?;
    let mut tensors: Vec<(String, TensorView)> = file.tensors();
    tensors.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
    let mut state = StateDict::new();
    for (name, view) in tensors {
        let data = bytes_to_host(view.dtype(), view.data())
            .ok_or_else(|| file_error(path, format!("tensor {name} has unsupported dtype {:?}", view.dtype())))?;
        state.push(name, Tensor::from_host(data, view.shape().to_vec(), device)?);
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_problem_lists_are_cut_and_counted() {
        let mut problems: Vec<String> = (0..MAX_LISTED_PROBLEMS + 7).map(|i| format!("  missing: t{i}")).collect();
        shorten_problems(&mut problems);
        assert_eq!(problems.len(), MAX_LISTED_PROBLEMS + 1);
        assert_eq!(problems[MAX_LISTED_PROBLEMS - 1], format!("  missing: t{}", MAX_LISTED_PROBLEMS - 1));
        assert_eq!(problems.last().unwrap(), "  ... and 7 more");
        let mut few = vec!["  missing: a".to_string()];
        shorten_problems(&mut few);
        assert_eq!(few, ["  missing: a"]);
    }
}
