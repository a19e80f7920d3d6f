//! The model's variables by name: the statistics kept fixed, detached snapshots, setting values.

use crate::error::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarMap;
use std::collections::BTreeMap;

/// Names of statistics fitted from data and kept fixed during training.
pub(super) const FIXED: [&str; 3] = ["readout.atom_ref", "readout.scale", "readout.shift"];

/// Copies of every variable's current value, detached: a copy of a `Var` is otherwise recorded
/// in the graph, and every EMA update would then keep all earlier EMA tensors alive.
pub(super) fn snapshot(varmap: &VarMap) -> Result<BTreeMap<String, Tensor>> {
    varmap
        .data()
        .lock()
        .expect("varmap lock")
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.as_tensor().detach().copy()?)))
        .collect()
}

/// Sets the named variables (converting device and dtype); unknown names are an error.
pub(super) fn set_vars(varmap: &VarMap, values: &BTreeMap<String, Tensor>) -> Result<()> {
    let data = varmap.data().lock().expect("varmap lock");
    for (name, value) in values {
        let var = data
            .get(name)
            .ok_or_else(|| Error::Train(format!("no model variable named `{name}`")))?;
        var.set(
            &value
                .to_device(var.device())?
                .to_dtype(var.dtype())?
                .reshape(var.shape())?,
        )?;
    }
    Ok(())
}
