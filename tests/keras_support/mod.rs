//! Data shared by the `keras` tests: a small classification problem anyone can learn.
#![allow(dead_code)]

use cohort::candle::{Device, Tensor};

/// Features of each example of [`blobs`].
pub const FEATURES: usize = 8;
/// Classes of [`blobs`].
pub const CLASSES: usize = 3;

/// `examples` examples of three separable clusters (class `c` centred at `+2` on feature `c`,
/// with seeded noise): features `[examples, FEATURES]` f32 and classes `[examples]` u32.
pub fn blobs(examples: usize, seed: u64) -> cohort::candle::Result<(Tensor, Tensor)> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut noise = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    let mut x = Vec::with_capacity(examples * FEATURES);
    let mut y = Vec::with_capacity(examples);
    for i in 0..examples {
        let class = i % CLASSES;
        for f in 0..FEATURES {
            x.push(if f == class { 2.0 } else { 0.0 } + 1.5 * noise());
        }
        y.push(class as u32);
    }
    Ok((
        Tensor::from_vec(x, (examples, FEATURES), &Device::Cpu)?,
        Tensor::from_vec(y, examples, &Device::Cpu)?,
    ))
}
