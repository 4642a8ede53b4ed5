//! The smallest parameter-server program: one variable, one typed step, a chief loop.
//!
//! Run it as a local cluster (a chief, one parameter server, two workers, each a process):
//!
//!     cargo run --release --example quickstart -- launch --workers 2 --ps 1

use cohort::program::{Program, Step, StepContext, StepError, VariableSpec};

/// The step: takes the target value, returns the squared distance it saw before its update.
static TRAIN_STEP: Step<f32, f32> = Step::new("train_step");

fn main() {
    let program = Program::new("quickstart")
        .optimizer(cohort::optim::Optimizer::sgd(0.1))
        .step(&TRAIN_STEP, |ctx: &mut StepContext<'_>, target: f32| {
            // Gathered from the parameter servers.
            let w = ctx.pull("w")?;
            let grad: Vec<f32> = w.iter().map(|v| 2.0 * (v - target)).collect();
            // Sent once per parameter server when the step succeeds (PS-1).
            ctx.push_dense("w", grad)?;
            Ok::<_, StepError>(w.iter().map(|v| (v - target).powi(2)).sum())
        })
        .chief(|coordinator| {
            coordinator.create_variable(VariableSpec::zeros("w", vec![4]))?;
            let first = coordinator.schedule(&TRAIN_STEP, 1.0)?;
            for _ in 1..100 {
                coordinator.schedule(&TRAIN_STEP, 1.0)?;
            }
            coordinator.join()?;
            println!(
                "first loss {} (w was zeros); w = {:?} (the target is 1.0 everywhere)",
                coordinator.fetch(&first)?,
                coordinator.read_variable("w")?
            );
            Ok(())
        });
    std::process::exit(cohort::program::main(program));
}
