//! Learning-rate schedules (Keras' `keras.optimizers.schedules`): the learning rate as a
//! function of the optimizer's step count, so that every replica of every worker, having
//! applied the same number of updates, uses the same rate (DATA-1).

use serde::{Deserialize, Serialize};

/// A learning rate as a function of the update count `step` (0 for the first update, as
/// Keras passes `optimizer.iterations` before its increment).
///
/// ```
/// use cohort::train::LearningRateSchedule;
///
/// // 10 steps of linear warm-up from 0 to 0.1, then 90 steps of cosine decay to 0.
/// let schedule = LearningRateSchedule::cosine_decay(0.0, 90).with_warmup(0.1, 10);
/// assert_eq!(schedule.at(0), 0.0);
/// assert!((schedule.at(5) - 0.05).abs() < 1e-7);
/// assert!((schedule.at(10) - 0.1).abs() < 1e-7);
/// assert!((schedule.at(55) - 0.05).abs() < 1e-6);
/// assert_eq!(schedule.at(100), 0.0);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LearningRateSchedule {
    /// The same rate at every step.
    Constant(f32),
    /// `initial × decay_rate^(step / decay_steps)` (the exponent floored with `staircase`).
    ExponentialDecay {
        /// The rate at step 0.
        initial: f32,
        /// Steps over which the rate is multiplied by `decay_rate` once.
        decay_steps: u64,
        /// The factor per `decay_steps`.
        decay_rate: f32,
        /// Whether the rate changes in steps rather than continuously.
        staircase: bool,
    },
    /// `values[0]` while `step <= boundaries[0]`, `values[i]` while
    /// `boundaries[i - 1] < step <= boundaries[i]`, and the last value after the last boundary
    /// (Keras' `PiecewiseConstantDecay`): `values` has one more entry than `boundaries`, which
    /// increase.
    PiecewiseConstant {
        /// The steps where the rate changes, increasing.
        boundaries: Vec<u64>,
        /// The rate before each boundary and after the last.
        values: Vec<f32>,
    },
    /// Keras' `CosineDecay`: an optional linear warm-up from `initial` to `warmup_target` over
    /// `warmup_steps`, then a cosine from the peak (`warmup_target`, or `initial` without
    /// warm-up) down to `alpha ×` the peak over `decay_steps`, and that floor after.
    CosineDecay {
        /// The rate at step 0.
        initial: f32,
        /// Steps of the cosine part.
        decay_steps: u64,
        /// The floor, as a fraction of the peak.
        alpha: f32,
        /// The rate the warm-up reaches; `None` for no warm-up.
        warmup_target: Option<f32>,
        /// Steps of the warm-up.
        warmup_steps: u64,
    },
}

/// A schedule whose parameters cannot give a learning rate.
#[derive(Debug, Clone, PartialEq, thiserror::Error, bincode::Encode, bincode::Decode)]
#[error("learning-rate schedule: {0}")]
pub struct ScheduleError(String);

impl LearningRateSchedule {
    /// Keras' `CosineDecay(initial, decay_steps)` without warm-up, decaying to zero.
    pub fn cosine_decay(initial: f32, decay_steps: u64) -> Self {
        Self::CosineDecay {
            initial,
            decay_steps,
            alpha: 0.0,
            warmup_target: None,
            warmup_steps: 0,
        }
    }

    /// The same cosine decay with a linear warm-up to `target` over `steps` first (for the
    /// other schedules, unchanged).
    pub fn with_warmup(self, target: f32, steps: u64) -> Self {
        match self {
            Self::CosineDecay {
                initial,
                decay_steps,
                alpha,
                ..
            } => Self::CosineDecay {
                initial,
                decay_steps,
                alpha,
                warmup_target: Some(target),
                warmup_steps: steps,
            },
            other => other,
        }
    }

    /// Checks that the schedule gives a finite, non-negative rate at every step.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        let rate = |name: &str, v: f32| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(ScheduleError(format!(
                    "{name} = {v} must be finite and non-negative"
                )))
            }
        };
        match self {
            Self::Constant(v) => rate("learning rate", *v),
            Self::ExponentialDecay {
                initial,
                decay_steps,
                decay_rate,
                ..
            } => {
                rate("initial", *initial)?;
                rate("decay_rate", *decay_rate)?;
                if *decay_rate > 1.0 {
                    return Err(ScheduleError(format!(
                        "decay_rate = {decay_rate} grows the rate without bound: give at most 1"
                    )));
                }
                if *decay_steps == 0 {
                    return Err(ScheduleError("decay_steps must be at least 1".into()));
                }
                Ok(())
            }
            Self::PiecewiseConstant { boundaries, values } => {
                if values.len() != boundaries.len() + 1 {
                    return Err(ScheduleError(format!(
                        "{} values for {} boundaries: give one more value than boundaries",
                        values.len(),
                        boundaries.len()
                    )));
                }
                if boundaries.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(ScheduleError(format!(
                        "boundaries {boundaries:?} must increase"
                    )));
                }
                values.iter().try_for_each(|v| rate("value", *v))
            }
            Self::CosineDecay {
                initial,
                alpha,
                warmup_target,
                ..
            } => {
                rate("initial", *initial)?;
                rate("alpha", *alpha)?;
                if let Some(target) = warmup_target {
                    rate("warmup_target", *target)?;
                }
                Ok(())
            }
        }
    }

    /// The learning rate of update `step` (0-based).
    pub fn at(&self, step: u64) -> f32 {
        match self {
            Self::Constant(v) => *v,
            Self::ExponentialDecay {
                initial,
                decay_steps,
                decay_rate,
                staircase,
            } => {
                let mut p = step as f64 / (*decay_steps).max(1) as f64;
                if *staircase {
                    p = p.floor();
                }
                (f64::from(*initial) * f64::from(*decay_rate).powf(p)) as f32
            }
            Self::PiecewiseConstant { boundaries, values } => {
                let index = boundaries.iter().take_while(|&&b| step > b).count();
                values.get(index).or(values.last()).copied().unwrap_or(0.0)
            }
            Self::CosineDecay {
                initial,
                decay_steps,
                alpha,
                warmup_target,
                warmup_steps,
            } => {
                let (peak, decay_from) = match warmup_target {
                    Some(target) if *warmup_steps > 0 && step < *warmup_steps => {
                        let done = step as f64 / *warmup_steps as f64;
                        let (a, b) = (f64::from(*initial), f64::from(*target));
                        return (a + (b - a) * done) as f32;
                    }
                    Some(target) => (*target, *warmup_steps),
                    None => (*initial, 0),
                };
                let into = (step - decay_from.min(step)).min(*decay_steps) as f64;
                let done = if *decay_steps == 0 {
                    1.0
                } else {
                    into / *decay_steps as f64
                };
                let cosine = 0.5 * (1.0 + (std::f64::consts::PI * done).cos());
                let alpha = f64::from(*alpha);
                (f64::from(peak) * ((1.0 - alpha) * cosine + alpha)) as f32
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_and_piecewise_follow_keras() {
        let smooth = LearningRateSchedule::ExponentialDecay {
            initial: 1.0,
            decay_steps: 10,
            decay_rate: 0.5,
            staircase: false,
        };
        assert!((smooth.at(5) - 0.5f32.sqrt()).abs() < 1e-6);
        let stairs = LearningRateSchedule::ExponentialDecay {
            initial: 1.0,
            decay_steps: 10,
            decay_rate: 0.5,
            staircase: true,
        };
        assert_eq!(stairs.at(9), 1.0);
        assert_eq!(stairs.at(10), 0.5);
        let piecewise = LearningRateSchedule::PiecewiseConstant {
            boundaries: vec![10, 20],
            values: vec![1.0, 0.5, 0.1],
        };
        assert_eq!(
            [0, 10, 11, 20, 21, 1000].map(|s| piecewise.at(s)),
            [1.0, 1.0, 0.5, 0.5, 0.1, 0.1]
        );
        let growing = LearningRateSchedule::ExponentialDecay {
            initial: 1.0,
            decay_steps: 10,
            decay_rate: 1.5,
            staircase: false,
        };
        assert!(growing.validate().is_err());
    }

    #[test]
    fn bad_schedules_are_named() {
        let bad = LearningRateSchedule::PiecewiseConstant {
            boundaries: vec![10, 5],
            values: vec![1.0, 0.5, 0.1],
        };
        assert!(bad.validate().unwrap_err().to_string().contains("increase"));
        let short = LearningRateSchedule::PiecewiseConstant {
            boundaries: vec![10],
            values: vec![1.0],
        };
        assert!(short
            .validate()
            .unwrap_err()
            .to_string()
            .contains("1 values"));
        assert!(LearningRateSchedule::Constant(f32::NAN).validate().is_err());
        let cosine = LearningRateSchedule::CosineDecay {
            initial: 1.0,
            decay_steps: 4,
            alpha: 0.1,
            warmup_target: None,
            warmup_steps: 0,
        };
        assert!((cosine.at(4) - 0.1).abs() < 1e-7);
        assert!((cosine.at(400) - 0.1).abs() < 1e-7);
    }
}
