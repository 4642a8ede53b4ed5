//! `Model::fit` on a small separable problem: the loss history decreases epoch after epoch,
//! and the progress is one line per epoch when the output is not a terminal (a bar when it
//! is), as Keras 3 prints it.

use std::io::Write;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use cohort::candle::{Device, Tensor};
use cohort::data::Dataset;
use cohort::keras::callbacks::{ChaosPoint, ProgbarLogger};
use cohort::keras::{Fit, History, Loss, Model};
use cohort::nn::{dense, Activation};
use cohort::optim::Optimizer;
use cohort::strategy::Mirrored;
use cohort::train::{DistributedOptimizer, Progbar, ProgbarMode, BAR_WIDTH};

/// A writer the test can read back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// 43 points in the plane, labelled by the sign of x0 + x1 (linearly separable), in global
/// batches of 10 with a short last batch of 3: 5 steps per epoch.
fn separable() -> Result<Dataset> {
    separable_of(43)
}

fn separable_of(n: usize) -> Result<Dataset> {
    let mut x = Vec::with_capacity(n * 2);
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        let a = ((i * 17) % 19) as f32 / 9.5 - 1.0;
        let b = ((i * 7) % 13) as f32 / 6.5 - 1.0;
        x.extend([a, b]);
        y.push(if a + b > 0.0 { 1f32 } else { 0.0 });
    }
    let cpu = &Device::Cpu;
    Ok(Dataset::from_tensor_slices(vec![
        Tensor::from_vec(x, (n, 2), cpu)?,
        Tensor::from_vec(y, (n, 1), cpu)?,
    ])?
    .batch(10, false))
}

fn run(mode: ProgbarMode, is_terminal: bool, epochs: usize) -> Result<(History, String)> {
    run_on(separable()?, mode, is_terminal, epochs)
}

/// One `Dense` layer (logits) under `Mirrored(2)`, compiled with SGD and binary
/// cross-entropy.
fn classifier() -> Result<Model<cohort::nn::Dense>> {
    let mut model = Model::new(Mirrored::new(2)?, 3, |vb| {
        dense(2, 1, Activation::Linear, vb.pp("classifier"))
    })?;
    model.compile(
        DistributedOptimizer::new(Optimizer::sgd(0.5)),
        Loss::binary_crossentropy(),
        Vec::new(),
    );
    Ok(model)
}

/// `Model::fit` of the [`classifier`] on `data`, its progress written where the test reads it.
fn run_on(
    data: Dataset,
    mode: ProgbarMode,
    is_terminal: bool,
    epochs: usize,
) -> Result<(History, String)> {
    let mut model = classifier()?;
    let captured = Captured::default();
    let bar = Progbar::to_writer(Box::new(captured.clone()), mode, is_terminal);
    let history = model.fit(
        &data,
        Fit::epochs(epochs)
            .verbose(false)
            .callback(ProgbarLogger::new(bar)),
    )?;
    Ok((history, captured.text()))
}

#[test]
fn fit_returns_a_decreasing_loss_history() -> Result<()> {
    let (history, _) = run(ProgbarMode::Silent, false, 5)?;
    let loss = history.get("loss");
    assert_eq!(loss.len(), 5);
    assert_eq!(history.step, 25);
    for pair in loss.windows(2) {
        assert!(pair[1] < pair[0], "loss did not fall: {:?}", loss);
    }
    assert!(loss[4] < 0.6 * loss[0], "{:?}", loss);
    Ok(())
}

#[test]
fn fit_prints_one_line_per_epoch_when_not_on_a_terminal() -> Result<()> {
    let (history, text) = run(ProgbarMode::Auto, false, 3)?;
    let loss = history.get("loss");
    let lines: Vec<&str> = text.lines().collect();
    // Keras 3, verbose=2: `Epoch 1/3`, then `5/5 - 0s - 12ms/step - loss: 0.6931`.
    assert_eq!(lines.len(), 6, "{text:?}");
    assert!(!text.contains('\r'), "no redraws off a terminal: {text:?}");
    for (k, pair) in lines.chunks(2).enumerate() {
        assert_eq!(pair[0], format!("Epoch {}/3", k + 1), "{text:?}");
        let line = pair[1];
        let rest = line
            .strip_prefix("5/5 - ")
            .unwrap_or_else(|| panic!("{line:?}: no step count"));
        let (secs, rest) = rest.split_once("s - ").expect("elapsed seconds");
        secs.parse::<u64>()
            .unwrap_or_else(|e| panic!("{line:?}: seconds {secs:?}: {e}"));
        let (per_step, printed) = rest.split_once("/step - loss: ").expect("time per step");
        let number = per_step.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        assert!(
            number.parse::<u64>().is_ok() && ["s", "ms", "us"].contains(&&per_step[number.len()..]),
            "{line:?}: time per step {per_step:?}"
        );
        // The epoch's loss first, then the other logs (the learning rate).
        let first = printed.split(" - ").next().unwrap_or_default();
        assert_eq!(first, format!("{:.4}", loss[k]), "{line:?}");
    }
    Ok(())
}

#[test]
fn fit_draws_a_bar_on_a_terminal() -> Result<()> {
    let (history, text) = run(ProgbarMode::Auto, true, 2)?;
    let loss = history.get("loss");
    assert!(text.starts_with("Epoch 1/2\n"), "{text:?}");
    assert!(text.contains("Epoch 2/2\n"), "{text:?}");
    assert!(text.contains('\r'), "bar is redrawn in place: {text:?}");
    // Each epoch ends as a full bar with its loss.
    let full = format!("5/5 {} ", "━".repeat(BAR_WIDTH));
    assert!(text.matches(&full).count() >= 2, "{text:?}");
    assert!(
        text.contains(&format!("/step - loss: {:.4}", loss[1])),
        "{text:?}"
    );
    Ok(())
}

#[test]
fn fit_handles_a_replica_with_an_empty_last_batch() -> Result<()> {
    // 41 examples: the last global batch of 1 gives replica 1 an empty batch.
    let (history, _) = run_on(separable_of(41)?, ProgbarMode::Silent, false, 3)?;
    let loss = history.get("loss");
    assert_eq!(history.step, 15);
    assert!(loss.iter().all(|l| l.is_finite()), "{:?}", loss);
    assert!(loss[2] < loss[0], "{:?}", loss);
    Ok(())
}

/// `ChaosPoint` prints the launcher's chaos marker once, at the end of the epoch it names,
/// with the step reached (what `launch --kill-*-after` acts on).
#[test]
fn a_chaos_point_marks_the_end_of_its_epoch_once() -> Result<()> {
    let mut model = classifier()?;
    let captured = Captured::default();
    model.fit(
        &separable()?,
        Fit::epochs(3)
            .verbose(false)
            .callback(ChaosPoint::after_epoch(2).to_writer(Box::new(captured.clone()))),
    )?;
    assert_eq!(captured.text(), "[chaos-point] after epoch 2 (step 10)\n");
    Ok(())
}
