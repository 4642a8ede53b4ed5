//! Stop requests: SIGTERM and SIGINT, which cohort reads as a preemption notice (DESIGN §5),
//! and SIGUSR1, a drain (leave the job for good: `cohort scale` down).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// True once this process got SIGTERM or SIGINT while running a role (a preemption notice).
pub fn preemption_requested() -> bool {
    PREEMPTED.load(Ordering::SeqCst)
}

/// Sets `flag` when SIGINT or SIGTERM arrives, for a process that polls for its stop (the
/// launcher, the evaluator) rather than running a role's actors.
pub fn stop_on_signals(flag: &Arc<AtomicBool>) -> std::io::Result<()> {
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(flag))?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(flag))?;
    Ok(())
}

/// Sets `flag` when SIGUSR1 arrives (a drain: the launcher scaling the job down), for a
/// process that polls for it (a MultiWorkerMirrored worker, at each step boundary). From this
/// call on, SIGUSR1 no longer kills the process.
pub fn drain_on_signal(flag: &Arc<AtomicBool>) -> std::io::Result<()> {
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, Arc::clone(flag))?;
    Ok(())
}

/// After SIGTERM/SIGINT, sets [`preemption_requested`] and runs `then` (spawned on the
/// current actix system's arbiter).
pub(crate) fn on_stop_signal<F, Fut>(then: F)
where
    F: FnOnce() -> Fut + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    use tokio::signal::unix::{signal, SignalKind};
    actix::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::warn!(
                "cannot watch for SIGTERM/SIGINT; a stop request will kill this process at once"
            );
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        PREEMPTED.store(true, Ordering::SeqCst);
        then().await;
    });
}

static PREEMPTED: AtomicBool = AtomicBool::new(false);
