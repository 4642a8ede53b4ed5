//! Bad input to parameter-server training, across real processes: each gives a clear error or
//! the policy's outcome, never a panic.
//!
//! - A role process with a malformed `TF_CONFIG`, a cluster with no parameter server, duplicate
//!   addresses, or a task that is not in its cluster exits with code 2 and a message naming the
//!   key, before it opens any socket; so does every role of a program whose name scope for an
//!   optimizer is bad, naming the scope.
//! - A step that pushes a gradient of the wrong shape fails with an error naming the variable,
//!   and nothing changes on any parameter server (the push is all or nothing).
//! - A step that pushes a NaN gradient is skipped and counted by the default policy, and
//!   training goes on.
//! - Typed steps: a struct argument and value round-trip through a worker; a step the program
//!   does not register is refused at `schedule` naming it; an argument that does not decode as
//!   the step's type fails that closure naming the step; a value fetched as another type is
//!   refused; training goes on after each.
//! - A variable whose shape overflows a machine word, or whose values do not fill its shape, is
//!   refused at creation naming it, and training goes on.

mod ps_support;

use ps_support::fit_gradient;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cohort::program::{
    ClusterCoordinator, CoordinatorError, Program, Step, StepContext, StepError, VariableSpec,
};
use cohort::variable::Partitioner;
use ps_support::{ledger_and_stats, write_report, Run, CHILD_ENV};

/// Child mode: run this process's role of the test program.
#[test]
fn cluster_task() {
    ps_support::run_if_child(program);
}

/// A typed step's argument: how many gradient steps to take in it, and a tag it returns.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct FitArgs {
    times: u32,
    tag: String,
}

/// A typed step's value.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct FitReport {
    tag: String,
    worker: u32,
    w_before: Vec<f32>,
}

/// Takes `times` gradient steps on `w` (summed into one push) and reports what it saw.
static FIT_TYPED: Step<FitArgs, FitReport> = Step::new("fit_typed");
/// The same registered step, fetched as another type.
static FIT_MISREAD: Step<FitArgs, u8> = Step::new("fit_typed");
/// Registered nowhere.
static GHOST: Step<(), ()> = Step::new("ghost");

/// `fit_typed` is [`FIT_TYPED`]; `fit` is a good step; `bad_shape` pushes a good row gradient for `table` and a 3-value
/// gradient for the 4-value `w`; `bad_rows` pushes rows of the wrong width; `nan` pushes a
/// gradient with a NaN in it.
fn program() -> Program {
    let program = Program::new("ps-bad-input-test");
    // A name scope the test gives its role process (a bad one), with its own optimizer.
    let program = match std::env::var(SCOPE_ENV) {
        Ok(scope) => program.optimizer_for(scope, cohort::optim::Optimizer::adagrad(0.1)),
        Err(_) => program,
    };
    program
        .optimizer(cohort::optim::Optimizer::sgd(0.1))
        .step_encoded("fit", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            let w = ctx.pull("w")?;
            let grad = fit_gradient(&w);
            ctx.push_dense("w", grad)?;
            ctx.push_rows("table", vec![1, 8], vec![1.0; 4])?;
            Ok(Vec::new())
        })
        .step_encoded("bad_shape", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            ctx.push_rows("table", vec![1, 8], vec![1.0; 4])?;
            ctx.push_dense("w", vec![1.0; 3])?;
            Ok(Vec::new())
        })
        .step_encoded("bad_rows", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            ctx.push_dense("w", vec![1.0; 4])?;
            ctx.push_rows("table", vec![1, 8], vec![1.0; 3])?;
            Ok(Vec::new())
        })
        .step_encoded("nan", |ctx: &mut StepContext<'_>, _args: &[u8]| {
            ctx.push_dense("w", vec![1.0, f32::NAN, 1.0, 1.0])?;
            Ok(Vec::new())
        })
        .step(&FIT_TYPED, |ctx: &mut StepContext<'_>, args: FitArgs| {
            let w_before = ctx.pull("w")?;
            let grad = fit_gradient(&w_before)
                .into_iter()
                .map(|g| g * args.times as f32)
                .collect();
            ctx.push_dense("w", grad)?;
            Ok::<_, StepError>(FitReport {
                tag: args.tag,
                worker: ctx.worker_index(),
                w_before,
            })
        })
        .chief(|coordinator| {
            if ps_support::scenario() == "typed" {
                return typed_steps(coordinator);
            }
            coordinator.create_variable(
                VariableSpec::zeros("w", vec![4])
                    .partitioned(Partitioner::FixedShards { num_shards: 2 }),
            )?;
            coordinator.create_variable(VariableSpec::zeros("table", vec![10, 2]))?;
            coordinator.wait_for_workers(1, Duration::from_secs(30))?;
            let mut report = serde_json::json!({});
            run(coordinator, "fit", 3)?;
            report["start"] = state(coordinator)?;
            report["bad_shape_error"] = error_of(run(coordinator, "bad_shape", 1));
            report["after_bad_shape"] = state(coordinator)?;
            report["bad_rows_error"] = error_of(run(coordinator, "bad_rows", 1));
            report["after_bad_rows"] = state(coordinator)?;
            run(coordinator, "nan", 1)?;
            report["after_nan"] = state(coordinator)?;
            run(coordinator, "fit", 3)?;
            report["end"] = state(coordinator)?;
            write_report(&report)
        })
}

/// The typed-step scenario's chief: every case's outcome into the report.
fn typed_steps(coordinator: &mut ClusterCoordinator) -> Result<(), CoordinatorError> {
    coordinator.create_variable(VariableSpec::zeros("w", vec![4]))?;
    coordinator.create_variable(VariableSpec::zeros("table", vec![10, 2]))?;
    coordinator.wait_for_workers(1, Duration::from_secs(30))?;
    let mut report = serde_json::json!({});
    // A shape whose element count overflows a machine word (with no values, which its
    // wrapped count would have matched), and values that do not fill their shape: each is
    // refused naming the variable, and nothing is created.
    let huge = VariableSpec::from_values("huge", vec![1 << 62, 4], Vec::new())
        .partitioned(Partitioner::FixedShards { num_shards: 2 });
    report["huge_error"] = error_of(coordinator.create_variable(huge).map(|_| ()));
    let short = VariableSpec::from_values("short", vec![2, 3], vec![1.0; 5]);
    report["short_error"] = error_of(coordinator.create_variable(short).map(|_| ()));
    let args = FitArgs {
        times: 2,
        tag: "first".into(),
    };
    let value = coordinator.schedule(&FIT_TYPED, args)?;
    let fetched: FitReport = coordinator.fetch(&value)?;
    report["round_trip"] = serde_json::json!({
        "tag": fetched.tag,
        "worker": fetched.worker,
        "w_before": fetched.w_before,
    });
    report["ghost_error"] = error_of(coordinator.schedule(&GHOST, ()).map(|_| ()));
    // Bytes that are no `FitArgs`: a string length far past the bytes that follow.
    let garbage =
        coordinator.schedule_encoded(FIT_TYPED.name(), vec![0x02, 0xfc, 0xff, 0xff, 0xff, 0x0f])?;
    report["garbage_error"] = error_of(coordinator.fetch_encoded(&garbage).map(|_| ()));
    report["garbage_join"] = error_of(coordinator.join());
    let misread = coordinator.schedule(
        &FIT_MISREAD,
        FitArgs {
            times: 1,
            tag: "misread".into(),
        },
    )?;
    report["misread_error"] = error_of(coordinator.fetch(&misread).map(|_| ()));
    for round in 0..5 {
        coordinator.schedule(
            &FIT_TYPED,
            FitArgs {
                times: 1,
                tag: format!("round {round}"),
            },
        )?;
    }
    coordinator.join()?;
    report["end"] = state(coordinator)?;
    write_report(&report)
}

fn run(coordinator: &ClusterCoordinator, step: &str, times: usize) -> Result<(), CoordinatorError> {
    for _ in 0..times {
        coordinator.schedule_encoded(step, Vec::new())?;
    }
    coordinator.join()
}

/// The error the chief's report holds under `key` (the test fails, showing the report, where
/// it holds none).
fn error_in<'a>(report: &'a serde_json::Value, key: &str) -> &'a str {
    report[key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in {report}"))
}

fn error_of(result: Result<(), CoordinatorError>) -> serde_json::Value {
    match result {
        Ok(()) => serde_json::Value::Null,
        Err(e) => serde_json::json!(e.to_string()),
    }
}

/// The variables (as raw bits), the ledger and every PS's counters.
fn state(coordinator: &ClusterCoordinator) -> Result<serde_json::Value, CoordinatorError> {
    let mut out = ledger_and_stats(coordinator)?;
    for name in ["w", "table"] {
        let bits: Vec<u32> = coordinator
            .read_variable(name)?
            .iter()
            .map(|v| v.to_bits())
            .collect();
        out[name] = serde_json::json!(bits);
    }
    Ok(out)
}

#[test]
fn a_malformed_tf_config_exits_2_naming_the_key() {
    let (code, stderr) = role_process(r#"{"cluster": {"chief": ["127.0.0.1:5000"], "#);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("TF_CONFIG") && stderr.contains("malformed"),
        "{stderr}"
    );

    let tf_config = r#"{"cluster": {"chief": ["127.0.0.1:5000"], "worker": ["127.0.0.1:5001"], "ps": ["127.0.0.1:5002"]},
                       "task": {"type": "boss", "index": 0}}"#;
    let (code, stderr) = role_process(tf_config);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("TF_CONFIG.task.type") && stderr.contains("boss"),
        "{stderr}"
    );

    let tf_config = r#"{"cluster": {"chief": ["127.0.0.1:5000"], "worker": ["127.0.0.1:5001"], "ps": ["127.0.0.1:5002"]},
                       "task": {"type": "worker", "index": 3}}"#;
    let (code, stderr) = role_process(tf_config);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("task") && stderr.contains("worker/3"),
        "{stderr}"
    );

    let tf_config = r#"{"cluster": {"chief": ["127.0.0.1:5000"], "worker": ["nowhere"], "ps": ["127.0.0.1:5002"]},
                       "task": {"type": "chief", "index": 0}}"#;
    let (code, stderr) = role_process(tf_config);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("nowhere"), "{stderr}");
}

#[test]
fn a_cluster_with_no_parameter_server_exits_2_naming_the_ps_job() {
    let tf_config = r#"{"cluster": {"chief": ["127.0.0.1:5000"], "worker": ["127.0.0.1:5001"]},
                       "task": {"type": "chief", "index": 0}}"#;
    let (code, stderr) = role_process(tf_config);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("cluster") && stderr.contains("1 ps task"),
        "{stderr}"
    );
}

/// The name scope a role process's program gives its own optimizer.
const SCOPE_ENV: &str = "COHORT_TEST_OPTIMIZER_SCOPE";

/// A program whose parameter-server settings are bad (here a name scope that ends in a
/// separator) ends every role at its start, the chief and the workers as the servers, with
/// code 2 and the scope named: no role waits for servers that cannot start.
#[test]
fn a_bad_optimizer_scope_exits_every_role_2_naming_it() {
    for task in ["chief", "worker", "ps"] {
        let tf_config = format!(
            r#"{{"cluster": {{"chief": ["127.0.0.1:5000"], "worker": ["127.0.0.1:5001"], "ps": ["127.0.0.1:5002"]}},
                 "task": {{"type": "{task}", "index": 0}}}}"#
        );
        let (code, stderr) = role_process_with(&tf_config, &[(SCOPE_ENV, "embedding/")]);
        assert_eq!(code, Some(2), "{task}: {stderr}");
        assert!(
            stderr.contains("\"embedding/\"") && stderr.contains("scope"),
            "{task}: {stderr}"
        );
    }
}

#[test]
fn duplicate_addresses_exit_2_naming_both_tasks_and_the_address() {
    let tf_config = r#"{"cluster": {"chief": ["127.0.0.1:5000"], "worker": ["127.0.0.1:5001"], "ps": ["127.0.0.1:5001"]},
                       "task": {"type": "ps", "index": 0}}"#;
    let (code, stderr) = role_process(tf_config);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("cluster.worker[0]")
            && stderr.contains("cluster.ps[0]")
            && stderr.contains("127.0.0.1:5001"),
        "{stderr}"
    );
}

#[test]
fn typed_steps_round_trip_and_an_unknown_step_or_undecodable_argument_or_value_is_named() {
    let mut run = Run::new("ps-typed", "typed", &[]);
    run.num_workers = 1;
    let report = run.launch();
    let trip = &report["round_trip"];
    assert_eq!(trip["tag"], "first", "{report}");
    assert_eq!(trip["worker"], 0, "{report}");
    assert_eq!(
        trip["w_before"],
        serde_json::json!([0.0, 0.0, 0.0, 0.0]),
        "{report}"
    );

    let ghost = error_in(&report, "ghost_error");
    assert!(
        ghost.contains("\"ghost\"") && ghost.contains("fit_typed"),
        "names the step and what is registered: {ghost}"
    );
    let garbage = error_in(&report, "garbage_error");
    assert!(
        garbage.contains("\"fit_typed\"") && garbage.contains("argument does not decode"),
        "{garbage}"
    );
    assert!(
        report["garbage_join"].is_string(),
        "join raises it: {report}"
    );
    let huge = error_in(&report, "huge_error");
    assert!(
        huge.contains("\"huge\"") && huge.contains("more elements than a machine word"),
        "{huge}"
    );
    let short = error_in(&report, "short_error");
    assert!(
        short.contains("\"short\"") && short.contains("5 initial values"),
        "{short}"
    );
    let misread = error_in(&report, "misread_error");
    assert!(
        misread.contains("does not decode") && misread.contains("u8"),
        "{misread}"
    );

    // Every good closure was applied once: 1 (times 2) + the misread one + 5 rounds ran, the
    // garbage one failed; w moved toward its target.
    let end = &report["end"];
    assert_eq!(end["ledger"]["failed"], 1, "{report}");
    assert_eq!(end["ledger"]["committed"], 7, "{report}");
    let w: Vec<f32> = end["w"]
        .as_array()
        .unwrap()
        .iter()
        .map(|bits| f32::from_bits(bits.as_u64().unwrap() as u32))
        .collect();
    assert!(w.iter().all(|v| *v != 0.0), "{w:?}");
}

#[test]
fn a_wrong_shape_gradient_fails_naming_the_variable_and_a_nan_gradient_is_skipped_and_counted() {
    let mut run = Run::new("ps-bad-grad", "gradients", &[]);
    run.num_workers = 1;
    let report = run.launch();
    let start = &report["start"];

    // A wrong shape: the closure fails with an error naming the variable; nothing changed on
    // either PS, not even the good row gradient sent along with it (all or nothing).
    let err = error_in(&report, "bad_shape_error");
    assert!(err.contains("\"w\"") && err.contains("3 values"), "{err}");
    let after = &report["after_bad_shape"];
    assert_eq!(
        (&after["w"], &after["table"]),
        (&start["w"], &start["table"]),
        "{report}"
    );
    assert_eq!(after["ps"], start["ps"], "PS counters moved: {report}");
    assert_eq!(after["ledger"]["failed"], 1, "{report}");

    let err = error_in(&report, "bad_rows_error");
    assert!(err.contains("\"table\""), "{err}");
    let after = &report["after_bad_rows"];
    assert_eq!(
        (&after["w"], &after["table"]),
        (&start["w"], &start["table"]),
        "{report}"
    );
    assert_eq!(after["ps"], start["ps"], "PS counters moved: {report}");

    // A NaN in one shard's part of w: skipped and counted once, by the PS holding that part
    // (default policy); nothing changed on either PS (the finite part on the other PS was not
    // applied either: a sharded variable is never half updated); the closure committed.
    let after_nan = &report["after_nan"];
    assert_eq!(after_nan["w"], start["w"], "{report}");
    let skipped: u64 = after_nan["ps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["skipped_non_finite"].as_u64().unwrap())
        .sum();
    assert_eq!(skipped, 1, "{report}");
    let applied = |state: &serde_json::Value| -> Vec<u64> {
        state["ps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["applied"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(applied(after_nan), applied(start), "{report}");
    assert_eq!(after_nan["ledger"]["committed"], 4, "{report}");

    // Training goes on afterwards.
    let end = &report["end"];
    assert_ne!(end["w"], after_nan["w"], "{report}");
    assert_eq!(end["ledger"]["committed"], 7, "{report}");
    assert_eq!(end["ledger"]["failed"], 2, "{report}");
    assert_eq!(end["ledger"]["balances"], true, "{report}");
    let w: Vec<f32> = end["w"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| f32::from_bits(b.as_u64().unwrap() as u32))
        .collect();
    assert!(w.iter().all(|v| v.is_finite()), "{w:?}");
}

/// Runs this test binary as a role process with `tf_config` and no launcher; its exit code and
/// stderr. Bounded in time.
fn role_process(tf_config: &str) -> (Option<i32>, String) {
    role_process_with(tf_config, &[])
}

/// [`role_process`] with `env` set too.
fn role_process_with(tf_config: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "cluster_task", "--nocapture"])
        .envs(env.iter().copied())
        .env(CHILD_ENV, "1")
        .env("TF_CONFIG", tf_config)
        // A certificate directory is given, so the error is about TF_CONFIG alone.
        .env("COHORT_CERTS", std::env::temp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the role process");
    let deadline = Instant::now() + ROLE_PROCESS_MAX;
    while child
        .try_wait()
        .expect("wait for the role process")
        .is_none()
    {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the role process with TF_CONFIG {tf_config} ran past {ROLE_PROCESS_MAX:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().expect("role process output");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !stderr.contains("panicked"),
        "the role process panicked: {stderr}"
    );
    (output.status.code(), stderr)
}

/// A role process with bad input must exit at once.
const ROLE_PROCESS_MAX: Duration = Duration::from_secs(20);
