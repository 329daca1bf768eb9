//! Starting every replica from the same values: replica 0's tensors (the
//! initial weights) and settings (the seed) are sent to the others.

use lazytrain_core::{Device, DeviceMemory, Error, HostData, Result, Tensor};

/// Replace each of `tensors` (on `device`, a replica) by replica 0's value,
/// in order; a lone device keeps its own. Every replica calls it with the
/// same tensors (shapes and dtypes) in the same order.
pub fn broadcast_from_master(device: &Device, tensors: &[Tensor]) -> Result<()> {
    let Some(link) = device.replica().filter(|link| link.collective.world_size() > 1) else { return Ok(()) };
    device.sync()?;
    device.wait()?;
    for tensor in tensors {
        let mut memory = DeviceMemory::Host(tensor.to_host()?);
        link.collective.broadcast(link.rank, &mut memory).map_err(|detail| failed("broadcast", detail))?;
        let DeviceMemory::Host(value) = memory else {
            return Err(failed("broadcast", "the collective returned device memory for host data".into()));
        };
        tensor.assign(&Tensor::from_host(value, tensor.shape().clone(), device)?)?;
    }
    device.sync()
}

/// Check that every replica of `device`'s group was given the same `value`
/// of the setting `what` (a seed, say): an error naming both values and
/// then `fix` (what to do about it) when replica 0's differs from this one's.
pub fn check_same_as_master(device: &Device, what: &str, value: u64, fix: &str) -> Result<()> {
    let Some(link) = device.replica().filter(|link| link.collective.world_size() > 1) else { return Ok(()) };
    device.wait()?;
    let mut memory = DeviceMemory::Host(HostData::I64(vec![value as i64]));
    link.collective.broadcast(link.rank, &mut memory).map_err(|detail| failed("broadcast", detail))?;
    match memory.host() {
        Some(HostData::I64(v)) if v.first() == Some(&(value as i64)) => Ok(()),
        Some(HostData::I64(v)) => Err(failed(
            "broadcast",
            format!(
                "replica {} has {what} {value} but replica 0 has {}; {fix}",
                link.rank,
                v.first().map_or(0, |&x| x as u64)
            ),
        )),
        _ => Err(failed("broadcast", format!("the collective changed the {what}'s dtype"))),
    }
}

fn failed(op: &'static str, detail: String) -> Error {
    Error::Execution { node: 0, op, detail }
}
