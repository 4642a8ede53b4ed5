//! The per-element kernels of RMSprop and FTRL (Keras' formulations; see the module doc of
//! `optim` for the formulas), run over the spans of a dense or a row-sparse update as the
//! other optimizers' are.

use super::{
    OptimError, OptimizerKind, Slots, SLOT_ACCUMULATOR, SLOT_AVERAGE_GRADIENT, SLOT_LINEAR,
    SLOT_MOMENTUM, SLOT_VELOCITY,
};

/// RMSprop's slots: the squared-gradient average, then the momentum and the gradient's
/// average where they are kept.
pub(super) fn rmsprop_slots(momentum: bool, centered: bool) -> &'static [&'static str] {
    match (momentum, centered) {
        (false, false) => &[SLOT_VELOCITY],
        (true, false) => &[SLOT_VELOCITY, SLOT_MOMENTUM],
        (false, true) => &[SLOT_VELOCITY, SLOT_AVERAGE_GRADIENT],
        (true, true) => &[SLOT_VELOCITY, SLOT_MOMENTUM, SLOT_AVERAGE_GRADIENT],
    }
}

/// RMSprop at one step.
#[derive(Debug, Clone, Copy)]
pub(super) struct RmsProp {
    pub(super) lr: f32,
    pub(super) rho: f32,
    pub(super) momentum: f32,
    pub(super) epsilon: f32,
    pub(super) centered: bool,
}

impl RmsProp {
    pub(super) fn apply<'g>(
        &self,
        params: &mut [f32],
        slots: &mut Slots,
        spans: impl IntoIterator<Item = (usize, &'g [f32])>,
    ) {
        let with_momentum = self.momentum > 0.0;
        let mut buffers = slots
            .buffers_mut(rmsprop_slots(with_momentum, self.centered))
            .into_iter();
        let velocity = buffers.next().expect("RMSprop keeps its velocity");
        let mut momentum = if with_momentum { buffers.next() } else { None };
        let mut average = if self.centered { buffers.next() } else { None };
        let (rho, lr, epsilon) = (self.rho, self.lr, self.epsilon);
        for (start, grad) in spans {
            for (k, &g) in grad.iter().enumerate() {
                let i = start + k;
                velocity[i] = rho * velocity[i] + (1.0 - rho) * g * g;
                let denominator = match average.as_deref_mut() {
                    Some(average) => {
                        average[i] = rho * average[i] + (1.0 - rho) * g;
                        velocity[i] - average[i] * average[i] + epsilon
                    }
                    None => velocity[i] + epsilon,
                };
                let step = lr * g / denominator.sqrt();
                match momentum.as_deref_mut() {
                    Some(m) => {
                        m[i] = self.momentum * m[i] + step;
                        params[i] -= m[i];
                    }
                    None => params[i] -= step,
                }
            }
        }
    }
}

/// FTRL at one step (`power` is the negated rate power; `l2` has beta's term in it).
#[derive(Debug, Clone, Copy)]
pub(super) struct Ftrl {
    pub(super) lr: f32,
    pub(super) power: f32,
    pub(super) l1: f32,
    pub(super) l2: f32,
    pub(super) l2_shrinkage: f32,
}

impl Ftrl {
    pub(super) fn apply<'g>(
        &self,
        params: &mut [f32],
        slots: &mut Slots,
        spans: impl IntoIterator<Item = (usize, &'g [f32])>,
    ) {
        let (accumulator, linear) = slots.buffer_pair_mut(SLOT_ACCUMULATOR, SLOT_LINEAR);
        let root = |n: f32| {
            // Keras' default power (0.5 here) is a square root: exact, and faster than powf.
            if self.power == 0.5 {
                n.sqrt()
            } else {
                n.powf(self.power)
            }
        };
        for (start, grad) in spans {
            for (k, &g) in grad.iter().enumerate() {
                let i = start + k;
                let p = params[i];
                let n = accumulator[i];
                let next = n + g * g;
                let shrunk = g + 2.0 * self.l2_shrinkage * p;
                linear[i] += shrunk - (root(next) - root(n)) / self.lr * p;
                let quadratic = root(next) / self.lr + 2.0 * self.l2;
                let z = linear[i];
                params[i] = (z.clamp(-self.l1, self.l1) - z) / quadratic;
                accumulator[i] = next;
            }
        }
    }
}

/// FTRL's hyperparameters against their domains: a rate above zero (every step divides by
/// it), a rate power at most zero, the rest finite and non-negative.
pub(super) fn check_ftrl(kind: &OptimizerKind) -> Result<(), OptimError> {
    let OptimizerKind::Ftrl {
        learning_rate,
        learning_rate_power,
        initial_accumulator_value,
        l1,
        l2,
        l2_shrinkage,
        beta,
    } = *kind
    else {
        return Ok(());
    };
    let bad = |name: &str, value: f32, reason: &str| OptimError::Hyperparameter {
        name: name.into(),
        value,
        reason: reason.into(),
    };
    if !(learning_rate.is_finite() && learning_rate > 0.0) {
        return Err(bad(
            "learning_rate",
            learning_rate,
            "FTRL's must be finite and above zero",
        ));
    }
    if !(learning_rate_power.is_finite() && learning_rate_power <= 0.0) {
        return Err(bad(
            "learning_rate_power",
            learning_rate_power,
            "must be finite and at most zero",
        ));
    }
    for (name, value) in [
        ("initial_accumulator_value", initial_accumulator_value),
        ("l1", l1),
        ("l2", l2),
        ("l2_shrinkage", l2_shrinkage),
        ("beta", beta),
    ] {
        if !(value.is_finite() && value >= 0.0) {
            return Err(bad(name, value, "must be finite and non-negative"));
        }
    }
    Ok(())
}
