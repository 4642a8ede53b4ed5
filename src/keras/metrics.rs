//! Metrics a model is compiled with (Keras' `metrics=[...]`), in a form that distributes: a
//! metric turns a batch into *sufficient statistics* (sums of weighted counts) that add across
//! batches, replicas and workers, and computes its result from their total. A step's
//! statistics of every replica are summed with one collective, so every worker reports the
//! same figure for the same global batches.

use std::fmt;
use std::sync::Arc;

use candle_core::{DType, Tensor, D};

use crate::nn::NnError;

/// A metric over batches of `(labels, predictions)` with per-example weights.
///
/// [`Metric::batch_state`] gives `state_len` numbers for one batch; the model adds them over
/// every batch of every replica of the epoch, then asks [`Metric::result`] of the total.
pub trait Metric: Send + Sync + fmt::Debug {
    /// The name in logs (`accuracy`, and `val_accuracy` on validation data).
    fn name(&self) -> &str;
    /// How many numbers the statistics hold.
    fn state_len(&self) -> usize;
    /// The statistics of one batch: `labels` as the dataset gives them, `predictions` as the
    /// network does, `weights` one `f32` per example (ones without sample weights).
    fn batch_state(
        &self,
        labels: &Tensor,
        predictions: &Tensor,
        weights: &[f32],
    ) -> Result<Vec<f64>, NnError>;
    /// The result of summed statistics (`NaN` where nothing was counted).
    fn result(&self, state: &[f64]) -> f64;
}

/// A per-example value `(labels, predictions) -> [batch]`.
type ValueFn = dyn Fn(&Tensor, &Tensor) -> Result<Tensor, NnError> + Send + Sync;

/// The weighted mean of a per-example value (Keras' `Mean`, `MeanSquaredError`, ...).
#[derive(Clone)]
pub struct Mean {
    name: String,
    value: Arc<ValueFn>,
}

impl Mean {
    /// The mean of `value(labels, predictions)`, one value per example.
    pub fn of<F>(name: impl Into<String>, value: F) -> Self
    where
        F: Fn(&Tensor, &Tensor) -> Result<Tensor, NnError> + Send + Sync + 'static,
    {
        Self {
            name: name.into(),
            value: Arc::new(value),
        }
    }

    /// The mean absolute error, averaged over the last axis per example (`mae`).
    pub fn absolute_error() -> Self {
        Self::of("mae", |labels, predictions| {
            let diff = (predictions.to_dtype(DType::F32)? - labels.to_dtype(DType::F32)?)?.abs()?;
            per_example_mean(diff)
        })
    }

    /// The mean squared error, averaged over the last axis per example (`mse`).
    pub fn squared_error() -> Self {
        Self::of("mse", |labels, predictions| {
            let diff = (predictions.to_dtype(DType::F32)? - labels.to_dtype(DType::F32)?)?.sqr()?;
            per_example_mean(diff)
        })
    }
}

fn per_example_mean(t: Tensor) -> Result<Tensor, NnError> {
    Ok(if t.rank() <= 1 {
        t
    } else {
        t.flatten_from(1)?.mean(D::Minus1)?
    })
}

impl fmt::Debug for Mean {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mean").field("name", &self.name).finish()
    }
}

impl Metric for Mean {
    fn name(&self) -> &str {
        &self.name
    }
    fn state_len(&self) -> usize {
        2
    }
    fn batch_state(
        &self,
        labels: &Tensor,
        predictions: &Tensor,
        weights: &[f32],
    ) -> Result<Vec<f64>, NnError> {
        let values = flat_f32((self.value)(labels, predictions)?)?;
        check_len(&self.name, values.len(), weights.len())?;
        Ok(weighted_ratio(values.iter().copied(), weights))
    }
    fn result(&self, state: &[f64]) -> f64 {
        ratio(state[0], state[1])
    }
}

/// How predictions are matched to labels by [`Accuracy`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum AccuracyKind {
    /// Arg-max of `[batch, classes]` against integer labels.
    SparseCategorical,
    /// Arg-max of predictions against arg-max of one-hot labels.
    Categorical,
    /// A prediction above the threshold is class 1.
    Binary { threshold: f32 },
}

/// The weighted fraction of examples predicted right (Keras' `accuracy` family).
#[derive(Debug, Clone)]
pub struct Accuracy {
    name: String,
    kind: AccuracyKind,
}

impl Accuracy {
    /// Integer labels `[batch]` against the arg-max of predictions `[batch, classes]`
    /// (Keras' `SparseCategoricalAccuracy`, logged as `accuracy`).
    pub fn sparse_categorical() -> Self {
        Self {
            name: "accuracy".into(),
            kind: AccuracyKind::SparseCategorical,
        }
    }

    /// One-hot labels against predictions, both `[batch, classes]` (Keras'
    /// `CategoricalAccuracy`).
    pub fn categorical() -> Self {
        Self {
            name: "accuracy".into(),
            kind: AccuracyKind::Categorical,
        }
    }

    /// Labels in `{0, 1}` against predictions above `threshold` (Keras' `BinaryAccuracy`;
    /// use 0.5 for probabilities, 0 for logits).
    pub fn binary(threshold: f32) -> Self {
        Self {
            name: "accuracy".into(),
            kind: AccuracyKind::Binary { threshold },
        }
    }

    /// The same metric under another name in logs.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
}

impl Metric for Accuracy {
    fn name(&self) -> &str {
        &self.name
    }
    fn state_len(&self) -> usize {
        2
    }
    fn batch_state(
        &self,
        labels: &Tensor,
        predictions: &Tensor,
        weights: &[f32],
    ) -> Result<Vec<f64>, NnError> {
        let correct: Vec<f32> = match self.kind {
            AccuracyKind::SparseCategorical => {
                let predicted = argmax_rows(&self.name, predictions)?;
                let labels = labels_as_classes(&self.name, labels, predicted.len())?;
                predicted
                    .iter()
                    .zip(&labels)
                    .map(|(p, l)| f32::from(u8::from(p == l)))
                    .collect()
            }
            AccuracyKind::Categorical => {
                let predicted = argmax_rows(&self.name, predictions)?;
                let labels = argmax_rows(&self.name, labels)?;
                check_len(&self.name, labels.len(), predicted.len())?;
                predicted
                    .iter()
                    .zip(&labels)
                    .map(|(p, l)| f32::from(u8::from(p == l)))
                    .collect()
            }
            AccuracyKind::Binary { threshold } => {
                let (p, l) = binary_pairs(&self.name, labels, predictions)?;
                p.iter()
                    .zip(&l)
                    .map(|(p, l)| f32::from(u8::from((*p > threshold) == (*l > 0.5))))
                    .collect()
            }
        };
        let per_example = per_example_of(&self.name, &correct, weights.len())?;
        Ok(weighted_ratio(per_example.into_iter(), weights))
    }
    fn result(&self, state: &[f64]) -> f64 {
        ratio(state[0], state[1])
    }
}

/// Whether the label is among the `k` highest predictions (Keras'
/// `SparseTopKCategoricalAccuracy`; ties are broken toward the label).
#[derive(Debug, Clone)]
pub struct TopKAccuracy {
    name: String,
    k: usize,
}

impl TopKAccuracy {
    /// Integer labels `[batch]` against predictions `[batch, classes]`, logged as
    /// `top_<k>_accuracy`.
    pub fn sparse(k: usize) -> Self {
        Self {
            name: format!("top_{k}_accuracy"),
            k,
        }
    }
}

impl Metric for TopKAccuracy {
    fn name(&self) -> &str {
        &self.name
    }
    fn state_len(&self) -> usize {
        2
    }
    fn batch_state(
        &self,
        labels: &Tensor,
        predictions: &Tensor,
        weights: &[f32],
    ) -> Result<Vec<f64>, NnError> {
        let rows = rows_f32(&self.name, predictions)?;
        let labels = labels_as_classes(&self.name, labels, rows.len())?;
        let hits: Vec<f32> = rows
            .iter()
            .zip(&labels)
            .map(|(row, &label)| {
                let own = row.get(label).copied().unwrap_or(f32::NEG_INFINITY);
                let above = row.iter().filter(|&&v| v > own).count();
                f32::from(u8::from(above < self.k))
            })
            .collect();
        check_len(&self.name, hits.len(), weights.len())?;
        Ok(weighted_ratio(hits.into_iter(), weights))
    }
    fn result(&self, state: &[f64]) -> f64 {
        ratio(state[0], state[1])
    }
}

/// Of the examples predicted positive (above the threshold), the weighted fraction that are
/// (Keras' `Precision`); labels in `{0, 1}`.
#[derive(Debug, Clone)]
pub struct Precision {
    threshold: f32,
}

impl Precision {
    /// Precision at `threshold` (0.5 for probabilities, 0 for logits).
    pub fn new(threshold: f32) -> Self {
        Self { threshold }
    }
}

impl Metric for Precision {
    fn name(&self) -> &str {
        "precision"
    }
    fn state_len(&self) -> usize {
        2
    }
    fn batch_state(
        &self,
        labels: &Tensor,
        predictions: &Tensor,
        weights: &[f32],
    ) -> Result<Vec<f64>, NnError> {
        let (p, l) = binary_pairs(self.name(), labels, predictions)?;
        check_len(self.name(), p.len(), weights.len())?;
        let (mut tp, mut fp) = (0.0, 0.0);
        for ((p, l), w) in p.iter().zip(&l).zip(weights) {
            if *p > self.threshold {
                if *l > 0.5 {
                    tp += f64::from(*w);
                } else {
                    fp += f64::from(*w);
                }
            }
        }
        Ok(vec![tp, tp + fp])
    }
    fn result(&self, state: &[f64]) -> f64 {
        ratio(state[0], state[1])
    }
}

/// Of the positive examples, the weighted fraction predicted positive (Keras' `Recall`).
#[derive(Debug, Clone)]
pub struct Recall {
    threshold: f32,
}

impl Recall {
    /// Recall at `threshold` (0.5 for probabilities, 0 for logits).
    pub fn new(threshold: f32) -> Self {
        Self { threshold }
    }
}

impl Metric for Recall {
    fn name(&self) -> &str {
        "recall"
    }
    fn state_len(&self) -> usize {
        2
    }
    fn batch_state(
        &self,
        labels: &Tensor,
        predictions: &Tensor,
        weights: &[f32],
    ) -> Result<Vec<f64>, NnError> {
        let (p, l) = binary_pairs(self.name(), labels, predictions)?;
        check_len(self.name(), p.len(), weights.len())?;
        let (mut tp, mut positives) = (0.0, 0.0);
        for ((p, l), w) in p.iter().zip(&l).zip(weights) {
            if *l > 0.5 {
                positives += f64::from(*w);
                if *p > self.threshold {
                    tp += f64::from(*w);
                }
            }
        }
        Ok(vec![tp, positives])
    }
    fn result(&self, state: &[f64]) -> f64 {
        ratio(state[0], state[1])
    }
}

/// The area under the ROC curve (Keras' `AUC`): confusion counts at evenly spaced thresholds
/// in `[0, 1]`, summed over batches, and the curve integrated with the trapezoid rule. Labels
/// in `{0, 1}`; predictions are probabilities, or logits with [`Auc::from_logits`].
#[derive(Debug, Clone)]
pub struct Auc {
    thresholds: Vec<f32>,
    from_logits: bool,
}

impl Auc {
    /// Keras' default: 200 thresholds.
    pub fn new() -> Self {
        Self::with_thresholds(200)
    }

    /// `num_thresholds` thresholds (at least 3): `0 - ε`, `i / (n - 1)`, `1 + ε`.
    pub fn with_thresholds(num_thresholds: usize) -> Self {
        let n = num_thresholds.max(3);
        let mut thresholds: Vec<f32> = (0..n).map(|i| i as f32 / (n - 1) as f32).collect();
        thresholds[0] = -1e-7;
        thresholds[n - 1] = 1.0 + 1e-7;
        Self {
            thresholds,
            from_logits: false,
        }
    }

    /// Predictions are logits (a sigmoid is applied first).
    pub fn from_logits(mut self) -> Self {
        self.from_logits = true;
        self
    }
}

impl Default for Auc {
    fn default() -> Self {
        Self::new()
    }
}

impl Metric for Auc {
    fn name(&self) -> &str {
        "auc"
    }
    /// True and false positives, then all positives and negatives, per threshold.
    fn state_len(&self) -> usize {
        2 * self.thresholds.len() + 2
    }
    fn batch_state(
        &self,
        labels: &Tensor,
        predictions: &Tensor,
        weights: &[f32],
    ) -> Result<Vec<f64>, NnError> {
        let (p, l) = binary_pairs(self.name(), labels, predictions)?;
        check_len(self.name(), p.len(), weights.len())?;
        let n = self.thresholds.len();
        // Per threshold bucket: weight of examples whose prediction is above exactly the
        // thresholds below the bucket; summed from the top for "above threshold i".
        let mut pos_at = vec![0.0f64; n + 1];
        let mut neg_at = vec![0.0f64; n + 1];
        let (mut positives, mut negatives) = (0.0, 0.0);
        for ((p, l), w) in p.iter().zip(&l).zip(weights) {
            let p = if self.from_logits {
                1.0 / (1.0 + (-p).exp())
            } else {
                *p
            };
            let above = self.thresholds.partition_point(|&t| p > t);
            let w = f64::from(*w);
            if *l > 0.5 {
                pos_at[above] += w;
                positives += w;
            } else {
                neg_at[above] += w;
                negatives += w;
            }
        }
        let mut state = vec![0.0; self.state_len()];
        let (mut tp, mut fp) = (0.0, 0.0);
        for i in (0..n).rev() {
            tp += pos_at[i + 1];
            fp += neg_at[i + 1];
            state[i] = tp;
            state[n + i] = fp;
        }
        state[2 * n] = positives;
        state[2 * n + 1] = negatives;
        Ok(state)
    }
    fn result(&self, state: &[f64]) -> f64 {
        let n = self.thresholds.len();
        let (positives, negatives) = (state[2 * n], state[2 * n + 1]);
        if positives <= 0.0 || negatives <= 0.0 {
            return f64::NAN;
        }
        let tpr = |i: usize| state[i] / positives;
        let fpr = |i: usize| state[n + i] / negatives;
        (0..n - 1)
            .map(|i| (fpr(i) - fpr(i + 1)) * (tpr(i) + tpr(i + 1)) / 2.0)
            .sum()
    }
}

/// The exponential of the mean cross-entropy per token of a sequence model (Keras-NLP's
/// `Perplexity(from_logits=True)`): logits `[batch, positions, vocabulary]` against integer
/// labels `[batch, positions]`; an example's weight weighs each of its tokens.
#[derive(Debug, Clone, Default)]
pub struct Perplexity;

impl Metric for Perplexity {
    fn name(&self) -> &str {
        "perplexity"
    }
    fn state_len(&self) -> usize {
        2
    }
    fn batch_state(
        &self,
        labels: &Tensor,
        predictions: &Tensor,
        weights: &[f32],
    ) -> Result<Vec<f64>, NnError> {
        let (batch, positions, vocabulary) = predictions.dims3().map_err(|_| NnError::Config {
            layer: "perplexity".into(),
            reason: format!(
                "predictions of shape {:?}: perplexity needs [batch, positions, vocabulary]",
                predictions.dims()
            ),
        })?;
        check_len("perplexity", weights.len(), batch)?;
        let flat = predictions.reshape((batch * positions, vocabulary))?;
        let labels = labels
            .reshape(batch * positions)
            .map_err(|_| NnError::Config {
                layer: "perplexity".into(),
                reason: format!(
                    "labels of shape {:?} for predictions {:?}: one label per position",
                    labels.dims(),
                    predictions.dims()
                ),
            })?;
        let per_token = crate::nn::losses::sparse_softmax_cross_entropy(&flat, &labels)?;
        let per_example = flat_f32(per_token.reshape((batch, positions))?.sum(1)?)?;
        let (mut sum, mut tokens) = (0.0, 0.0);
        for (loss, w) in per_example.iter().zip(weights) {
            sum += f64::from(*loss) * f64::from(*w);
            tokens += positions as f64 * f64::from(*w);
        }
        Ok(vec![sum, tokens])
    }
    fn result(&self, state: &[f64]) -> f64 {
        ratio(state[0], state[1]).exp()
    }
}

fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator == 0.0 {
        f64::NAN
    } else {
        numerator / denominator
    }
}

fn weighted_ratio(values: impl Iterator<Item = f32>, weights: &[f32]) -> Vec<f64> {
    let mut sum = 0.0;
    for (v, w) in values.zip(weights) {
        sum += f64::from(v) * f64::from(*w);
    }
    vec![sum, weights.iter().map(|&w| f64::from(w)).sum()]
}

fn check_len(metric: &str, got: usize, batch: usize) -> Result<(), NnError> {
    if got != batch {
        return Err(NnError::Config {
            layer: metric.to_owned(),
            reason: format!("the metric got {got} values for a batch of {batch} examples"),
        });
    }
    Ok(())
}

fn per_example_of(metric: &str, values: &[f32], batch: usize) -> Result<Vec<f32>, NnError> {
    check_len(metric, values.len(), batch)?;
    Ok(values.to_vec())
}

fn flat_f32(t: Tensor) -> Result<Vec<f32>, NnError> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

/// Predictions `[batch, classes]` as rows.
fn rows_f32(metric: &str, predictions: &Tensor) -> Result<Vec<Vec<f32>>, NnError> {
    if predictions.rank() != 2 {
        return Err(NnError::Config {
            layer: metric.to_owned(),
            reason: format!(
                "predictions of shape {:?}: this metric needs [batch, classes]",
                predictions.dims()
            ),
        });
    }
    Ok(predictions.to_dtype(DType::F32)?.to_vec2::<f32>()?)
}

fn argmax_rows(metric: &str, t: &Tensor) -> Result<Vec<usize>, NnError> {
    Ok(rows_f32(metric, t)?
        .iter()
        .map(|row| {
            row.iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
                    if v > best.1 {
                        (i, v)
                    } else {
                        best
                    }
                })
                .0
        })
        .collect())
}

fn labels_as_classes(metric: &str, labels: &Tensor, batch: usize) -> Result<Vec<usize>, NnError> {
    let values = flat_f32(labels.clone())?;
    check_len(metric, values.len(), batch)?;
    Ok(values
        .iter()
        .map(|&v| if v >= 0.0 { v as usize } else { usize::MAX })
        .collect())
}

/// Flat predictions and labels of a binary metric, one per example (shapes `[batch]` or
/// `[batch, 1]`, the same count).
fn binary_pairs(
    metric: &str,
    labels: &Tensor,
    predictions: &Tensor,
) -> Result<(Vec<f32>, Vec<f32>), NnError> {
    let p = flat_f32(predictions.clone())?;
    let l = flat_f32(labels.clone())?;
    if p.len() != l.len() {
        return Err(NnError::Config {
            layer: metric.to_owned(),
            reason: format!(
                "predictions {:?} and labels {:?} differ in size: a binary metric needs one prediction per label",
                predictions.dims(),
                labels.dims()
            ),
        });
    }
    Ok((p, l))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t1(v: &[f32]) -> Tensor {
        Tensor::new(v, &Device::Cpu).unwrap()
    }

    #[test]
    fn accuracy_top_k_precision_recall_count_weighted_examples() {
        let logits = Tensor::new(
            &[[0.1f32, 0.7, 0.2], [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]],
            &Device::Cpu,
        )
        .unwrap();
        let labels = t1(&[1., 1., 0.]);
        let w = [1.0, 1.0, 2.0];
        let acc = Accuracy::sparse_categorical();
        let s = acc.batch_state(&labels, &logits, &w).unwrap();
        assert_eq!(acc.result(&s), 0.25);
        let top2 = TopKAccuracy::sparse(2);
        let s = top2.batch_state(&labels, &logits, &w).unwrap();
        assert_eq!(top2.result(&s), 0.5);
        let p = t1(&[0.9, 0.8, 0.2, 0.6]);
        let l = t1(&[1., 0., 1., 1.]);
        let ones = [1.0; 4];
        let precision = Precision::new(0.5);
        assert!(
            (precision.result(&precision.batch_state(&l, &p, &ones).unwrap()) - 2.0 / 3.0).abs()
                < 1e-12
        );
        let recall = Recall::new(0.5);
        assert!(
            (recall.result(&recall.batch_state(&l, &p, &ones).unwrap()) - 2.0 / 3.0).abs() < 1e-12
        );
    }

    #[test]
    fn perplexity_of_uniform_logits_is_the_vocabulary() {
        let logits = Tensor::zeros((2, 3, 5), DType::F32, &Device::Cpu).unwrap();
        let labels = Tensor::zeros((2, 3), DType::U32, &Device::Cpu).unwrap();
        let s = Perplexity
            .batch_state(&labels, &logits, &[1.0, 1.0])
            .unwrap();
        assert!((Perplexity.result(&s) - 5.0).abs() < 1e-4);
        assert!(Perplexity
            .batch_state(&labels, &logits.flatten_from(1).unwrap(), &[1.0, 1.0])
            .is_err());
    }

    #[test]
    fn auc_of_a_perfect_and_a_random_ranking() {
        let auc = Auc::new();
        let l = t1(&[0., 0., 1., 1.]);
        let perfect = auc
            .batch_state(&l, &t1(&[0.1, 0.2, 0.8, 0.9]), &[1.0; 4])
            .unwrap();
        assert!((auc.result(&perfect) - 1.0).abs() < 1e-9);
        let inverted = auc
            .batch_state(&l, &t1(&[0.9, 0.8, 0.2, 0.1]), &[1.0; 4])
            .unwrap();
        assert!(auc.result(&inverted).abs() < 1e-9);
        // Two batches add: the statistics of the halves sum to those of the whole.
        let a = auc
            .batch_state(&t1(&[0., 1.]), &t1(&[0.3, 0.6]), &[1.0; 2])
            .unwrap();
        let b = auc
            .batch_state(&t1(&[1., 0.]), &t1(&[0.4, 0.7]), &[1.0; 2])
            .unwrap();
        let whole = auc
            .batch_state(
                &t1(&[0., 1., 1., 0.]),
                &t1(&[0.3, 0.6, 0.4, 0.7]),
                &[1.0; 4],
            )
            .unwrap();
        let sum: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(sum, whole);
        assert!((auc.result(&whole) - 0.5).abs() < 1e-9);
    }
}
