//! Crash-only supervision, across real processes: with the crash hook installed, a panic on any
//! thread (an actix handler, a tokio task, a plain thread) ends the process at once with the
//! hook's code and a report naming the thread, the message, the location and a backtrace; a
//! panic inside `contain_panic` is a value and the process goes on.
//!
//! Each scenario re-executes this test binary in child mode (`crash_child`) and watches it from
//! the outside, the way the process supervisor does.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use actix::prelude::*;
use cohort_actors::{contain_panic, crash_exit_code, install_crash_hook, panic_message};

/// Set in a child: the scenario it runs.
const CHILD_ENV: &str = "COHORT_ACTORS_CRASH_CHILD";
/// The code the children's hook exits with (not 128 + a common signal).
const CRASH_CODE: i32 = 170;
/// What a child prints and the code it exits with if it is still alive after its panic: the
/// half-alive process crash-only supervision exists to prevent.
const STILL_ALIVE: &str = "still alive after the panic";
const STILL_ALIVE_CODE: i32 = 3;
/// How long a child lives on after its panic before it declares itself half alive.
const LINGER: Duration = Duration::from_secs(5);
/// Bound on a whole child run.
const CHILD_MAX: Duration = Duration::from_secs(60);

/// Child mode: runs the scenario named in [`CHILD_ENV`].
#[test]
fn crash_child() {
    let Ok(scenario) = std::env::var(CHILD_ENV) else {
        return;
    };
    assert_eq!(install_crash_hook(CRASH_CODE), CRASH_CODE);
    // Installed once: a second call keeps the first code.
    assert_eq!(install_crash_hook(1), CRASH_CODE);
    assert_eq!(crash_exit_code(), Some(CRASH_CODE));
    match scenario.as_str() {
        "actix-handler" => actix_handler_panics(),
        "tokio-task" => tokio_task_panics(),
        "named-thread" => named_thread_panics(),
        "contained" => contained_panic_is_a_value(),
        other => panic!("unknown scenario {other}"),
    }
    println!("{STILL_ALIVE}");
    std::process::exit(STILL_ALIVE_CODE);
}

/// An actor whose handler panics: what actix alone turns into a closed mailbox.
struct Fragile;

impl Actor for Fragile {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "u32")]
struct Poke(u32);

impl Handler<Poke> for Fragile {
    type Result = u32;

    fn handle(&mut self, msg: Poke, _: &mut Context<Self>) -> u32 {
        if msg.0 == 2 {
            panic!("fragile actor poked {} times", msg.0);
        }
        msg.0
    }
}

/// The actor runs on an arbiter thread of its own, as a role's actors do beside the node's
/// gateway: after the panic the system and this thread would live on.
fn actix_handler_panics() {
    let system = System::new();
    system.block_on(async {
        let arbiter = Arbiter::new();
        let addr = Fragile::start_in_arbiter(&arbiter.handle(), |_| Fragile);
        assert_eq!(addr.send(Poke(1)).await.ok(), Some(1));
        let _ = addr.send(Poke(2)).await;
        tokio::time::sleep(LINGER).await;
    });
}

fn tokio_task_panics() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        // tokio catches a task's panic for its JoinHandle; the hook runs first.
        let task = tokio::spawn(async { panic!("task failed") });
        let _ = task.await;
        tokio::time::sleep(LINGER).await;
    });
}

fn named_thread_panics() {
    let thread = std::thread::Builder::new()
        .name("compute-7".into())
        .spawn(|| panic!("compute thread gave up at step {}", 41 + 1))
        .expect("a thread");
    let _ = thread.join();
    std::thread::sleep(LINGER);
}

fn contained_panic_is_a_value() {
    let outcome = contain_panic(|| -> u32 { panic!("user step failed") });
    let message = panic_message(outcome.unwrap_err().as_ref());
    println!("contained: {message}");
    std::process::exit(0);
}

#[test]
fn a_panic_in_an_actix_handler_ends_the_process_with_the_crash_code() {
    let out = run_child("actix-handler");
    expect_crash(
        &out,
        "fragile actor poked 2 times",
        "actors/tests/supervision.rs",
    );
}

#[test]
fn a_panic_in_a_tokio_task_ends_the_process_with_the_crash_code() {
    let out = run_child("tokio-task");
    expect_crash(&out, "task failed", "actors/tests/supervision.rs");
}

#[test]
fn a_panic_on_a_named_thread_is_reported_with_thread_message_location_and_backtrace() {
    let out = run_child("named-thread");
    let stderr = expect_crash(
        &out,
        "compute thread gave up at step 42",
        "actors/tests/supervision.rs",
    );
    assert!(
        stderr.contains("panic on thread 'compute-7'"),
        "stderr: {stderr}"
    );
    assert!(stderr.contains("stack backtrace:"), "stderr: {stderr}");
    assert!(
        stderr.contains("named_thread_panics"),
        "the backtrace names the panicking function: {stderr}"
    );
}

#[test]
fn a_contained_panic_is_a_value_and_the_process_goes_on() {
    let out = run_child("contained");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert!(
        stdout.contains("contained: user step failed"),
        "stdout: {stdout}"
    );
    assert!(!stderr.contains("crash-only"), "stderr: {stderr}");
}

/// Checks that the child died of its panic, at once: the crash code, the report, and never the
/// line it prints when it outlives its panic. Returns its stderr.
fn expect_crash(out: &Output, message: &str, file: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stdout.contains(STILL_ALIVE), "half alive: {stdout}");
    assert_eq!(
        out.status.code(),
        Some(CRASH_CODE),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(stderr.contains(message), "stderr: {stderr}");
    assert!(stderr.contains(file), "the location is named: {stderr}");
    assert!(
        stderr.contains(&format!("exiting with code {CRASH_CODE}")),
        "stderr: {stderr}"
    );
    stderr
}

/// Runs this binary as a child in `scenario` and waits (bounded) for it to exit.
fn run_child(scenario: &str) -> Output {
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", "crash_child", "--nocapture"])
        .env(CHILD_ENV, scenario)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the child");
    // Drained as it comes, so that a long backtrace never blocks the child on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + CHILD_MAX;
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll the child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the {scenario} child ran past {CHILD_MAX:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}
