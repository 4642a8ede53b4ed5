//! Generated data sets whose best achievable quality is known, for examples, tests and
//! benchmarks where no public set of the right kind can be fetched: click logs of hashed
//! categorical features drawn from a planted model ([`ClickLog`]), and the hashing of a
//! categorical feature into buckets ([`hash_bucket`], Keras' `Hashing` layer).

use candle_core::{DType, Device, Tensor};

use super::{DataError, Dataset};

/// Bucket of value `value` of categorical field `field` among `buckets` shared by every
/// field (Keras' `Hashing(num_bins=buckets)` after crossing the value with its field): the
/// same on every process and run. `buckets` must be at least 1.
///
/// ```
/// use cohort::data::synthetic::hash_bucket;
///
/// assert!(hash_bucket(3, 42, 1000) < 1000);
/// assert_ne!(hash_bucket(0, 42, 1 << 20), hash_bucket(1, 42, 1 << 20));
/// ```
pub fn hash_bucket(field: usize, value: u64, buckets: usize) -> u32 {
    let hash = (field as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ value.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (hash % buckets.max(1) as u64) as u32
}

/// Synthetic ad impressions: `fields` categorical fields, each with a skewed value in
/// `0..values` hashed into `buckets` shared buckets ([`hash_bucket`]); whether it was clicked
/// is drawn from a planted logit (an effect per value of fields 0–3, and an interaction of
/// fields 4 and 5), so that a wide-and-deep model can learn it and its best AUC is high.
///
/// ```
/// use cohort::data::synthetic::ClickLog;
///
/// let log = ClickLog::default().impressions(100, 7)?;
/// let first = log.iter().next().unwrap()?;
/// assert_eq!(first[0].dims(), &[8]); // a bucket per field
/// assert_eq!(first[1].dims(), &[1]); // clicked: 0 or 1
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClickLog {
    /// Categorical fields per impression (at least 6: the planted logit reads fields 0–5).
    pub fields: usize,
    /// Distinct values per field.
    pub values: u64,
    /// Hash buckets shared by every field (the embedding tables' rows).
    pub buckets: usize,
}

impl Default for ClickLog {
    /// 8 fields of 500 values each into 20,000 buckets.
    fn default() -> Self {
        Self {
            fields: 8,
            values: 500,
            buckets: 20_000,
        }
    }
}

impl ClickLog {
    /// `n` impressions from stream `seed`: elements `(bucket ids [fields] u32, clicked [1]
    /// f32)`. Streams of different seeds are independent draws of the same planted model.
    pub fn impressions(&self, n: usize, seed: u64) -> Result<Dataset, DataError> {
        if self.fields < 6 || self.values == 0 || self.buckets == 0 {
            return Err(DataError::invalid(
                "ClickLog::impressions",
                format!("needs at least 6 fields, 1 value and 1 bucket: got {self:?}"),
            ));
        }
        let mut state = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let effect = |field: usize, value: u64| {
            ((hash_bucket(field, value, self.buckets) % 97) as f32 / 48.0) - 1.0
        };
        let (mut ids, mut clicks) = (Vec::with_capacity(n * self.fields), Vec::with_capacity(n));
        for _ in 0..n {
            let values: Vec<u64> = (0..self.fields)
                .map(|_| (next() % self.values) * (next() % self.values) / self.values)
                .collect();
            let mut logit = -0.5 + (0..4).map(|f| 1.5 * effect(f, values[f])).sum::<f32>();
            if (values[4] + values[5]) % 3 == 0 {
                logit += 2.0;
            }
            let click = ((next() % 10_000) as f32 / 10_000.0) < 1.0 / (1.0 + (-logit).exp());
            ids.extend(
                values
                    .iter()
                    .enumerate()
                    .map(|(f, &v)| hash_bucket(f, v, self.buckets)),
            );
            clicks.push(f32::from(u8::from(click)));
        }
        Dataset::from_tensor_slices(vec![
            Tensor::from_vec(ids, (n, self.fields), &Device::Cpu)?,
            Tensor::from_vec(clicks, (n, 1), &Device::Cpu)?.to_dtype(DType::F32)?,
        ])
    }
}
