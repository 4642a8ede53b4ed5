//! The parameter server's actix shell: decodes gateway messages into [`ParameterStore`] calls
//! and encodes the replies. All decisions are the machine's.
//!
//! The machine's serving gate ([`ParameterStore::serving`]: a server that holds no variable at
//! all, a restarted one before the coordinator restored it) is mirrored at the gateway, which
//! refuses reads and pushes there as unavailable, so that a worker sees the
//! server's failure (retryable, the coordinator holds dispatch and restores it), never a
//! closure error about a missing variable. [`PsStats`] says whether it holds any, so that the
//! coordinator counts an empty server as one that lost its state.
//!
//! Test-only failpoint: [`PushPanic`] (`COHORT_FAILPOINT=ps.push.panic`, or
//! `ps.push.panic=N` to let N pushes through first) makes the push handler panic, to test
//! crash-only recovery; compiled in always, inert unless the role's process entry reads it from
//! the environment ([`PushPanic::from_env`]). The launcher passes failpoints to a task's first
//! incarnation only, so the restarted server runs clean.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use bytes::Bytes;
use cohort_actors::{Gateway, RefusedReason, RegisterError, Remote, RemoteMessage};

use super::machine::{shape_of, ParameterStore, PushOrigin};
use crate::checkpoint::FAILPOINT_ENV;
use crate::ledger::ClosureId;
use crate::optim::Slots;
use crate::roles::protocol::{
    blob, blob_u64, bytes_to_f32, f32_shared_blob, f32_vec_blob, AssignVariable, BeginRestore,
    CreateVariable, FenceWorker, FinishedBelow, PsRefusal, PsStats, PsStatsReply, Pull, PullRows,
    Push, RestoreVariable, RollBack, Snapshot, PS_ACTOR,
};

/// The parameter-server actor: owns the store.
pub struct PsActor {
    store: ParameterStore,
    gateway: Gateway,
    /// Whether the store holds any variable (read by the gateway's handlers).
    serving: Arc<AtomicBool>,
    /// The test-only failpoint, if set.
    push_panic: Option<PushPanic>,
    /// Pushes that reached the handler (counted for [`PushPanic`]).
    pushes_handled: u64,
}

/// Name of the push-handler failpoint in [`FAILPOINT_ENV`].
pub const PUSH_PANIC_SITE: &str = "ps.push.panic";

/// Test-only failpoint: the push handler panics when `after` pushes have been handled (so
/// `after: 0` panics on the first). Read from [`FAILPOINT_ENV`]: `ps.push.panic` or
/// `ps.push.panic=N`, among the comma-separated sites there (other sites are ignored here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushPanic {
    /// Pushes handled before the one that panics.
    pub after: u64,
}

/// A [`PUSH_PANIC_SITE`] entry in [`FAILPOINT_ENV`] whose count is not a whole number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{FAILPOINT_ENV}: {entry:?}: expected {PUSH_PANIC_SITE} or {PUSH_PANIC_SITE}=N (N pushes before the panic)")]
pub struct BadPushPanic {
    /// The entry as given.
    pub entry: String,
}

impl PushPanic {
    /// The failpoint named in this process's [`FAILPOINT_ENV`], if any.
    pub fn from_env() -> Result<Option<Self>, BadPushPanic> {
        Self::parse(std::env::var(FAILPOINT_ENV).ok().as_deref().unwrap_or(""))
    }

    /// The failpoint named in a [`FAILPOINT_ENV`] value, if any.
    pub fn parse(sites: &str) -> Result<Option<Self>, BadPushPanic> {
        for entry in sites.split(',').map(str::trim) {
            let (site, count) = match entry.split_once('=') {
                Some((site, count)) => (site.trim(), Some(count.trim())),
                None => (entry, None),
            };
            if site != PUSH_PANIC_SITE {
                continue;
            }
            let after = match count {
                None => 0,
                Some(n) => n.parse().map_err(|_| BadPushPanic {
                    entry: entry.to_string(),
                })?,
            };
            return Ok(Some(Self { after }));
        }
        Ok(None)
    }
}

impl PsActor {
    /// Starts the actor and registers it with `gateway` under [`PS_ACTOR`].
    pub fn start(store: ParameterStore, gateway: Gateway) -> Result<Addr<PsActor>, RegisterError> {
        Self::start_with_failpoint(store, gateway, None)
    }

    /// As [`PsActor::start`], with the test-only [`PushPanic`] failpoint armed when given.
    pub fn start_with_failpoint(
        store: ParameterStore,
        gateway: Gateway,
        push_panic: Option<PushPanic>,
    ) -> Result<Addr<PsActor>, RegisterError> {
        let serving = Arc::new(AtomicBool::new(store.serving()));
        let addr = PsActor {
            store,
            gateway: gateway.clone(),
            serving: Arc::clone(&serving),
            push_panic,
            pushes_handled: 0,
        }
        .start();
        gateway.register::<CreateVariable>(PS_ACTOR, addr.clone().recipient())?;
        gateway.register::<RestoreVariable>(PS_ACTOR, addr.clone().recipient())?;
        gateway.register::<AssignVariable>(PS_ACTOR, addr.clone().recipient())?;
        register_with_blobs::<Pull>(&gateway, &addr, &serving)?;
        register_with_blobs::<PullRows>(&gateway, &addr, &serving)?;
        let push_addr = addr.clone();
        let push_serving = Arc::clone(&serving);
        gateway.register_fn::<Push, _, _>(PS_ACTOR, move |m: Remote<Push>| {
            let addr = push_addr.clone();
            let serving = check_serving(&push_serving);
            async move {
                serving?;
                addr.send(m)
                    .await
                    .map_err(|_| RefusedReason::ActorUnavailable(PS_ACTOR.into()))
            }
        })?;
        gateway.register::<FenceWorker>(PS_ACTOR, addr.clone().recipient())?;
        gateway.register::<FinishedBelow>(PS_ACTOR, addr.clone().recipient())?;
        gateway.register::<BeginRestore>(PS_ACTOR, addr.clone().recipient())?;
        gateway.register::<RollBack>(PS_ACTOR, addr.clone().recipient())?;
        register_with_blobs::<Snapshot>(&gateway, &addr, &serving)?;
        gateway.register::<PsStats>(PS_ACTOR, addr.clone().recipient())?;
        Ok(addr)
    }
}

impl Actor for PsActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Pushes and pulls can be large; a deep mailbox would only add latency.
        ctx.set_mailbox_capacity(MAILBOX_MAX);
    }
}

impl Handler<Remote<CreateVariable>> for PsActor {
    type Result = MessageResult<Remote<CreateVariable>>;

    fn handle(&mut self, msg: Remote<CreateVariable>, _: &mut Context<Self>) -> Self::Result {
        let CreateVariable { name, shape, init } = msg.msg;
        let result = self.store.handle_create_from(&name, &shape, &init);
        self.note_serving();
        MessageResult(result)
    }
}

/// A request whose reply carries blobs: the gateway's blob handlers forward it to the actor.
struct WithBlobs<M: RemoteMessage>(Remote<M>);

impl<M: RemoteMessage> Message for WithBlobs<M> {
    type Result = (M::Reply, Vec<Bytes>);
}

/// Registers `M` with a handler that asks the actor and answers its reply and blobs; refused
/// as unavailable while the server holds no variable.
fn register_with_blobs<M>(
    gateway: &Gateway,
    addr: &Addr<PsActor>,
    serving: &Arc<AtomicBool>,
) -> Result<(), RegisterError>
where
    M: RemoteMessage,
    M::Reply: Send,
    PsActor: Handler<WithBlobs<M>>,
{
    let addr = addr.clone();
    let serving = Arc::clone(serving);
    gateway.register_fn_with_blobs::<M, _, _>(PS_ACTOR, move |m: Remote<M>| {
        let addr = addr.clone();
        let serving = check_serving(&serving);
        async move {
            serving?;
            addr.send(WithBlobs(m))
                .await
                .map_err(|_| RefusedReason::ActorUnavailable(PS_ACTOR.into()))
        }
    })
}

/// Refuses a read or push while the server holds no variable: it restarted and the
/// coordinator has not restored it yet (the worker then reports the server unavailable).
fn check_serving(serving: &AtomicBool) -> Result<(), RefusedReason> {
    if serving.load(Ordering::Acquire) {
        return Ok(());
    }
    Err(RefusedReason::ActorUnavailable(format!(
        "{PS_ACTOR} (holds no variable: restarted and not restored yet)"
    )))
}

impl PsActor {
    fn note_serving(&self) {
        if self.store.serving() {
            self.serving.store(true, Ordering::Release);
        }
    }
}

impl Handler<Remote<BeginRestore>> for PsActor {
    type Result = ();

    fn handle(&mut self, msg: Remote<BeginRestore>, _: &mut Context<Self>) {
        let what = if msg.msg.afresh {
            " (a start afresh)"
        } else {
            ""
        };
        tracing::info!(
            "restore generation {} begins{what}: refusing pushes until the roll-back",
            msg.msg.generation
        );
        self.store
            .handle_begin_restore(msg.msg.generation, &msg.msg.fences, msg.msg.afresh);
    }
}

impl Handler<Remote<RollBack>> for PsActor {
    type Result = ();

    fn handle(&mut self, msg: Remote<RollBack>, _: &mut Context<Self>) {
        tracing::info!(
            "rolled back to the checkpoint cut at closure {} (PS-1 state reset, restore \
             generation {})",
            msg.msg.finished_below,
            msg.msg.generation
        );
        self.store
            .handle_roll_back(ClosureId(msg.msg.finished_below), msg.msg.generation);
    }
}

impl Handler<Remote<RestoreVariable>> for PsActor {
    type Result = MessageResult<Remote<RestoreVariable>>;

    fn handle(&mut self, msg: Remote<RestoreVariable>, _: &mut Context<Self>) -> Self::Result {
        let Remote {
            msg:
                RestoreVariable {
                    name,
                    shape,
                    slots,
                    steps,
                },
            blobs,
            ..
        } = msg;
        let result = (|| {
            let shape = shape_of(&shape)?;
            let values = bytes_to_f32(blob(&blobs, 0, &name)?, &name)?;
            let buffers = slots
                .iter()
                .enumerate()
                .map(|(i, slot)| {
                    let what = format!("{name}/{slot}");
                    Ok((
                        slot.clone(),
                        bytes_to_f32(blob(&blobs, i + 1, &what)?, &what)?,
                    ))
                })
                .collect::<Result<Vec<_>, PsRefusal>>()?;
            let optimizer = self.store.optimizer_for(&name);
            let slots = Slots::restore(optimizer, &name, values.len(), buffers, 0)?;
            Ok(self
                .store
                .handle_restore(&name, shape, values, slots, steps)?)
        })();
        self.note_serving();
        MessageResult(result)
    }
}

impl Handler<Remote<AssignVariable>> for PsActor {
    type Result = MessageResult<Remote<AssignVariable>>;

    fn handle(&mut self, msg: Remote<AssignVariable>, _: &mut Context<Self>) -> Self::Result {
        let name = msg.msg.name;
        let result = (|| {
            let values = bytes_to_f32(blob(&msg.blobs, 0, &name)?, &name)?;
            Ok(self.store.handle_assign(&name, values)?)
        })();
        MessageResult(result)
    }
}

impl Handler<WithBlobs<Pull>> for PsActor {
    type Result = MessageResult<WithBlobs<Pull>>;

    fn handle(&mut self, msg: WithBlobs<Pull>, _: &mut Context<Self>) -> Self::Result {
        let names = &msg.0.msg.names;
        if names.len() > PULL_NAMES_MAX {
            return MessageResult((
                Err(PsRefusal::TooManyNames {
                    got: names.len() as u64,
                    max: PULL_NAMES_MAX as u64,
                }),
                Vec::new(),
            ));
        }
        let pulled = names
            .iter()
            .map(|name| self.store.pull_shared(name).map(f32_shared_blob))
            .collect::<Result<Vec<_>, _>>();
        MessageResult(match pulled {
            Ok(blobs) => {
                count_pulled(&blobs);
                (Ok(()), blobs)
            }
            Err(e) => (Err(e.into()), Vec::new()),
        })
    }
}

impl Handler<WithBlobs<PullRows>> for PsActor {
    type Result = MessageResult<WithBlobs<PullRows>>;

    fn handle(&mut self, msg: WithBlobs<PullRows>, _: &mut Context<Self>) -> Self::Result {
        let Remote {
            msg: PullRows { name },
            blobs,
            ..
        } = msg.0;
        let rows = (|| {
            let ids = blob_u64(blob(&blobs, 0, &name)?, &name)?;
            Ok::<_, PsRefusal>(self.store.pull_rows(&name, &ids)?)
        })();
        MessageResult(match rows {
            Ok(rows) => {
                let blobs = vec![f32_vec_blob(rows)];
                count_pulled(&blobs);
                (Ok(()), blobs)
            }
            Err(e) => (Err(e), Vec::new()),
        })
    }
}

impl Handler<Remote<Push>> for PsActor {
    type Result = MessageResult<Remote<Push>>;

    fn handle(&mut self, msg: Remote<Push>, _: &mut Context<Self>) -> Self::Result {
        if let Some(failpoint) = self.push_panic {
            if self.pushes_handled == failpoint.after {
                panic!(
                    "failpoint {PUSH_PANIC_SITE} fired after {} pushes",
                    failpoint.after
                );
            }
        }
        self.pushes_handled = self.pushes_handled.saturating_add(1);
        let Remote {
            msg: push,
            blobs,
            from,
        } = msg;
        crate::metrics::instruments()
            .ps_pushed_bytes
            .inc_by(blobs.iter().map(|b| b.len() as u64).sum());
        let result = (|| {
            let PushOrigin {
                worker,
                incarnation,
                ..
            } = push.origin;
            // SEC-2: a worker pushes as itself. The origin PS-1 and FENCE-1 key on must be the
            // authenticated sender's, or a leaked worker key could push under another worker's
            // index (or a fenced incarnation under a live one).
            if from.node.index != worker || from.incarnation.0 != incarnation {
                return Err(PsRefusal::NotTheSender {
                    worker,
                    incarnation,
                    from: from.node.to_string(),
                    from_incarnation: from.incarnation.0,
                });
            }
            let gradients = push.decode_gradients(&blobs)?;
            Ok(self.store.handle_push(push.origin, &gradients)?)
        })();
        MessageResult(result)
    }
}

impl Handler<Remote<FenceWorker>> for PsActor {
    type Result = ();

    fn handle(&mut self, msg: Remote<FenceWorker>, _: &mut Context<Self>) {
        self.store.handle_fence(msg.msg.worker, msg.msg.incarnation);
    }
}

impl Handler<Remote<FinishedBelow>> for PsActor {
    type Result = ();

    fn handle(&mut self, msg: Remote<FinishedBelow>, _: &mut Context<Self>) {
        self.store
            .handle_finished_below(ClosureId(msg.msg.closure), msg.msg.generation);
    }
}

impl Handler<WithBlobs<Snapshot>> for PsActor {
    type Result = MessageResult<WithBlobs<Snapshot>>;

    fn handle(&mut self, msg: WithBlobs<Snapshot>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(match self.store.snapshot(&msg.0.msg.name) {
            Ok((state, blobs)) => (Ok(state), blobs),
            Err(e) => (Err(e.into()), Vec::new()),
        })
    }
}

impl Handler<Remote<PsStats>> for PsActor {
    type Result = MessageResult<Remote<PsStats>>;

    fn handle(&mut self, _: Remote<PsStats>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats())
    }
}

/// This server's counters, asked from its own process (the metrics endpoint): the same
/// answer as [`PsStats`].
#[derive(Debug, Clone, Copy)]
pub struct LocalStats;

impl Message for LocalStats {
    type Result = PsStatsReply;
}

impl Handler<LocalStats> for PsActor {
    type Result = MessageResult<LocalStats>;

    fn handle(&mut self, _: LocalStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats())
    }
}

/// Counts the tensor bytes of a pull's answer.
fn count_pulled(blobs: &[Bytes]) {
    crate::metrics::instruments()
        .ps_pulled_bytes
        .inc_by(blobs.iter().map(|b| b.len() as u64).sum());
}

impl PsActor {
    fn stats(&self) -> PsStatsReply {
        let c = self.store.counters();
        PsStatsReply {
            applied: c.applied,
            rejected_duplicate: c.rejected_duplicate,
            // Stale pushes are refused either here (fenced by the coordinator) or by the
            // gateway before they reach the actor (fenced by the failure detector).
            rejected_stale: c.rejected_stale + self.gateway.stats().stale_rejected,
            skipped_non_finite: c.skipped_non_finite,
            rejected_invalid: c.rejected_invalid,
            next_free_closure_id: self.store.next_free_closure_id(),
            applied_ids_held: self.store.applied_ids_held() as u64,
            finished_below: self.store.finished_below().0,
            serving: self.serving.load(Ordering::Acquire),
            generation: self.store.generation().0,
            restoring: self.store.restoring_shards(),
            rejected_old_generation: c.rejected_old_generation,
        }
    }
}

/// Most shards one pull may name (the gateway bounds the reply's bytes as well).
const PULL_NAMES_MAX: usize = 1024;
/// Messages waiting for the actor.
const MAILBOX_MAX: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_push_panic_failpoint_is_inert_unless_named_and_its_count_is_checked() {
        assert_eq!(PushPanic::parse(""), Ok(None));
        assert_eq!(PushPanic::parse("checkpoint.before_manifest"), Ok(None));
        assert_eq!(
            PushPanic::parse("checkpoint.mid_shard, ps.push.panic"),
            Ok(Some(PushPanic { after: 0 }))
        );
        assert_eq!(
            PushPanic::parse("ps.push.panic=12"),
            Ok(Some(PushPanic { after: 12 }))
        );
        let err = PushPanic::parse("ps.push.panic=soon").unwrap_err();
        assert_eq!(
            err.to_string(),
            "COHORT_FAILPOINT: \"ps.push.panic=soon\": expected ps.push.panic or ps.push.panic=N (N pushes before the panic)"
        );
    }
}
