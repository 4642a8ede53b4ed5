//! A user program: the functions every process of a job registers by name.
//!
//! As in TensorFlow, the same program runs in every process; the chief schedules a step by its
//! handle ([`Step`]) with a typed argument, and the worker that runs it looks the step up here
//! and sends back its typed value. Code never travels over the network: only the argument and
//! the value do.
//!
//! ```no_run
//! use cohort::program::{Program, Step, StepContext, StepError};
//!
//! /// Takes a learning-rate scale, returns the squared norm of `w` before the update.
//! static TRAIN_STEP: Step<f32, f32> = Step::new("train_step");
//!
//! let program = Program::new("my-job")
//!     .step(&TRAIN_STEP, |ctx: &mut StepContext<'_>, scale: f32| {
//!         let w = ctx.pull("w")?;
//!         let grad: Vec<f32> = w.iter().map(|v| 2.0 * v * scale).collect();
//!         ctx.push_dense("w", grad)?;
//!         Ok::<_, StepError>(w.iter().map(|v| v * v).sum())
//!     })
//!     .chief(|coordinator| {
//!         coordinator.create_variable(cohort::program::VariableSpec::zeros("w", vec![4]))?;
//!         let values: Vec<_> = (0..10)
//!             .map(|_| coordinator.schedule(&TRAIN_STEP, 1.0))
//!             .collect::<Result<_, _>>()?;
//!         for value in &values {
//!             let norm: f32 = coordinator.fetch(value)?;
//!             println!("{norm}");
//!         }
//!         Ok(())
//!     });
//! std::process::exit(cohort::program::main(program));
//! ```

use crate::process::stdout::outln;
use std::sync::Arc;

pub use crate::bootstrap::{multi_worker_main, MultiWorkerTask, COMMUNICATION_ENV};
pub use crate::roles::coordinator::{
    CheckpointError, ClusterCoordinator, CoordinatorError, CreateError, Encoded, PendingSave,
    RemoteValue, SavedInBackground, VariableProblem, VariableSpec, PROGRAM_STATE_KEY,
};
pub use crate::roles::eval_fn::{CheckpointVariables, EvalError, Metrics};
pub use crate::roles::parameter_server_strategy::{ParameterServerStrategy, PerWorkerDataset};
pub use crate::roles::registry::{
    ChiefFn, DatasetFn, EvalFn, Program, PsSettingsError, StepFn, WorkerFunctions,
};
pub use crate::roles::server_model::{
    PushedGradient, RowRead, ServerModel, TrainReport, WeightAccess,
};
pub use crate::roles::step::{
    DatasetHandle, ElementError, FromElement, Step, ValueCodecError, WorkerData,
};
pub use crate::roles::worker::{PsFailure, StepContext, StepError};

/// Runs `program` in this process and returns the exit code (DESIGN §7: 0 success, 1 training
/// error, 2 bad config or usage, 143 after a stop request/preemption). A role process is
/// crash-only: a panic outside the program's own functions ends it at once with
/// [`crate::process::PANIC_EXIT_CODE`] (170), and its supervisor restarts it.
///
/// - `launch --workers N --ps M` as arguments: starts a local cluster of this same program
///   (one process per task, supervised) and returns when the chief exits;
/// - otherwise the process runs its role. Its configuration comes from the flags
///   `--task-type`, `--task-index`, `--cluster-file`, `--config`, `--certs-dir`,
///   `--incarnation`, `--detection-budget`, `--worker-wait`, `--step-timeout`,
///   `--checkpoint-dir`, `--preemption-grace`, `--eval-idle-timeout`, `--eval-until-step`,
///   `--workers-max`, `--warm-start`, `--warm-start-map`, `--metrics-addr`, `--supervisor-socket`,
///   `--replicas` (taken out of the arguments; the others are left
///   to the program),
///   else the environment (`COHORT_TASK_TYPE`, …, `COHORT_CERTS`), else `TF_CONFIG` (as set by
///   `launch` or by the cluster manager), else `cohort.toml`; see [`crate::cluster::ConfigKey`].
///   A bad value anywhere refuses to start with exit code 2 and a message naming the key.
///
/// `--help` (`-h`) and `--version` (`-V`) print the program's usage (every configuration
/// flag, and `launch`) or its name and cohort's version, and return 0; arguments after `--`
/// are the program's own and are not looked at.
///
/// On SIGTERM the chief's program sees `ClusterCoordinator::preemption_requested()` become
/// true: it should save a checkpoint and return; the process then exits 143.
pub fn main(program: Program) -> i32 {
    // First, before any thread starts (it sets the environment).
    crate::process::follow_cpu_quota();
    if let Err(e) = crate::bootstrap::init_logging() {
        // No subscriber to report through.
        eprintln!("error: bad config: {e}");
        return 2;
    }
    let mut args = Vec::new();
    for arg in std::env::args_os().skip(1) {
        match arg.into_string() {
            Ok(arg) => args.push(arg),
            Err(bad) => {
                tracing::error!("argument {bad:?} is not valid UTF-8");
                return 2;
            }
        }
    }
    if args.first().map(String::as_str) == Some("launch") {
        return crate::bootstrap::launch_from_args(&args[1..], Vec::new());
    }
    if let Some(answer) = help_or_version(&program, &args) {
        outln!("{answer}");
        return 0;
    }
    run_role_with_args(program, &args)
}

/// Runs this process's role of `program`, its configuration flags taken out of `args` (the
/// others are left to the program; see [`main`] for the flags and the layers under them), and
/// returns the exit code. For a host that makes the process a role itself (cohort's Python
/// package: the script's own arguments): no `launch`, no `--help`. A bad flag is exit code 2,
/// named in the log.
pub fn run_role_with_args(program: Program, args: &[String]) -> i32 {
    if let Err(e) = crate::bootstrap::init_logging() {
        // No subscriber to report through.
        eprintln!("error: bad config: {e}");
        return 2;
    }
    match crate::cluster::ConfigFlags::extract(args) {
        Ok((flags, _program_args)) => crate::bootstrap::run_role(Arc::new(program), &flags),
        Err(e) => {
            tracing::error!("bad config: {e}");
            2
        }
    }
}

/// What `--help` or `--version` among `args` (before any `--`) prints, if either is there.
fn help_or_version(program: &Program, args: &[String]) -> Option<String> {
    use clap::{Args, CommandFactory};
    let ours = args.iter().take_while(|a| a.as_str() != "--");
    let mut asked = None;
    for arg in ours {
        match arg.as_str() {
            "--help" | "-h" => {
                asked = Some(true);
                break;
            }
            "--version" | "-V" => asked = asked.or(Some(false)),
            _ => {}
        }
    }
    let version = format!("{} (cohort {})", program.name(), env!("CARGO_PKG_VERSION"));
    if !asked? {
        return Some(version);
    }
    let name = program.name().to_string();
    let launch = crate::bootstrap::LaunchArgs::command()
        .name("launch")
        .render_help()
        .to_string();
    let mut command = crate::cluster::ConfigFlags::augment_args(clap::Command::new("program"))
        .bin_name(name.clone())
        .version(env!("CARGO_PKG_VERSION"))
        .about(format!(
            "{version}: one process of a cohort job. With no flags its role comes from the \
             environment (COHORT_TASK_TYPE, ...), TF_CONFIG or cohort.toml; `{name} launch` \
             starts a local cluster of this program. Exit codes: 0 done, 1 training error, 2 \
             bad config, 143 stopped, 170-173 restart me."
        ))
        .override_usage(format!(
            "{name} [FLAGS] [-- PROGRAM ARGS]\n       {name} launch [LAUNCH FLAGS]"
        ));
    let help = command.render_help().to_string();
    Some(format!("{help}\n`{name} launch`:\n{launch}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn help_lists_every_configuration_flag_and_launch_and_version_names_the_program() {
        let program = Program::new("my-job");
        let help = help_or_version(&program, &args(&["--help"])).unwrap();
        for key in crate::cluster::ConfigKey::ALL {
            assert!(
                help.contains(key.flag),
                "{} missing from:\n{help}",
                key.flag
            );
        }
        assert!(help.contains("my-job launch"), "{help}");
        assert!(help.contains("--workers"), "launch's flags: {help}");
        let version = help_or_version(&program, &args(&["-V"])).unwrap();
        assert_eq!(
            version,
            format!("my-job (cohort {})", env!("CARGO_PKG_VERSION"))
        );
        // Neither: the role runs; after `--` the arguments are the program's own.
        assert_eq!(
            help_or_version(&program, &args(&["--task-type", "ps"])),
            None
        );
        assert_eq!(help_or_version(&program, &args(&["--", "--help"])), None);
    }
}
