//! Supervision inside a process is crash-only: a panic ends the process at once, with a code
//! of its own, and the process supervisor (the local launcher, Kubernetes) restarts it as a new
//! incarnation under its [`RestartPolicy`](crate::restart::RestartPolicy).
//!
//! Why not restart actors inside the process: actix closes a panicking actor's mailbox and
//! leaves the rest of the process running, so a process whose role actor died still answers
//! heartbeats and holds its connections: half alive, refusing every call until a peer gives up
//! on it. Restarting the actor in place would not help either. A role's state is rebuilt from
//! its source of truth (the coordinator restores a parameter server from a checkpoint), and
//! its peers learn that it lost its state only from a new incarnation (FENCE-1); an actor
//! reborn inside the same process keeps the old incarnation, so its peers would treat an empty
//! store as the one they knew. Ending the process makes the one restart path, the process
//! supervisor's, the only one: a new process, a new incarnation, a restore.
//!
//! This module owns:
//! - [`install_crash_hook`]: the panic hook of a role process. It logs the panic (thread,
//!   message, location, backtrace) and exits with the code given, from whatever thread panicked
//!   (an actix arbiter, a tokio worker, a compute thread). Only a process entry installs it;
//!   library code and in-process tests never do.
//! - [`contain_panic`]: `catch_unwind` for the few places where a panic is a value by contract,
//!   because the code it guards is the user's (a step function, a dataset stage, the chief's
//!   program, an evaluation function): there the hook leaves the panic to the caller, which
//!   turns it into an error. Everything else that panics ends the process.

use std::any::Any;
use std::cell::Cell;
use std::io::Write;
use std::panic::{catch_unwind, PanicHookInfo, UnwindSafe};
use std::sync::OnceLock;

/// Installs the crash-only panic hook: every panic outside [`contain_panic`] is written to
/// stderr ([`crash_report`]) and ends the process with `exit_code`. Installed once per process;
/// a second call changes nothing and returns the code of the first.
///
/// Call it from a process entry only (a role's `main`), never from library code: a test that
/// runs roles in-process must keep its panics to itself.
pub fn install_crash_hook(exit_code: i32) -> i32 {
    *CRASH_EXIT_CODE.get_or_init(|| {
        let contained_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if in_contained_region() {
                // The caller turns this panic into an error: report it as usual and unwind.
                contained_hook(info);
                return;
            }
            let report = crash_report(info, exit_code);
            // Nothing else is worth doing if stderr is gone: exit anyway.
            let _ = std::io::stderr().lock().write_all(report.as_bytes());
            std::process::exit(exit_code);
        }));
        exit_code
    })
}

/// The exit code of the installed crash hook, if this process installed one.
pub fn crash_exit_code() -> Option<i32> {
    CRASH_EXIT_CODE.get().copied()
}

/// Runs `f`, returning its panic as an error instead of letting it end the process: the one
/// place where the crash hook lets a panic unwind. For code whose panic is a value by contract
/// (the user's step, dataset stage, chief program or evaluation function), never for the
/// runtime's own state. Without the hook it is `catch_unwind`.
pub fn contain_panic<R>(f: impl FnOnce() -> R + UnwindSafe) -> std::thread::Result<R> {
    CONTAINED.with(|depth| depth.set(depth.get() + 1));
    // Leaves the region on every path out, the unwinding one included.
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            let _ = CONTAINED.try_with(|depth| depth.set(depth.get().saturating_sub(1)));
        }
    }
    let _leave = Leave;
    catch_unwind(f)
}

/// What the crash hook writes before it exits: the thread, the message, where it panicked,
/// the exit code and why, and a backtrace (captured whatever `RUST_BACKTRACE` says: a crash of
/// a supervised process is read after the fact).
pub fn crash_report(info: &PanicHookInfo<'_>, exit_code: i32) -> String {
    let thread = std::thread::current();
    let location = info
        .location()
        .map_or_else(|| "an unknown location".to_string(), ToString::to_string);
    format!(
        "cohort: panic on thread '{}' ({:?}) at {location}: {}\n\
         cohort: crash-only: exiting with code {exit_code}; the process supervisor restarts \
         this task as a new incarnation\n\
         stack backtrace:\n{}\n",
        thread.name().unwrap_or("<unnamed>"),
        thread.id(),
        panic_message(info.payload()),
        std::backtrace::Backtrace::force_capture(),
    )
}

/// The text of a panic's payload (`panic!` with a literal or a format string).
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_string())
}

fn in_contained_region() -> bool {
    CONTAINED.try_with(|depth| depth.get() > 0).unwrap_or(false)
}

thread_local! {
    /// How many [`contain_panic`] calls this thread is inside.
    static CONTAINED: Cell<u32> = const { Cell::new(0) };
}

/// The code the installed hook exits with.
static CRASH_EXIT_CODE: OnceLock<i32> = OnceLock::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contained_panic_is_a_value_and_the_region_ends_with_it() {
        assert!(!in_contained_region());
        let outcome = contain_panic(|| -> u32 { panic!("boom {}", 7) });
        let payload = outcome.unwrap_err();
        assert_eq!(panic_message(payload.as_ref()), "boom 7");
        assert!(!in_contained_region(), "left on the unwinding path");
        let nested = contain_panic(|| {
            let inner = contain_panic(|| 1);
            (inner.unwrap(), in_contained_region())
        });
        assert_eq!(nested.unwrap(), (1, true));
        assert!(!in_contained_region());
    }
}
