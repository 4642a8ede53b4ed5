//! A role process's metrics endpoint (`metrics_addr`, [`crate::metrics`]): started once the
//! role's actors run, with the hook that reads each role's own counters at scrape time (the
//! coordinator's ledger and control counters, a parameter server's push counters), and the
//! count of peers its gateway declares dead; on the chief, the status page's source (the
//! cluster read from the coordinator actor, with what the program recorded: [`crate::status`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use actix::Addr;
use cohort_actors::{Gateway, PeerEvent};

use super::RoleFailure;
use crate::cluster::RoleConfig;
use crate::metrics::{
    instruments, serve, Exposition, Reading, Refresh, Role, StatusFormat, StatusSource,
};
use crate::roles::coordinator::{CoordinatorActor, Counters, StatusView};
use crate::roles::ps::{LocalStats, PsActor};
use crate::status::{self, StatusReport};

/// Serves this process's metrics when `metrics_addr` is set; an address that cannot be
/// served is a configuration error naming the key (exit 2).
pub(super) fn start(
    config: &RoleConfig,
    role: Role,
    incarnation: u64,
    refresh: Option<Refresh>,
) -> Result<(), RoleFailure> {
    start_with_status(config, role, incarnation, refresh, None)
}

/// [`start`], serving the status page made by `status` too.
pub(super) fn start_with_status(
    config: &RoleConfig,
    role: Role,
    incarnation: u64,
    refresh: Option<Refresh>,
    status: Option<StatusSource>,
) -> Result<(), RoleFailure> {
    let Some(addr) = config.metrics_addr else {
        return Ok(());
    };
    let index = config.cluster.task.index;
    let mut exposition = Exposition::new(role, index, incarnation, refresh);
    if let Some(status) = status {
        exposition = exposition.with_status(status);
    }
    let exposition = Arc::new(exposition);
    let server = serve(addr, exposition).map_err(|e| {
        RoleFailure::Config(format!(
            "bad config: {}: metrics_addr: cannot serve metrics on {addr}: {e}",
            config.origin("metrics_addr")
        ))
    })?;
    tracing::info!(
        "{}: metrics on http://{}/metrics (health: /healthz)",
        config.cluster.task,
        server.addr
    );
    Ok(())
}

/// The chief's rate of committed closures and mean step time over the last
/// [`status::RATE_WINDOW`], sampled every [`status::RATE_TICK`] by a clock of its own (never by
/// the requests that read it, so that every reader sees the same rate).
pub(super) fn chief_rate(actor: Addr<CoordinatorActor>) -> Arc<Mutex<status::RateSampler>> {
    let rate = Arc::new(Mutex::new(status::RateSampler::default()));
    let sampler = Arc::clone(&rate);
    actix::spawn(async move {
        let mut tick = tokio::time::interval(status::RATE_TICK);
        loop {
            tick.tick().await;
            // The actor stopped: the process is ending.
            let Ok((counters, _)) = actor.send(Counters).await else {
                return;
            };
            let steps = crate::metrics::instruments().step_totals();
            sampler
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .sample(Instant::now(), counters.ledger.committed, steps);
        }
    });
    rate
}

/// The chief's status page (`/status`, `/status.json`) of job `job`: the cluster, ledger and
/// cut read from the coordinator actor ([`StatusView`], answered from memory), the loss
/// history and newest checkpoint the program recorded, and `rate` ([`chief_rate`]).
pub(super) fn chief_status(
    actor: Addr<CoordinatorActor>,
    job: String,
    rate: Arc<Mutex<status::RateSampler>>,
) -> StatusSource {
    Arc::new(move |format| {
        let (actor, rate, job) = (actor.clone(), Arc::clone(&rate), job.clone());
        Box::pin(async move {
            let view = actor.send(StatusView).await.ok()?;
            let committed = view.ledger.committed;
            let (steps_per_second, step_seconds) = rate
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .current();
            let report = StatusReport {
                job,
                unix_ms: status::unix_ms_now(),
                step: committed,
                steps_per_second,
                step_seconds,
                checkpoint: status::newest_checkpoint(view.cut),
                loss: status::loss_history(),
                ledger: Some(view.ledger),
                tasks: view.tasks,
                group: None,
            };
            Some(match format {
                StatusFormat::Json => report.to_json(),
                StatusFormat::Html => status::html(&report),
            })
        })
    })
}

/// Counts every peer incarnation the gateway declares dead ([`PeerEvent::Dead`]).
pub(super) fn count_detections(gateway: &Gateway) {
    let mut events = gateway.subscribe();
    actix::spawn(async move {
        while let Some(event) = events.recv().await {
            if matches!(event, PeerEvent::Dead { .. }) {
                instruments().detections.inc();
            }
        }
    });
}

/// The chief's readings: the ledger (LEDGER-1), the control counters, and `rate`
/// ([`chief_rate`]: committed closures per second over a window no scrape moves; a dashboard
/// may as well take `rate(cohort_ledger_committed[1m])`).
///
/// Longer than most functions here on purpose: one reading per metric of the chief, each named
/// where it is set.
pub(super) fn chief_refresh(
    actor: Addr<CoordinatorActor>,
    rate: Arc<Mutex<status::RateSampler>>,
) -> Refresh {
    Arc::new(move || {
        let actor = actor.clone();
        let rate = Arc::clone(&rate);
        Box::pin(async move {
            let Ok((status, control)) = actor.send(Counters).await else {
                return Vec::new();
            };
            let l = &status.ledger;
            let rate = rate
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .current()
                .0;
            vec![
                Reading::counter(
                    "cohort_ledger_scheduled",
                    "Closures ever scheduled (LEDGER-1)",
                    l.scheduled,
                ),
                Reading::counter(
                    "cohort_ledger_committed",
                    "Closures that committed a value",
                    l.committed,
                ),
                Reading::counter(
                    "cohort_ledger_failed",
                    "Closures that failed with their own error",
                    l.failed,
                ),
                Reading::counter(
                    "cohort_ledger_cancelled",
                    "Closures cancelled because another failed",
                    l.cancelled,
                ),
                Reading::counter(
                    "cohort_ledger_unavailable",
                    "Closures that could not run (no worker in time, attempts exhausted)",
                    l.unavailable,
                ),
                Reading::counter(
                    "cohort_ledger_redispatched",
                    "Re-dispatches after the worker running the closure was lost",
                    l.redispatched,
                ),
                Reading::counter(
                    "cohort_ledger_rejected_stale",
                    "Results rejected from a fenced incarnation or a superseded attempt",
                    l.rejected_stale,
                ),
                Reading::counter(
                    "cohort_ledger_rolled_back",
                    "Committed closures queued again by a parameter-server recovery",
                    l.rolled_back,
                ),
                Reading::gauge(
                    "cohort_ledger_pending",
                    "Closures queued or in flight now",
                    l.pending as f64,
                ),
                Reading::counter(
                    "cohort_ps_restores",
                    "Parameter-server recoveries (every server restored from a checkpoint)",
                    l.ps_restores,
                ),
                Reading::gauge(
                    "cohort_live_workers",
                    "Workers with a live incarnation",
                    status.live_workers as f64,
                ),
                Reading::gauge(
                    "cohort_steps_per_second",
                    "Closures committed per second over the last 10 s (sampled every second)",
                    rate,
                ),
                Reading::counter(
                    "cohort_preemption_cuts",
                    "Checkpoint cuts taken for a parameter server's preemption notice",
                    control.preemption_cuts,
                ),
                Reading::counter(
                    "cohort_preemption_cuts_given_up",
                    "Preemption cuts given up (the servers left without one)",
                    control.preemption_cuts_given_up,
                ),
                Reading::counter(
                    "cohort_workers_retired",
                    "Fenced worker incarnations told to retire",
                    control.workers_retired,
                ),
                Reading::counter(
                    "cohort_servers_retired",
                    "Parameter-server incarnations declared dead and told to retire",
                    control.servers_retired,
                ),
                Reading::counter(
                    "cohort_workers_left",
                    "Worker incarnations that left after a preemption notice",
                    control.workers_left,
                ),
                Reading::counter(
                    "cohort_servers_left",
                    "Parameter-server incarnations that left after a preemption notice",
                    control.servers_left,
                ),
            ]
        })
    })
}

/// A parameter server's readings: its push counters ([`crate::roles::protocol::PsStats`]).
pub(super) fn ps_refresh(actor: Addr<PsActor>) -> Refresh {
    Arc::new(move || {
        let actor = actor.clone();
        Box::pin(async move {
            let Ok(s) = actor.send(LocalStats).await else {
                return Vec::new();
            };
            vec![
                Reading::counter(
                    "cohort_ps_pushes_applied",
                    "Pushes applied (PS-1)",
                    s.applied,
                ),
                Reading::counter(
                    "cohort_ps_pushes_duplicate",
                    "Pushes refused as duplicates of an applied closure (PS-1)",
                    s.rejected_duplicate,
                ),
                Reading::counter(
                    "cohort_ps_pushes_stale",
                    "Pushes refused from fenced incarnations or older restore generations",
                    s.rejected_stale,
                ),
                Reading::counter(
                    "cohort_ps_pushes_non_finite",
                    "Pushes skipped for non-finite gradients",
                    s.skipped_non_finite,
                ),
                Reading::counter(
                    "cohort_ps_pushes_invalid",
                    "Pushes refused as invalid",
                    s.rejected_invalid,
                ),
                Reading::gauge(
                    "cohort_ps_generation",
                    "The restore generation this server is at",
                    s.generation as f64,
                ),
                Reading::gauge(
                    "cohort_ps_serving",
                    "1 while this server holds variables (0 before a restart is restored)",
                    if s.serving { 1.0 } else { 0.0 },
                ),
            ]
        })
    })
}
