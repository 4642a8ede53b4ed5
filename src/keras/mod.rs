//! A model with Keras' shape over any candle-nn network: [`Model::compile`] with an optimizer,
//! a [`Loss`] and [`metrics`]; [`Model::fit`] with epochs, steps per epoch, validation data and
//! [`callbacks`]; [`Model::evaluate`], [`Model::predict`], [`Model::save`] and
//! [`Model::load`]. The same code trains under the default strategy, `OneDevice`, `Mirrored`,
//! `CentralStorage` and `MultiWorkerMirrored`; under ParameterServerStrategy, [`PsFit`] runs
//! `fit` from the chief's coordinator.
//!
//! ```
//! use cohort::candle::{Device, Module, Tensor};
//! use cohort::candle_nn::{linear, Linear};
//! use cohort::data::Dataset;
//! use cohort::keras::{metrics, Fit, Loss, Model};
//! use cohort::optim::Optimizer;
//! use cohort::strategy::Mirrored;
//!
//! // y = 2x - 1 on 64 points, batches of 16 split over 2 replicas.
//! let x: Vec<f32> = (0..64).map(|i| i as f32 / 64.0).collect();
//! let y: Vec<f32> = x.iter().map(|v| 2.0 * v - 1.0).collect();
//! let cpu = &Device::Cpu;
//! let data = Dataset::from_tensor_slices(vec![
//!     Tensor::from_vec(x, (64, 1), cpu)?,
//!     Tensor::from_vec(y, (64, 1), cpu)?,
//! ])?
//! .batch(16, true);
//!
//! let mut model = Model::new(Mirrored::new(2)?, 7, |vb| linear(1, 1, vb.pp("out")))?;
//! model.compile(
//!     Optimizer::sgd(0.5),
//!     Loss::mean_squared_error(),
//!     vec![Box::new(metrics::Mean::absolute_error())],
//! );
//! let history = model.fit(&data, Fit::epochs(20).verbose(false))?;
//! let losses = history.get("loss");
//! assert!(losses[19] < losses[0] / 10.0);
//! let logs = model.evaluate(&data)?;
//! assert!(logs.get("mae").unwrap() < 0.1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! This module owns Keras' training surface and nothing below it: the step is
//! [`crate::train::ReplicatedModel`]'s, the update [`crate::train::DistributedOptimizer`]'s,
//! re-forming a group after a lost worker `MultiWorkerMirrored`'s, and backups
//! [`crate::train::StateCheckpoints`]'.

pub mod callbacks;
mod error;
mod fit;
mod fit_loop;
mod logs;
mod loss;
pub mod metrics;
mod model;
mod ps;
mod save;

pub use error::{KerasError, Misuse};
pub use fit::{Fit, History};
pub use logs::Logs;
pub use loss::Loss;
pub use model::{Model, ModelStrategy};
pub use ps::PsFit;
