//! What a program's evaluation function takes and returns ([`crate::program::Program::evaluator`]):
//! the whole variables of one checkpoint ([`CheckpointVariables`]), the named metrics it
//! computes ([`Metrics`]) and why it failed ([`EvalError`]). The evaluator role
//! ([`crate::roles::evaluator`]) runs it on each new checkpoint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::checkpoint::{Checkpoint, TensorBytes, TensorError};

/// Named metrics an evaluation function returns, printed in this order.
pub type Metrics = Vec<(String, f64)>;

/// The variables of one checkpoint, as an evaluation function receives them: every variable
/// whole (its parts on the parameter servers put back together in row order), by name, with
/// the checkpoint's step. Optimizer slots are left out.
#[derive(Debug, Clone)]
pub struct CheckpointVariables {
    step: u64,
    dir: PathBuf,
    variables: BTreeMap<String, TensorBytes>,
}

/// Why an evaluation function could not evaluate a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The checkpoint has no variable of this name.
    #[error("the checkpoint has no variable {name:?}")]
    MissingVariable {
        /// The name asked for.
        name: String,
    },
    /// A variable could not be read as asked (wrong dtype) or put back together.
    #[error("variable {name:?}: {source}")]
    Tensor {
        /// The variable.
        name: String,
        /// What is wrong.
        source: TensorError,
    },
    /// Any other failure of the evaluation function: its error, kept as the source.
    #[error("{0}")]
    Other(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl EvalError {
    /// An [`EvalError::Other`] carrying `error`.
    pub fn other(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Other(error.into())
    }
}

impl CheckpointVariables {
    /// The whole variables of `checkpoint` (read from `dir`). Fails only on a checkpoint that
    /// does not validate (one from [`crate::checkpoint::read_checkpoint`] always does).
    pub fn from_checkpoint(
        checkpoint: &Checkpoint,
        dir: impl Into<PathBuf>,
    ) -> Result<Self, EvalError> {
        let mut variables = BTreeMap::new();
        for var in &checkpoint.layout {
            let mut data = Vec::new();
            for (i, spec) in var.shards.iter().enumerate() {
                let part = var.shard_name(i);
                let tensor = checkpoint
                    .tensor(spec.ps as usize, &part)
                    .ok_or_else(|| EvalError::MissingVariable { name: part.clone() })?;
                // Parts are row ranges in order: row-major bytes concatenate.
                data.extend_from_slice(tensor.data());
            }
            let whole = TensorBytes::new(var.dtype, var.shape.clone(), data).map_err(|source| {
                EvalError::Tensor {
                    name: var.name.clone(),
                    source,
                }
            })?;
            variables.insert(var.name.clone(), whole);
        }
        Ok(Self {
            step: checkpoint.step,
            dir: dir.into(),
            variables,
        })
    }

    /// The checkpoint's global training step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The checkpoint's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The variable `name`, whole.
    pub fn get(&self, name: &str) -> Option<&TensorBytes> {
        self.variables.get(name)
    }

    /// The variable `name`'s values (row-major), if it is an `f32` variable.
    pub fn f32(&self, name: &str) -> Result<Vec<f32>, EvalError> {
        let tensor = self.get(name).ok_or_else(|| EvalError::MissingVariable {
            name: name.to_string(),
        })?;
        tensor.to_f32().map_err(|source| EvalError::Tensor {
            name: name.to_string(),
            source,
        })
    }

    /// The variables' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.variables.keys().map(String::as_str)
    }
}
