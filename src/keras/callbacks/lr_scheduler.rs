//! Setting the learning rate at the start of each epoch (Keras' `LearningRateScheduler`).

use std::fmt;

use super::{Callback, TrainingContext};
use crate::keras::KerasError;

/// The rate for an epoch (from 0), given the rate in force.
type ScheduleFn = dyn Fn(usize, f32) -> f32 + Send;

/// Sets the optimizer's learning rate to `schedule(epoch, current)` before each epoch; every
/// worker computes the same rate (`fit` logs it as `learning_rate`). Under
/// ParameterServerStrategy the chief computes it and the servers apply each closure's updates
/// at the rate in force when it was scheduled, on every attempt
/// ([`TrainingContext::set_learning_rate`]).
///
/// The rate set is part of the training state: a backup and the state a MultiWorkerMirrored
/// group hands a joiner or a re-formed group carry it, so a job that resumes and a worker that
/// joins go on at the rate in force there, and a schedule made from the rate before
/// (`rate * 0.5`) is neither reset nor applied twice for the epoch it resumes in.
pub struct LearningRateScheduler {
    schedule: Box<ScheduleFn>,
}

impl LearningRateScheduler {
    /// A scheduler from `schedule(epoch, current_rate) -> rate`.
    pub fn new<F>(schedule: F) -> Self
    where
        F: Fn(usize, f32) -> f32 + Send + 'static,
    {
        Self {
            schedule: Box::new(schedule),
        }
    }
}

impl fmt::Debug for LearningRateScheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LearningRateScheduler")
            .finish_non_exhaustive()
    }
}

impl Callback for LearningRateScheduler {
    fn on_epoch_begin(
        &mut self,
        epoch: usize,
        ctx: &mut TrainingContext<'_>,
    ) -> Result<(), KerasError> {
        let rate = (self.schedule)(epoch, ctx.learning_rate());
        ctx.set_learning_rate(rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::Optimizer;
    use crate::train::DistributedOptimizer;

    fn context(optimizer: &DistributedOptimizer) -> TrainingContext<'_> {
        TrainingContext {
            optimizer,
            variables: &[],
            is_chief: true,
            stop_training: false,
            step: 0,
            step_in_epoch: 0,
            epochs: 3,
            steps_per_epoch: Some(10),
            weights_set: false,
        }
    }

    #[test]
    fn sets_the_rate_of_each_epoch_and_refuses_a_rate_no_optimizer_takes() {
        let optimizer = DistributedOptimizer::new(Optimizer::sgd(0.1));
        let mut halve =
            LearningRateScheduler::new(|epoch, rate| if epoch > 0 { rate / 2.0 } else { rate });
        for epoch in 0..3 {
            halve
                .on_epoch_begin(epoch, &mut context(&optimizer))
                .unwrap();
        }
        assert!((optimizer.learning_rate() - 0.025).abs() < 1e-7);
        // A rate no optimizer takes is refused, naming it, and the rate in force stays.
        let mut broken = LearningRateScheduler::new(|_, _| f32::NAN);
        let err = broken
            .on_epoch_begin(3, &mut context(&optimizer))
            .unwrap_err();
        assert!(matches!(err, KerasError::Train(_)), "{err}");
        assert!(err.to_string().contains("NaN"), "{err}");
        assert!((optimizer.learning_rate() - 0.025).abs() < 1e-7);
    }
}
