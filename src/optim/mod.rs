//! Optimizers as pure kernels over flat `f32` slices: SGD, momentum (optionally Nesterov),
//! Adagrad, Adam, AdamW, RMSprop and FTRL, each with a dense update ([`Optimizer::apply_dense`]) and a row-sparse
//! update for embeddings ([`Optimizer::apply_rows`]).
//!
//! This module owns the update arithmetic, the per-variable optimizer state ([`Slots`]), the
//! learning rate as a function of the step ([`LearningRateSchedule`]) and the gradient policy (non-finite gradients, length checks). It never does IO, never owns a
//! clock or a thread, and knows nothing of where a variable lives: the same kernel runs inside
//! a replica's training loop and on a parameter server.
//!
//! Rules every update follows, in this order:
//! 1. the hyperparameters, the step, the gradient's length (and row ids) and the slots are
//!    checked; a mismatch is an [`OptimError`] naming the variable, and nothing has changed;
//! 2. a gradient holding NaN or ±Inf is handled by the [`NonFinitePolicy`]: by default the
//!    update is skipped and counted in [`Slots::skipped_non_finite`];
//! 3. only then are the parameters and slots written.
//!
//! Formulas follow Keras' optimizers (TF 2):
//! - SGD: `p -= lr * g`;
//! - momentum: `velocity = momentum * velocity - lr * g`, then `p += velocity` (or with
//!   Nesterov `p += momentum * velocity - lr * g`);
//! - Adagrad: `accumulator += g²`, `p -= lr * g / (sqrt(accumulator) + epsilon)`;
//! - Adam: `m += (g - m) * (1 - β1)`, `v += (g² - v) * (1 - β2)`,
//!   `p -= lr * sqrt(1 - β2^t) / (1 - β1^t) * m / (sqrt(v) + epsilon)`;
//! - AdamW: `p -= lr * weight_decay * p`, then Adam's step;
//! - RMSprop: `velocity = rho * velocity + (1 - rho) * g²`, `step = lr * g / sqrt(velocity +
//!   epsilon)` (centered: `velocity - mean_g² + epsilon`, with `mean_g` the gradient's running
//!   mean), then `p -= step`, or with a momentum `m = momentum * m + step`, `p -= m`;
//! - FTRL: `n' = n + g²`, `z += g + 2·l2_shrinkage·p - (n'^-c - n^-c) / lr · p`,
//!   `p = (clip(z, -l1, l1) - z) / (n'^-c / lr + 2·(l2 + beta / (2·lr)))`, `n = n'`, with `c` the
//!   rate power.
//!
//! The row-sparse update is *lazy*: only the rows named in the push change, including their
//! slots (TensorFlow's sparse momentum/Adagrad kernels and LazyAdam behave this way). When a
//! push names every row once, it equals the dense update.
//!
//! ```
//! use cohort::optim::{Optimizer, UpdateOutcome};
//!
//! let adam = Optimizer::adam(0.1);
//! let mut params = vec![1.0_f32, -1.0];
//! let mut slots = adam.new_slots("dense/kernel", params.len());
//! let outcome = adam.apply_dense(&mut params, &[0.5, -0.5], &mut slots, 1).unwrap();
//! assert_eq!(outcome, UpdateOutcome::Applied);
//! // Adam's first step moves each parameter by about `lr` against the gradient's sign.
//! assert!((params[0] - 0.9).abs() < 1e-5 && (params[1] + 0.9).abs() < 1e-5);
//! // The slots can be exported by name, e.g. for a checkpoint.
//! let names: Vec<&str> = slots.iter().map(|(name, _)| name).collect();
//! assert_eq!(names, ["m", "v"]);
//! ```

mod rules;
mod schedule;
mod scopes;
mod slots;
mod state;

use crate::variable::{row_id_map, RowIdMap};

use serde::{Deserialize, Serialize};

pub use schedule::{LearningRateSchedule, ScheduleError};
pub use scopes::{OptimizerScopes, ScopeError};
pub use slots::Slots;
pub use state::OptimizerState;

/// Which optimizer, with its hyperparameters. Plain data: it can travel to a parameter server
/// and be stored in a checkpoint manifest.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum OptimizerKind {
    /// Plain stochastic gradient descent.
    Sgd {
        /// Step size.
        learning_rate: f32,
    },
    /// SGD with momentum, in Keras' formulation.
    Momentum {
        /// Step size.
        learning_rate: f32,
        /// Decay of the velocity, in `[0, 1)`.
        momentum: f32,
        /// Whether to use Nesterov momentum.
        nesterov: bool,
    },
    /// Adagrad, in Keras' formulation.
    Adagrad {
        /// Step size.
        learning_rate: f32,
        /// Starting value of every accumulator entry (Keras: 0.1).
        initial_accumulator_value: f32,
        /// Added to the root of the accumulator (Keras: 1e-7).
        epsilon: f32,
    },
    /// Adam, in Keras' formulation (epsilon outside the root, bias correction folded into
    /// the step size).
    Adam {
        /// Step size.
        learning_rate: f32,
        /// Decay of the first moment, in `[0, 1)` (Keras: 0.9).
        beta_1: f32,
        /// Decay of the second moment, in `[0, 1)` (Keras: 0.999).
        beta_2: f32,
        /// Added to the root of the second moment (Keras: 1e-7).
        epsilon: f32,
    },
    /// Adam with decoupled weight decay (Keras' `AdamW`): before Adam's step each parameter
    /// is multiplied by `1 - learning_rate * weight_decay`.
    AdamW {
        /// Step size.
        learning_rate: f32,
        /// Decay of the first moment, in `[0, 1)` (Keras: 0.9).
        beta_1: f32,
        /// Decay of the second moment, in `[0, 1)` (Keras: 0.999).
        beta_2: f32,
        /// Added to the root of the second moment (Keras: 1e-7).
        epsilon: f32,
        /// The decoupled weight decay (Keras: 0.004).
        weight_decay: f32,
    },
    /// RMSprop, in Keras' formulation: `velocity = rho·velocity + (1 - rho)·g²`, the step
    /// `lr·g / sqrt(velocity + epsilon)` (centered: `velocity - mean_g² + epsilon`), taken
    /// directly or through a momentum.
    RmsProp {
        /// Step size.
        learning_rate: f32,
        /// Decay of the squared-gradient average, in `[0, 1)` (Keras: 0.9).
        rho: f32,
        /// Momentum of the step, in `[0, 1)` (Keras: 0, none).
        momentum: f32,
        /// Added under the root (Keras: 1e-7).
        epsilon: f32,
        /// Whether the squared average is centered by the gradient's running mean.
        centered: bool,
    },
    /// FTRL-proximal (McMahan et al.), in Keras' formulation: the optimizer of linear models
    /// over sparse features, with L1 and L2 regularization.
    Ftrl {
        /// Step size (above zero).
        learning_rate: f32,
        /// How the per-coordinate rate falls with the accumulated squares, at most 0 (Keras:
        /// -0.5).
        learning_rate_power: f32,
        /// Starting value of every accumulator entry (Keras: 0.1).
        initial_accumulator_value: f32,
        /// L1 regularization strength (Keras: 0).
        l1: f32,
        /// L2 regularization strength (Keras: 0).
        l2: f32,
        /// L2 shrinkage of the gradient (Keras: 0).
        l2_shrinkage: f32,
        /// FTRL's beta, added to the L2 term as `beta / (2·lr)` (Keras: 0).
        beta: f32,
    },
}

/// What to do with a gradient that holds NaN or ±Inf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum NonFinitePolicy {
    /// Leave parameters and slots unchanged and count the skip in
    /// [`Slots::skipped_non_finite`].
    #[default]
    Skip,
    /// Leave parameters and slots unchanged and return [`OptimError::NonFinite`].
    Error,
}

/// What an update did when it returned `Ok`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateOutcome {
    /// Parameters and slots were updated.
    Applied,
    /// The gradient was not finite and the policy said to skip it; nothing changed.
    SkippedNonFinite,
}

/// An optimizer: its kind and hyperparameters plus the non-finite gradient policy.
///
/// Calling protocol, per variable:
/// 1. [`Optimizer::new_slots`] once, with the variable's name and element count (or
///    [`Slots::restore`] from a checkpoint);
/// 2. [`Optimizer::apply_dense`] or [`Optimizer::apply_rows`] for every gradient, with
///    `step` the 1-based count of updates the caller has made (Adam's bias correction uses it;
///    the caller owns the count, as Keras' `optimizer.iterations`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Optimizer {
    kind: OptimizerKind,
    non_finite: NonFinitePolicy,
}

/// Why an update was refused. In every case nothing was changed. It travels in a parameter
/// server's refusal ([`crate::roles::protocol::PsRefusal`]), hence the wire encoding.
#[derive(Debug, Clone, PartialEq, thiserror::Error, bincode::Encode, bincode::Decode)]
pub enum OptimError {
    /// The dense gradient's length differs from the variable's.
    #[error("gradient for variable `{variable}` has {got} elements, the variable has {expected}")]
    GradientLength {
        /// The variable's name.
        variable: String,
        /// The variable's element count.
        expected: usize,
        /// The gradient's element count.
        got: usize,
    },
    /// The parameter slice's length differs from the one the slots were made for.
    #[error(
        "variable `{variable}` has {got} elements but its optimizer slots were made for {expected}"
    )]
    ParamsLength {
        /// The variable's name.
        variable: String,
        /// Element count the slots were made for.
        expected: usize,
        /// Element count of the parameter slice passed in.
        got: usize,
    },
    /// A row width of zero, or a variable whose length is not a multiple of the row width.
    #[error(
        "variable `{variable}` with {len} elements cannot be split into rows of width {row_width}"
    )]
    RowWidth {
        /// The variable's name.
        variable: String,
        /// The variable's element count.
        len: usize,
        /// The row width given.
        row_width: usize,
    },
    /// The row gradients are not `row_ids.len() * row_width` elements long.
    #[error("row gradients for variable `{variable}` have {got} elements, expected {rows} rows of width {row_width}")]
    RowGradientLength {
        /// The variable's name.
        variable: String,
        /// Number of row ids in the push.
        rows: usize,
        /// The row width.
        row_width: usize,
        /// The row gradients' element count.
        got: usize,
    },
    /// A row id past the variable's last row.
    #[error("row id {row} is out of range for variable `{variable}` with {rows} rows")]
    RowOutOfRange {
        /// The variable's name.
        variable: String,
        /// The offending row id.
        row: u64,
        /// The variable's row count.
        rows: usize,
    },
    /// The gradient holds NaN or ±Inf and the policy is [`NonFinitePolicy::Error`].
    #[error(
        "gradient for variable `{variable}` holds a non-finite value ({value}) at element {index}"
    )]
    NonFinite {
        /// The variable's name.
        variable: String,
        /// Index (in the dense gradient, or the summed row gradients) of the first bad value.
        index: usize,
        /// The bad value.
        value: f32,
    },
    /// A hyperparameter outside its domain (e.g. a negative learning rate).
    #[error("optimizer hyperparameter `{name}` = {value} is invalid: {reason}")]
    Hyperparameter {
        /// The hyperparameter's name.
        name: String,
        /// The value given.
        value: f32,
        /// What the domain is.
        reason: String,
    },
    /// Step 0 given to an update (steps count from 1).
    #[error("update of variable `{variable}` was given step 0; steps count from 1")]
    ZeroStep {
        /// The variable's name.
        variable: String,
    },
    /// The slots belong to another optimizer kind (a slot this optimizer needs is missing).
    #[error("variable `{variable}` has no optimizer slot `{slot}`")]
    MissingSlot {
        /// The variable's name.
        variable: String,
        /// The slot that is missing.
        slot: String,
    },
    /// A slot, when restoring, that this optimizer does not use.
    #[error("variable `{variable}` has an unknown optimizer slot `{slot}`")]
    UnknownSlot {
        /// The variable's name.
        variable: String,
        /// The slot's name.
        slot: String,
    },
    /// A slot, when restoring, whose length differs from the variable's.
    #[error(
        "optimizer slot `{slot}` of variable `{variable}` has {got} elements, expected {expected}"
    )]
    SlotLength {
        /// The variable's name.
        variable: String,
        /// The slot's name.
        slot: String,
        /// The variable's element count.
        expected: usize,
        /// The slot's element count.
        got: usize,
    },
}

impl Optimizer {
    /// An optimizer of `kind` with the default non-finite policy ([`NonFinitePolicy::Skip`]).
    pub fn new(kind: OptimizerKind) -> Self {
        Self {
            kind,
            non_finite: NonFinitePolicy::default(),
        }
    }

    /// Plain SGD.
    pub fn sgd(learning_rate: f32) -> Self {
        Self::new(OptimizerKind::Sgd { learning_rate })
    }

    /// SGD with (classical) momentum.
    pub fn momentum(learning_rate: f32, momentum: f32) -> Self {
        Self::new(OptimizerKind::Momentum {
            learning_rate,
            momentum,
            nesterov: false,
        })
    }

    /// SGD with Nesterov momentum.
    pub fn nesterov(learning_rate: f32, momentum: f32) -> Self {
        Self::new(OptimizerKind::Momentum {
            learning_rate,
            momentum,
            nesterov: true,
        })
    }

    /// Adagrad with Keras' defaults (initial accumulator 0.1, epsilon 1e-7).
    pub fn adagrad(learning_rate: f32) -> Self {
        Self::new(OptimizerKind::Adagrad {
            learning_rate,
            initial_accumulator_value: 0.1,
            epsilon: 1e-7,
        })
    }

    /// Adam with Keras' defaults (β1 0.9, β2 0.999, epsilon 1e-7).
    pub fn adam(learning_rate: f32) -> Self {
        Self::new(OptimizerKind::Adam {
            learning_rate,
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-7,
        })
    }

    /// AdamW with Keras' defaults (β1 0.9, β2 0.999, epsilon 1e-7) and `weight_decay`.
    pub fn adamw(learning_rate: f32, weight_decay: f32) -> Self {
        Self::new(OptimizerKind::AdamW {
            learning_rate,
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-7,
            weight_decay,
        })
    }

    /// RMSprop with Keras' defaults (rho 0.9, no momentum, epsilon 1e-7, not centered).
    pub fn rmsprop(learning_rate: f32) -> Self {
        Self::new(OptimizerKind::RmsProp {
            learning_rate,
            rho: 0.9,
            momentum: 0.0,
            epsilon: 1e-7,
            centered: false,
        })
    }

    /// FTRL with Keras' defaults (rate power -0.5, initial accumulator 0.1, no
    /// regularization) and L1 and L2 strengths `l1`, `l2`.
    pub fn ftrl(learning_rate: f32, l1: f32, l2: f32) -> Self {
        Self::new(OptimizerKind::Ftrl {
            learning_rate,
            learning_rate_power: -0.5,
            initial_accumulator_value: 0.1,
            l1,
            l2,
            l2_shrinkage: 0.0,
            beta: 0.0,
        })
    }

    /// The same optimizer with another learning rate (a schedule's value at a step).
    pub fn with_learning_rate(mut self, learning_rate: f32) -> Self {
        match &mut self.kind {
            OptimizerKind::Sgd { learning_rate: lr }
            | OptimizerKind::Momentum {
                learning_rate: lr, ..
            }
            | OptimizerKind::Adagrad {
                learning_rate: lr, ..
            }
            | OptimizerKind::Adam {
                learning_rate: lr, ..
            }
            | OptimizerKind::AdamW {
                learning_rate: lr, ..
            }
            | OptimizerKind::RmsProp {
                learning_rate: lr, ..
            }
            | OptimizerKind::Ftrl {
                learning_rate: lr, ..
            } => *lr = learning_rate,
        }
        self
    }

    /// The same optimizer with another non-finite gradient policy.
    pub fn with_non_finite_policy(mut self, policy: NonFinitePolicy) -> Self {
        self.non_finite = policy;
        self
    }

    /// The kind and hyperparameters.
    pub fn kind(&self) -> &OptimizerKind {
        &self.kind
    }

    /// The non-finite gradient policy.
    pub fn non_finite_policy(&self) -> NonFinitePolicy {
        self.non_finite
    }

    /// The learning rate.
    pub fn learning_rate(&self) -> f32 {
        match self.kind {
            OptimizerKind::Sgd { learning_rate }
            | OptimizerKind::Momentum { learning_rate, .. }
            | OptimizerKind::Adagrad { learning_rate, .. }
            | OptimizerKind::Adam { learning_rate, .. }
            | OptimizerKind::AdamW { learning_rate, .. }
            | OptimizerKind::RmsProp { learning_rate, .. }
            | OptimizerKind::Ftrl { learning_rate, .. } => learning_rate,
        }
    }

    /// Names of the slots this optimizer keeps per variable, in export order.
    pub fn slot_names(&self) -> &'static [&'static str] {
        match self.kind {
            OptimizerKind::Sgd { .. } => &[],
            OptimizerKind::Momentum { .. } => &[SLOT_MOMENTUM],
            OptimizerKind::Adagrad { .. } => &[SLOT_ACCUMULATOR],
            OptimizerKind::Adam { .. } | OptimizerKind::AdamW { .. } => &[SLOT_M, SLOT_V],
            OptimizerKind::RmsProp {
                momentum, centered, ..
            } => rules::rmsprop_slots(momentum > 0.0, centered),
            OptimizerKind::Ftrl { .. } => &[SLOT_ACCUMULATOR, SLOT_LINEAR],
        }
    }

    /// Fresh slots for a variable named `variable` of `len` elements, at their initial values
    /// (zero, or Adagrad's initial accumulator value).
    pub fn new_slots(&self, variable: &str, len: usize) -> Slots {
        let buffers = self
            .slot_names()
            .iter()
            .map(|&name| (name, vec![self.slot_initial_value(name); len]))
            .collect();
        Slots::from_parts(variable.to_owned(), len, buffers, 0)
    }

    /// Checks the hyperparameters against their domains.
    pub fn validate(&self) -> Result<(), OptimError> {
        check_learning_rate(self.learning_rate())?;
        match self.kind {
            OptimizerKind::Sgd { .. } => Ok(()),
            OptimizerKind::Momentum { momentum, .. } => check_decay("momentum", momentum),
            OptimizerKind::Adagrad {
                initial_accumulator_value,
                epsilon,
                ..
            } => {
                check_non_negative("initial_accumulator_value", initial_accumulator_value)?;
                check_non_negative("epsilon", epsilon)
            }
            OptimizerKind::Adam {
                beta_1,
                beta_2,
                epsilon,
                ..
            } => {
                check_decay("beta_1", beta_1)?;
                check_decay("beta_2", beta_2)?;
                check_non_negative("epsilon", epsilon)
            }
            OptimizerKind::AdamW {
                beta_1,
                beta_2,
                epsilon,
                weight_decay,
                ..
            } => {
                check_decay("beta_1", beta_1)?;
                check_decay("beta_2", beta_2)?;
                check_non_negative("epsilon", epsilon)?;
                check_non_negative("weight_decay", weight_decay)
            }
            OptimizerKind::RmsProp {
                rho,
                momentum,
                epsilon,
                ..
            } => {
                check_decay("rho", rho)?;
                check_decay("momentum", momentum)?;
                check_non_negative("epsilon", epsilon)
            }
            OptimizerKind::Ftrl { .. } => rules::check_ftrl(&self.kind),
        }
    }

    /// Applies a dense gradient to `params` (the whole variable), updating `slots`.
    ///
    /// `step` is the 1-based update count (used by Adam's bias correction). Every check runs
    /// before anything is written; see the module docs for the order.
    pub fn apply_dense(
        &self,
        params: &mut [f32],
        grad: &[f32],
        slots: &mut Slots,
        step: u64,
    ) -> Result<UpdateOutcome, OptimError> {
        self.apply_dense_with(params, grad, slots, step, Screen::Run)
    }

    /// [`Optimizer::apply_dense`], with the non-finite screen left to the caller when it has
    /// already screened every gradient of an all-or-nothing update (the parameter server).
    pub(crate) fn apply_dense_with(
        &self,
        params: &mut [f32],
        grad: &[f32],
        slots: &mut Slots,
        step: u64,
        screen: Screen,
    ) -> Result<UpdateOutcome, OptimError> {
        self.check_common(params, slots, step)?;
        if grad.len() != params.len() {
            return Err(OptimError::GradientLength {
                variable: slots.variable().to_owned(),
                expected: params.len(),
                got: grad.len(),
            });
        }
        if screen == Screen::Run {
            if let Some(outcome) = self.screen_non_finite(grad, slots)? {
                return Ok(outcome);
            }
        }
        self.rule(step).apply(params, slots, [(0, grad)]);
        Ok(UpdateOutcome::Applied)
    }

    /// Applies row gradients to the rows `row_ids` of `params`, a `[rows, row_width]` matrix
    /// stored row-major; only those rows (and their slots) change.
    ///
    /// `row_grads` holds one row of `row_width` gradients per id, in the order of `row_ids`.
    /// Duplicate ids in one push are summed first, so a row is updated once per push.
    /// `step` is the 1-based update count.
    pub fn apply_rows(
        &self,
        params: &mut [f32],
        row_width: usize,
        row_ids: &[u64],
        row_grads: &[f32],
        slots: &mut Slots,
        step: u64,
    ) -> Result<UpdateOutcome, OptimError> {
        self.apply_rows_with(
            params,
            row_width,
            row_ids,
            row_grads,
            slots,
            step,
            Screen::Run,
        )
    }

    /// [`Optimizer::apply_rows`], with the non-finite screen of the pushed rows left to a
    /// caller that has already run it (rows summed from duplicates are still screened).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply_rows_with(
        &self,
        params: &mut [f32],
        row_width: usize,
        row_ids: &[u64],
        row_grads: &[f32],
        slots: &mut Slots,
        step: u64,
        screen: Screen,
    ) -> Result<UpdateOutcome, OptimError> {
        self.check_common(params, slots, step)?;
        let variable = slots.variable();
        if row_width == 0 || params.len() % row_width != 0 {
            return Err(OptimError::RowWidth {
                variable: variable.to_owned(),
                len: params.len(),
                row_width,
            });
        }
        if row_ids.len().checked_mul(row_width) != Some(row_grads.len()) {
            return Err(OptimError::RowGradientLength {
                variable: variable.to_owned(),
                rows: row_ids.len(),
                row_width,
                got: row_grads.len(),
            });
        }
        let rows = params.len() / row_width;
        if let Some(&row) = row_ids.iter().find(|&&id| id >= rows as u64) {
            return Err(OptimError::RowOutOfRange {
                variable: variable.to_owned(),
                row,
                rows,
            });
        }
        if screen == Screen::Run {
            if let Some(outcome) = self.screen_non_finite(row_grads, slots)? {
                return Ok(outcome);
            }
        }
        let rule = self.rule(step);
        match sum_duplicate_rows(row_width, row_ids, row_grads) {
            // The common case (a worker pushes each row once): no copy of the gradients.
            None => rule.apply(params, slots, row_spans(row_ids, row_grads, row_width)),
            Some((unique_rows, summed)) => {
                // Finite inputs can still sum to ±Inf.
                if let Some(outcome) = self.screen_non_finite(&summed, slots)? {
                    return Ok(outcome);
                }
                rule.apply(params, slots, row_spans(&unique_rows, &summed, row_width));
            }
        }
        Ok(UpdateOutcome::Applied)
    }

    fn slot_initial_value(&self, slot: &str) -> f32 {
        match self.kind {
            OptimizerKind::Adagrad {
                initial_accumulator_value,
                ..
            }
            | OptimizerKind::Ftrl {
                initial_accumulator_value,
                ..
            } if slot == SLOT_ACCUMULATOR => initial_accumulator_value,
            _ => 0.0,
        }
    }

    fn check_common(&self, params: &[f32], slots: &Slots, step: u64) -> Result<(), OptimError> {
        self.validate()?;
        if step == 0 {
            return Err(OptimError::ZeroStep {
                variable: slots.variable().to_owned(),
            });
        }
        if params.len() != slots.len() {
            return Err(OptimError::ParamsLength {
                variable: slots.variable().to_owned(),
                expected: slots.len(),
                got: params.len(),
            });
        }
        for &name in self.slot_names() {
            if !slots.contains(name) {
                return Err(OptimError::MissingSlot {
                    variable: slots.variable().to_owned(),
                    slot: name.into(),
                });
            }
        }
        Ok(())
    }

    /// `Ok(Some(Skipped))` when the gradient must be skipped, `Err` when it must be refused.
    fn screen_non_finite(
        &self,
        grad: &[f32],
        slots: &mut Slots,
    ) -> Result<Option<UpdateOutcome>, OptimError> {
        let Some(index) = first_non_finite(grad) else {
            return Ok(None);
        };
        match self.non_finite {
            NonFinitePolicy::Skip => {
                slots.count_skipped_non_finite();
                Ok(Some(UpdateOutcome::SkippedNonFinite))
            }
            NonFinitePolicy::Error => Err(OptimError::NonFinite {
                variable: slots.variable().to_owned(),
                index,
                value: grad[index],
            }),
        }
    }

    fn rule(&self, step: u64) -> Rule {
        match self.kind {
            OptimizerKind::Sgd { learning_rate } => Rule::Sgd { lr: learning_rate },
            OptimizerKind::Momentum {
                learning_rate,
                momentum,
                nesterov,
            } => Rule::Momentum {
                lr: learning_rate,
                momentum,
                nesterov,
            },
            OptimizerKind::Adagrad {
                learning_rate,
                epsilon,
                ..
            } => Rule::Adagrad {
                lr: learning_rate,
                epsilon,
            },
            OptimizerKind::Adam {
                learning_rate,
                beta_1,
                beta_2,
                epsilon,
            } => adam_rule(step, learning_rate, beta_1, beta_2, epsilon, 0.0),
            OptimizerKind::AdamW {
                learning_rate,
                beta_1,
                beta_2,
                epsilon,
                weight_decay,
            } => adam_rule(
                step,
                learning_rate,
                beta_1,
                beta_2,
                epsilon,
                learning_rate * weight_decay,
            ),
            OptimizerKind::RmsProp {
                learning_rate,
                rho,
                momentum,
                epsilon,
                centered,
            } => Rule::RmsProp(rules::RmsProp {
                lr: learning_rate,
                rho,
                momentum,
                epsilon,
                centered,
            }),
            OptimizerKind::Ftrl {
                learning_rate,
                learning_rate_power,
                l1,
                l2,
                l2_shrinkage,
                beta,
                ..
            } => Rule::Ftrl(rules::Ftrl {
                lr: learning_rate,
                power: -learning_rate_power,
                l1,
                l2: l2 + beta / (2.0 * learning_rate),
                l2_shrinkage,
            }),
        }
    }
}

/// Adam's rule at `step`; `decay` is AdamW's `learning_rate × weight_decay` (0 for Adam).
fn adam_rule(
    step: u64,
    learning_rate: f32,
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    decay: f32,
) -> Rule {
    // Bias correction in f64: β^t for large t underflows gracefully to 0.
    let t = step as f64;
    let correction1 = 1.0 - f64::from(beta_1).powf(t);
    let correction2 = 1.0 - f64::from(beta_2).powf(t);
    let alpha = f64::from(learning_rate) * correction2.sqrt() / correction1;
    Rule::Adam {
        alpha: alpha as f32,
        beta_1,
        beta_2,
        epsilon,
        decay,
    }
}

/// Whether an apply call screens its gradient for NaN and Inf itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Screen {
    /// Screen, and apply the non-finite policy.
    Run,
    /// The caller screened this gradient (with the same policy) before calling.
    AlreadyDone,
}

/// The update of one optimizer at one step, ready to run over a range of elements.
#[derive(Debug, Clone, Copy)]
enum Rule {
    Sgd {
        lr: f32,
    },
    Momentum {
        lr: f32,
        momentum: f32,
        nesterov: bool,
    },
    Adagrad {
        lr: f32,
        epsilon: f32,
    },
    Adam {
        alpha: f32,
        beta_1: f32,
        beta_2: f32,
        epsilon: f32,
        /// AdamW's decoupled decay per step (`lr × weight_decay`); 0 for Adam.
        decay: f32,
    },
    RmsProp(rules::RmsProp),
    Ftrl(rules::Ftrl),
}

impl Rule {
    /// Updates each span `(start, grad)`: `params[start..start + grad.len()]` and the slots at
    /// the same indices. The caller has checked every length and that the slots exist. The
    /// rule and its slot buffers are resolved once, not per span: a sparse push has thousands
    /// of one-row spans.
    fn apply<'g>(
        &self,
        params: &mut [f32],
        slots: &mut Slots,
        spans: impl IntoIterator<Item = (usize, &'g [f32])>,
    ) {
        let range = |start: usize, grad: &[f32]| start..start + grad.len();
        match *self {
            Rule::Sgd { lr } => {
                for (start, grad) in spans {
                    for (p, g) in params[range(start, grad)].iter_mut().zip(grad) {
                        *p -= lr * g;
                    }
                }
            }
            Rule::Momentum {
                lr,
                momentum,
                nesterov,
            } => {
                let velocity = slots.buffer_mut(SLOT_MOMENTUM);
                for (start, grad) in spans {
                    let r = range(start, grad);
                    for ((p, g), v) in params[r.clone()].iter_mut().zip(grad).zip(&mut velocity[r])
                    {
                        *v = momentum * *v - lr * g;
                        if nesterov {
                            *p += momentum * *v - lr * g;
                        } else {
                            *p += *v;
                        }
                    }
                }
            }
            Rule::Adagrad { lr, epsilon } => {
                let acc = slots.buffer_mut(SLOT_ACCUMULATOR);
                for (start, grad) in spans {
                    let r = range(start, grad);
                    for ((p, g), a) in params[r.clone()].iter_mut().zip(grad).zip(&mut acc[r]) {
                        *a += g * g;
                        *p -= lr * g / (a.sqrt() + epsilon);
                    }
                }
            }
            Rule::Adam {
                alpha,
                beta_1,
                beta_2,
                epsilon,
                decay,
            } => {
                let (m, v) = slots.buffer_pair_mut(SLOT_M, SLOT_V);
                for (start, grad) in spans {
                    let r = range(start, grad);
                    for (((p, g), m), v) in params[r.clone()]
                        .iter_mut()
                        .zip(grad)
                        .zip(&mut m[r.clone()])
                        .zip(&mut v[r])
                    {
                        *m += (g - *m) * (1.0 - beta_1);
                        *v += (g * g - *v) * (1.0 - beta_2);
                        *p -= decay * *p;
                        *p -= alpha * *m / (v.sqrt() + epsilon);
                    }
                }
            }
            Rule::RmsProp(rule) => rule.apply(params, slots, spans),
            Rule::Ftrl(rule) => rule.apply(params, slots, spans),
        }
    }
}

/// Each row's `(start offset, gradient row)`; the ids were checked to be in range, so the
/// offsets fit in `usize`.
fn row_spans<'g>(
    ids: &'g [u64],
    grads: &'g [f32],
    row_width: usize,
) -> impl Iterator<Item = (usize, &'g [f32])> + 'g {
    ids.iter()
        .zip(grads.chunks_exact(row_width))
        .map(move |(&row, grad)| (row as usize * row_width, grad))
}

/// Sums the gradients of repeated row ids: `None` when every id is distinct (nothing to
/// sum), else the distinct ids in order of first appearance and their summed rows.
fn sum_duplicate_rows(
    row_width: usize,
    row_ids: &[u64],
    row_grads: &[f32],
) -> Option<(Vec<u64>, Vec<f32>)> {
    let mut position: RowIdMap<usize> = row_id_map(row_ids.len());
    let mut repeated = false;
    for (i, &id) in row_ids.iter().enumerate() {
        repeated |= position.insert(id, i).is_some();
    }
    if !repeated {
        return None;
    }
    position.clear();
    let mut unique = Vec::with_capacity(row_ids.len());
    let mut summed: Vec<f32> = Vec::with_capacity(row_grads.len());
    for (&id, grad) in row_ids.iter().zip(row_grads.chunks_exact(row_width)) {
        match position.get(&id) {
            Some(&k) => {
                for (s, g) in summed[k * row_width..(k + 1) * row_width]
                    .iter_mut()
                    .zip(grad)
                {
                    *s += g;
                }
            }
            None => {
                position.insert(id, unique.len());
                unique.push(id);
                summed.extend_from_slice(grad);
            }
        }
    }
    Some((unique, summed))
}

/// Index of the first NaN or Inf in `values`, if any.
///
/// Every gradient is screened before it is applied, so this runs over megabytes per step: it
/// checks whole chunks with a branch-free fold the compiler vectorizes (several times faster
/// than stopping at the first hit element by element), and looks for the position only in a
/// chunk that has one.
pub fn first_non_finite(values: &[f32]) -> Option<usize> {
    const CHUNK: usize = 1024;
    let mut offset = 0;
    for chunk in values.chunks(CHUNK) {
        if !chunk.iter().fold(true, |finite, v| finite & v.is_finite()) {
            return chunk
                .iter()
                .position(|v| !v.is_finite())
                .map(|i| offset + i);
        }
        offset += chunk.len();
    }
    None
}

fn check_learning_rate(value: f32) -> Result<(), OptimError> {
    check_non_negative("learning_rate", value)
}

fn check_non_negative(name: &'static str, value: f32) -> Result<(), OptimError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(OptimError::Hyperparameter {
            name: name.into(),
            value,
            reason: "must be finite and non-negative".into(),
        })
    }
}

fn check_decay(name: &'static str, value: f32) -> Result<(), OptimError> {
    if value.is_finite() && (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(OptimError::Hyperparameter {
            name: name.into(),
            value,
            reason: "must be in [0, 1)".into(),
        })
    }
}

/// Slot of the momentum optimizer: the velocity.
pub const SLOT_MOMENTUM: &str = "momentum";
/// Slot of Adagrad: the running sum of squared gradients.
pub const SLOT_ACCUMULATOR: &str = "accumulator";
/// Slot of Adam: the first moment.
pub const SLOT_M: &str = "m";
/// Slot of Adam: the second moment.
pub const SLOT_V: &str = "v";
/// Slot of RMSprop: the running average of squared gradients.
pub const SLOT_VELOCITY: &str = "velocity";
/// Slot of a centered RMSprop: the running average of gradients.
pub const SLOT_AVERAGE_GRADIENT: &str = "average_gradient";
/// Slot of FTRL: the linear term.
pub const SLOT_LINEAR: &str = "linear";

#[cfg(test)]
mod tests;
