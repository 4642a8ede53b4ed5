//! A model's weights as one safetensors file: every variable whole, by name (what
//! `Model::save` writes and `Model::load` reads; Python's `safetensors` package reads it
//! too). Loading checks every name and shape first and changes nothing on a mismatch.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::KerasError;
use crate::variable::Variable;

/// Every variable's current value, by name, in the variables' order.
pub(crate) fn read_weights(variables: &[Variable]) -> Result<Vec<(String, Tensor)>, KerasError> {
    variables
        .iter()
        .map(|v| {
            let value = v.try_read_value()?;
            Ok((v.name().to_owned(), value.to_device(&Device::Cpu)?))
        })
        .collect()
}

/// Writes every variable to `path` (a temporary file renamed into place, so that a reader
/// never sees half a file).
pub(crate) fn save_variables(variables: &[Variable], path: &Path) -> Result<(), KerasError> {
    let weights: HashMap<String, Tensor> = read_weights(variables)?.into_iter().collect();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| KerasError::io(dir, "create the directory", e))?;
    }
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".tmp-{}", std::process::id()));
    let temporary = std::path::PathBuf::from(temporary);
    candle_core::safetensors::save(&weights, &temporary).map_err(|e| KerasError::Weights {
        source_name: path.display().to_string(),
        detail: format!("cannot write: {e}"),
    })?;
    std::fs::rename(&temporary, path).map_err(|e| KerasError::io(path, "rename into place", e))
}

/// Reads a safetensors file of weights (every tensor by name).
pub(crate) fn load_file(path: &Path) -> Result<Vec<(String, Tensor)>, KerasError> {
    let tensors =
        candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| KerasError::Weights {
            source_name: path.display().to_string(),
            detail: format!("cannot read it as safetensors: {e}"),
        })?;
    let mut named: Vec<(String, Tensor)> = tensors.into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(named)
}

/// Sets every variable from `weights`: each needs a tensor of its name and shape (any float
/// type, converted), and `weights` may hold nothing else. Everything is checked before any
/// variable changes. `source` names where the weights come from, for errors.
pub(crate) fn assign_weights(
    variables: &[Variable],
    weights: &[(String, Tensor)],
    source: &str,
) -> Result<(), KerasError> {
    let by_name: HashMap<&str, &Tensor> = weights.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mismatch = |detail: String| KerasError::Weights {
        source_name: source.to_owned(),
        detail,
    };
    let mut values = Vec::with_capacity(variables.len());
    for variable in variables {
        let Some(tensor) = by_name.get(variable.name()) else {
            return Err(mismatch(format!(
                "it has no tensor `{}` ({:?}), which the model has",
                variable.name(),
                variable.shape()
            )));
        };
        if tensor.dims() != variable.shape() {
            return Err(mismatch(format!(
                "`{}` has shape {:?} there, the model's has {:?}",
                variable.name(),
                tensor.dims(),
                variable.shape()
            )));
        }
        values.push(tensor.to_dtype(variable.dtype())?);
    }
    if let Some((extra, _)) = weights
        .iter()
        .find(|(n, _)| !variables.iter().any(|v| v.name() == n))
    {
        return Err(mismatch(format!(
            "it has a tensor `{extra}` that the model does not: it is another model's"
        )));
    }
    for (variable, value) in variables.iter().zip(values) {
        variable.assign(&value)?;
    }
    Ok(())
}
