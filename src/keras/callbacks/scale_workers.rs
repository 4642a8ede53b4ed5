//! Scaling a local cluster on a schedule of steps (what `cohort scale` does by hand).

use std::path::PathBuf;

use super::{Callback, TrainingContext};
use crate::keras::{KerasError, Logs};

/// On the chief, asks the launcher that started the job (`<program> launch`, which gives
/// every task its run directory in `COHORT_RUN_DIR`) for `workers` workers when training
/// reaches each step of the plan: the launcher starts new workers (the group admits them at a
/// step boundary) or drains the newest (they leave at one). For demonstrations and tests of
/// elasticity; outside a local cluster it does nothing and says so once.
#[derive(Debug)]
pub struct ScaleWorkers {
    plan: Vec<(u64, u32)>,
    run_dir: Option<PathBuf>,
    warned: bool,
}

impl ScaleWorkers {
    /// At each `(step, workers)`, ask for `workers` workers besides the chief.
    pub fn at(plan: &[(u64, u32)]) -> Self {
        Self {
            plan: plan.to_vec(),
            run_dir: std::env::var_os(crate::launch::RUN_DIR_ENV).map(PathBuf::from),
            warned: false,
        }
    }
}

impl Callback for ScaleWorkers {
    fn on_train_batch_end(
        &mut self,
        step: u64,
        _logs: &Logs,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        if !ctx.is_chief() {
            return Ok(());
        }
        for &(_, workers) in self.plan.iter().filter(|(at, _)| *at == step) {
            let Some(run_dir) = &self.run_dir else {
                if !std::mem::replace(&mut self.warned, true) {
                    tracing::warn!("ScaleWorkers: not started by `launch` (no COHORT_RUN_DIR): the job is not scaled");
                }
                return Ok(());
            };
            match crate::launch::request_scale(run_dir, workers) {
                Ok(()) => tracing::info!(step, workers, "asked the launcher to scale the job"),
                Err(e) => {
                    tracing::warn!(step, workers, "the launcher refused to scale the job: {e}")
                }
            }
        }
        Ok(())
    }
}
