//! Where the variables of a [`MultiWorkerMirrored`](super::MultiWorkerMirrored) live
//! ([`MultiWorkerPlacement`]): mirrored on the local replicas, starting from the first worker's
//! initial value, and created alike by every worker's model.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::elastic::broken_mendably;
use crate::collective::ProcessSpan;
use crate::variable::{
    MirroredPlacement, Placement, Variable, VariableError, VariablePlacement, VariableRequest,
};

/// Mirrors a variable on the local replicas and makes every worker's copies start from the
/// first worker's initial value (a broadcast right after creation).
#[derive(Debug)]
pub(super) struct MultiWorkerPlacement {
    pub(super) local: MirroredPlacement,
    pub(super) span: ProcessSpan,
    /// Set while this worker joined a live group and waits for its state: then the members
    /// are past creating their variables, and `admit` gives this worker their values.
    pub(super) awaiting_state: Arc<AtomicBool>,
}

impl VariablePlacement for MultiWorkerPlacement {
    fn place(&self, request: &VariableRequest<'_>) -> Result<Placement, VariableError> {
        self.local.place(request)
    }

    fn created(&self, variable: &Variable) -> Result<(), VariableError> {
        if !variable.has_local_copy() || self.awaiting_state.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.check_same_as_others(variable.name(), Some(variable))?;
        match self.span.broadcast(0, &variable.try_read_value()?) {
            Ok(first) => variable.assign(&first),
            // A worker lost while the model is made: the variable keeps its own initial value
            // for now. The group is broken, so the training loop's next call fails with that
            // loss, and `recover` makes every survivor's variables those of one survivor.
            Err(_) if broken_mendably(self.span.group()) => Ok(()),
            Err(source) => Err(VariableError::Collective {
                name: variable.name().to_string(),
                source,
            }),
        }
    }

    fn model_built(&self) -> Result<(), VariableError> {
        if self.awaiting_state.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.check_same_as_others("(the model's end)", None)
    }
}

impl MultiWorkerPlacement {
    /// Compares what this worker's model creates next (`variable`, or its end: `None`) with
    /// what every other worker's creates, by a header of its name's and shape's hashes, and
    /// fails naming the variable and the first worker that differs. Headers are all one size,
    /// so a worker whose model differs meets the others' call instead of waiting on it.
    fn check_same_as_others(
        &self,
        name: &str,
        variable: Option<&Variable>,
    ) -> Result<(), VariableError> {
        let header = |variable: Option<&Variable>| -> [i64; 5] {
            match variable {
                None => [0; 5],
                Some(v) => [
                    1,
                    fnv(v.name().as_bytes()) as i64,
                    v.shape().len() as i64,
                    v.shape().iter().product::<usize>() as i64,
                    fnv(format!("{:?} {:?}", v.shape(), v.dtype()).as_bytes()) as i64,
                ],
            }
        };
        let mine = header(variable);
        let gathered = Tensor::new(&mine, &Device::Cpu)
            .map_err(VariableError::from)
            .and_then(|t| {
                self.span
                    .all_gather(&t)
                    .map_err(|source| VariableError::Collective {
                        name: name.to_string(),
                        source,
                    })
            });
        let all = match gathered {
            Ok(all) => all.to_vec1::<i64>().map_err(VariableError::from)?,
            // A worker lost while the model is made: the recovery settles it (see `created`).
            Err(_) if broken_mendably(self.span.group()) => return Ok(()),
            Err(e) => return Err(e),
        };
        let members = self.span.group().members();
        for (w, theirs) in all.chunks(mine.len()).enumerate() {
            if theirs == mine {
                continue;
            }
            let other = &members[w];
            let detail = match (variable, theirs[0]) {
                (None, _) => format!(
                    "{other}'s model creates more variables than this worker's, whose model ends before it: every worker must build the same model"
                ),
                (Some(_), 0) => format!(
                    "this worker's model creates it, {other}'s model ends before it: every worker must build the same model"
                ),
                (Some(v), _) if theirs[1] != mine[1] => format!(
                    "{other}'s model creates a variable of another name at this point (this worker's is {:?} of shape {:?}): every worker must build the same model",
                    v.name(),
                    v.shape()
                ),
                (Some(v), _) => format!(
                    "{other}'s model creates it with another shape or type ({} dimensions, {} values; here {:?} {:?}): every worker must build the same model",
                    theirs[2],
                    theirs[3],
                    v.shape(),
                    v.dtype()
                ),
            };
            return Err(VariableError::DiffersAcrossWorkers {
                name: name.to_string(),
                detail,
            });
        }
        Ok(())
    }
}

/// FNV-1a of `bytes`: the same on every worker and build.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
