//! Randomness inside a step that every strategy reproduces: dropout masks drawn from the seed,
//! the step and each example's row in the global batch (DATA-1).
//!
//! candle's own `Tensor::rand` draws from an unseeded CPU generator, so candle-nn's dropout
//! differs on every run and replica. [`Dropout`] here draws element `j` of row `r` (first
//! dimension) of its `c`-th call in a step from a counter-based hash of
//! `(seed, step, c, replica × rows + r, j)`: no state moves between replicas, and where the
//! global batch splits evenly (replica `k` holding rows `k × rows ..`), every row's mask is that
//! of its row in the global batch, the same under the default strategy, `Mirrored` and
//! `MultiWorkerMirrored`. The training step sets the [`StepRandomness`] of the calling replica
//! with [`with_step_randomness`]; outside one, a thread draws from seed 0, step 0, replica 0,
//! its calls counted from the thread's start.

use std::cell::RefCell;

use candle_core::Tensor;
use candle_nn::ModuleT;

use super::NnError;

/// The randomness of one replica's step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepRandomness {
    /// The job's seed.
    pub seed: u64,
    /// The global step.
    pub step: u64,
    /// The replica (`replica_id_in_sync_group`): its rows follow those of the replicas
    /// before it in the global batch.
    pub replica: u64,
}

/// Runs `f` with `randomness` as the calling thread's step randomness (restored after, even if
/// `f` panics); calls of random layers inside are counted from zero.
pub fn with_step_randomness<R>(randomness: StepRandomness, f: impl FnOnce() -> R) -> R {
    let previous = CURRENT.with(|c| {
        c.replace(Current {
            randomness,
            calls: 0,
        })
    });
    let _restore = Restore(Some(previous));
    f()
}

/// Inverted dropout (Keras' `Dropout`, candle-nn's `Dropout`): in training each element is
/// zeroed with probability `p` and the rest scaled by `1 / (1 - p)`; at inference it is the
/// identity. Its masks follow the calling replica's [`StepRandomness`].
///
/// ```
/// use cohort::candle::{Device, ModuleT, Tensor};
/// use cohort::nn::{with_step_randomness, Dropout, StepRandomness};
///
/// let dropout = Dropout::new(0.5)?;
/// let x = Tensor::ones((4, 8), cohort::candle::DType::F32, &Device::Cpu)?;
/// let at = StepRandomness { seed: 1, step: 3, replica: 0 };
/// let a = with_step_randomness(at, || dropout.forward_t(&x, true))?;
/// let b = with_step_randomness(at, || dropout.forward_t(&x, true))?;
/// assert_eq!(a.to_vec2::<f32>()?, b.to_vec2::<f32>()?);
/// // Rows 2..4 of the global batch, held by a second replica, get the same masks.
/// let second = StepRandomness { replica: 1, ..at };
/// let c = with_step_randomness(second, || dropout.forward_t(&x.narrow(0, 0, 2)?, true))?;
/// assert_eq!(c.to_vec2::<f32>()?, a.narrow(0, 2, 2)?.to_vec2::<f32>()?);
/// assert_eq!(dropout.forward_t(&x, false)?.to_vec2::<f32>()?, x.to_vec2::<f32>()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    p: f32,
}

impl Dropout {
    /// Drops each element with probability `p`, in `[0, 1)`.
    pub fn new(p: f32) -> Result<Self, NnError> {
        if !(0.0..1.0).contains(&p) {
            return Err(NnError::Config {
                layer: "dropout".to_owned(),
                reason: format!("the drop probability must be in [0, 1), got {p}"),
            });
        }
        Ok(Self { p })
    }

    /// The drop probability.
    pub fn rate(&self) -> f32 {
        self.p
    }
}

impl ModuleT for Dropout {
    fn forward_t(&self, xs: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        if !train || self.p == 0.0 {
            return Ok(xs.clone());
        }
        let (randomness, call) = CURRENT.with(|c| {
            let mut current = c.borrow_mut();
            let call = current.calls;
            current.calls += 1;
            (current.randomness, call)
        });
        let count = xs.elem_count();
        let rows = if xs.rank() == 0 { 1 } else { xs.dims()[0] };
        let per_row = count.checked_div(rows).unwrap_or(0);
        let scale = 1.0 / (1.0 - self.p);
        let call_key = mix(mix(mix(randomness.seed) ^ randomness.step) ^ call);
        let mut mask = Vec::with_capacity(count);
        let first_row = randomness.replica.wrapping_mul(rows as u64);
        for row in 0..rows as u64 {
            let row_key = mix(call_key ^ first_row.wrapping_add(row));
            for j in 0..per_row as u64 {
                let draw = (mix(row_key ^ j) >> 40) as f32 / (1u64 << 24) as f32;
                mask.push(if draw < self.p { 0.0 } else { scale });
            }
        }
        let mask = Tensor::from_vec(mask, xs.shape(), xs.device())?.to_dtype(xs.dtype())?;
        xs * mask
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Current {
    randomness: StepRandomness,
    calls: u64,
}

thread_local! {
    static CURRENT: RefCell<Current> = RefCell::new(Current::default());
}

/// Puts the previous step randomness back when a scope ends.
struct Restore(Option<Current>);

impl Drop for Restore {
    fn drop(&mut self) {
        if let Some(previous) = self.0.take() {
            CURRENT.with(|c| *c.borrow_mut() = previous);
        }
    }
}

/// splitmix64's finalizer: a well-mixed 64-bit hash of a counter.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
