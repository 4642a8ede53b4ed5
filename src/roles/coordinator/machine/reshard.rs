//! Elastic parameter servers: a server joining a running job, or leaving it for good, as the
//! coordinator machine handles it: at a checkpoint cut, the variables move onto the new set
//! of servers and nothing is lost or run again.
//!
//! The cluster spec names the servers the job starts with. A server it does not name joins
//! by telling the chief ([`crate::roles::protocol::Joining`], with the address it serves on;
//! its index comes from its certificate, SEC-1) and is accepted at once
//! ([`Scheduler::handle_ps_joining`]); a server asked to leave for good (its drain signal)
//! says so ([`crate::roles::protocol::Draining`], [`Scheduler::handle_ps_draining`]) and is
//! answered once its variables are elsewhere ([`SchedulerAction::AnswerPsDraining`]).
//!
//! Changes wait until nothing else holds the servers (no start, recovery, preemption cut or
//! variable creation under way) and what they hold is this chief's (its start ended, or it
//! scheduled work: a restarted chief's servers may hold a dead chief's work, which its start
//! rolls back); then, in order:
//! 1. **Cut**: a checkpoint cut is taken at once, exactly as for a server's preemption notice
//!    ([`super::preempt`]: dispatch held for new work, what ran before finishes, the cut is
//!    read, written under [`super::PREEMPTION_CUTS_DIR`] and marked). Every server that
//!    changes meanwhile joins this cut's changes or waits for the next;
//! 2. **Move**: the job's servers become the new set, every variable is placed again onto it
//!    ([`crate::variable::place_again`]: deterministic, DATA-1), what workers are set up with
//!    changes (the new layouts, and where servers past the spec are dialled), and every server
//!    of the new set counts as having lost its state: the recovery that follows restores each
//!    from the cut just taken, row by row into its new shards ([`super::recovery`]), and
//!    rewinds every worker with the new setup. Nothing was committed since the cut, so nothing
//!    runs again (`rolled_back` stays 0);
//! 3. **Done**: once the restore ended, every server that left is answered and exits 0 (its
//!    supervisor does not restart it), and dispatch resumes.
//!
//! A cut that could not be taken (see [`super::preempt`] for when) leaves the servers as
//! they were; the change is tried again, at most [`RESHARD_ATTEMPTS_MAX`] times, after which
//! a leaving server is told it must stay ([`DrainRefusal::Failed`]) and a joining one is
//! left out (it may join again). A join or leave needs a checkpoint directory (else it is
//! refused at once), and the last server cannot leave.
//!
//! What a restarted chief knows: only its cluster spec's servers, restored from the last
//! checkpoint onto them (the restore places variables again, M to M′). A server that joined
//! must join again (it registers with every new chief); a spec server that left must be
//! taken out of the spec given to the new chief.
//!
//! Pure: no IO, no clock.

use std::collections::BTreeMap;
use std::time::Instant;

use super::{PsEntry, PsLossCause, Scheduler, SchedulerAction};
use crate::roles::protocol::{DrainRefusal, JoinRefusal, SERVERS_MAX};
use crate::variable::place_again;

/// Cut attempts for one set of server changes before they are given up.
pub const RESHARD_ATTEMPTS_MAX: u32 = 3;

/// Why a variable creation is refused for now (the client tries again): its placement would
/// be made for servers that are being changed.
pub const RESHARDING: &str = "the job's parameter servers are being resharded";

/// Servers joining and leaving, waiting for or under way at a cut.
/// Why servers that asked to leave the job stay in it: the reason of their
/// [`DrainRefusal::Failed`] answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum LeaveFailure {
    /// The server registered again (as a newer incarnation) and stays.
    #[error("ps/{ps} registered again as incarnation {incarnation} and stays in the job")]
    RegisteredAgain {
        /// The server.
        ps: u32,
        /// The incarnation that registered.
        incarnation: u64,
    },
    /// No cut could be taken to move the variables.
    #[error("no checkpoint cut could be taken in {tries} tries")]
    NoCut {
        /// Cuts tried ([`RESHARD_ATTEMPTS_MAX`]).
        tries: u32,
    },
    /// A newer incarnation of the server asked to leave: its request is the one answered.
    #[error("a newer incarnation of ps/{ps} ({newer}) asked to leave")]
    NewerIncarnation {
        /// The server.
        ps: u32,
        /// The newer incarnation.
        newer: u64,
    },
    /// The recovery that restores the servers after the move failed.
    #[error(transparent)]
    RecoveryFailed(#[from] PsLossCause),
}

#[derive(Debug, Default, Clone)]
pub(super) struct ServerChanges {
    /// Servers joining, by index: the incarnation that asked and its address.
    joining: BTreeMap<u32, (u64, String)>,
    /// Servers leaving for good, by index, with the incarnation that asked.
    leaving: BTreeMap<u32, u64>,
    /// Cuts given up so far for these changes.
    attempts: u32,
}

impl ServerChanges {
    fn is_empty(&self) -> bool {
        self.joining.is_empty() && self.leaving.is_empty()
    }
}

/// The machine's elastic-server state.
#[derive(Debug, Default)]
pub(super) struct Resharding {
    /// Changes asked for and not under way yet.
    pending: ServerChanges,
    /// Changes whose cut is being taken.
    cutting: Option<ServerChanges>,
    /// Changes applied, whose restore runs.
    moving: Option<ServerChanges>,
    /// Where every server of the job serves (`host:port`): the cluster spec's as given
    /// ([`Scheduler::with_server_addresses`]), and those that joined.
    addresses: BTreeMap<u32, String>,
    /// Servers that left the job, or asked to leave before their registration arrived and
    /// went at once (and did not join again since), with the incarnation that left: a
    /// registration of that incarnation delivered later is no join.
    left: BTreeMap<u32, u64>,
    /// Changes applied since the start.
    pub(super) done: u64,
}

impl Scheduler {
    /// Incarnation `incarnation` of parameter server `ps` registers with address `addr` (already
    /// checked to be `host:port`). A server of the job changes nothing; another joins the job
    /// at the next cut (see the module doc). Refused past [`SERVERS_MAX`] or without a
    /// checkpoint directory.
    pub fn handle_ps_joining(
        &mut self,
        now: Instant,
        ps: u32,
        incarnation: u64,
        addr: String,
    ) -> Result<(), JoinRefusal> {
        if ps >= SERVERS_MAX {
            return Err(JoinRefusal::PsBeyondMax {
                ps,
                servers_max: SERVERS_MAX,
            });
        }
        // A registration of the incarnation that asked to leave (or left), delivered after
        // that ask (the network reorders; a server registers with each new chief and then asks
        // again to leave): it changes nothing. Only a newer incarnation registering stays.
        if self
            .leaving_incarnation(ps)
            .is_some_and(|asked| incarnation <= asked)
        {
            return Ok(());
        }
        let leaving_now = self
            .resharding
            .cutting
            .as_ref()
            .is_some_and(|c| c.leaving.contains_key(&ps));
        if self.server_set.contains(ps)
            && !self.resharding.pending.leaving.contains_key(&ps)
            && !leaving_now
        {
            return Ok(());
        }
        if self.preemption.root().is_none() {
            return Err(JoinRefusal::PsNoCheckpointDir { ps });
        }
        let pending = &mut self.resharding.pending;
        if let Some(asked) = pending.leaving.remove(&ps) {
            // Asked to leave, and registering again before it did (a new incarnation): it
            // stays; the incarnation that asked is told so.
            let reason = LeaveFailure::RegisteredAgain { ps, incarnation };
            self.answer_leaving(BTreeMap::from([(ps, asked)]), Err(reason));
            return Ok(());
        }
        let joining_now = self
            .resharding
            .cutting
            .as_ref()
            .is_some_and(|c| c.joining.contains_key(&ps));
        let newer = !joining_now
            && pending
                .joining
                .get(&ps)
                .is_none_or(|(known, _)| incarnation >= *known);
        if newer {
            tracing::info!(
                "ps/{ps} (incarnation {incarnation}) joins the job at {addr} at the next cut"
            );
            pending.joining.insert(ps, (incarnation, addr));
        }
        self.dispatch(now);
        Ok(())
    }

    /// Incarnation `incarnation` of parameter server `ps` asks to leave the job for good. `Ok(true)`:
    /// it may go now (it holds nothing of the job); `Ok(false)`: it may go once
    /// [`SchedulerAction::AnswerPsDraining`] says so; refused when it is the last server or
    /// the job has no checkpoint directory.
    pub fn handle_ps_draining(
        &mut self,
        now: Instant,
        ps: u32,
        incarnation: u64,
    ) -> Result<bool, DrainRefusal> {
        let has_root = self.preemption.root().is_some();
        let joining_now = self
            .resharding
            .cutting
            .as_ref()
            .is_some_and(|c| c.joining.contains_key(&ps));
        let pending = &mut self.resharding.pending;
        // A join asked for and not under way is called off.
        pending.joining.remove(&ps);
        if !self.server_set.contains(ps) && !joining_now {
            // Not in the job (nor about to be): nothing of it to move. It goes now: a
            // registration of this incarnation delivered later is no join.
            let left = self.resharding.left.entry(ps).or_insert(incarnation);
            *left = (*left).max(incarnation);
            return Ok(true);
        }
        // Servers that stay whatever happens to the changes asked for (a join counts once
        // done: its cut may fail).
        let cutting = self.resharding.cutting.as_ref();
        let staying = self
            .server_set
            .indexes()
            .iter()
            .filter(|s| {
                **s != ps
                    && !pending.leaving.contains_key(s)
                    && !cutting.is_some_and(|c| c.leaving.contains_key(s))
            })
            .count();
        if staying == 0 {
            return Err(DrainRefusal::LastServer { ps });
        }
        if !has_root {
            return Err(DrainRefusal::NoCheckpointDir { ps });
        }
        tracing::info!("ps/{ps} (incarnation {incarnation}) leaves the job at the next cut");
        self.ask_leave(ps, incarnation);
        self.dispatch(now);
        Ok(false)
    }

    /// Where the cluster spec's servers serve (`host:port`): every setup names every server
    /// of the job with its address, so that a worker whose own spec is older (started before
    /// a server joined or left) reaches them all.
    pub fn with_server_addresses(mut self, addresses: Vec<(u32, String)>) -> Self {
        self.resharding.addresses = addresses.into_iter().collect();
        self.setup.servers = self.addresses_in_job();
        self
    }

    /// Whether the cluster spec names server `ps`.
    pub fn is_spec_server(&self, ps: u32) -> bool {
        self.server_set.is_spec_server(ps)
    }

    fn addresses_in_job(&self) -> Vec<(u32, String)> {
        self.resharding
            .addresses
            .iter()
            .filter(|(ps, _)| self.server_set.contains(**ps))
            .map(|(ps, addr)| (*ps, addr.clone()))
            .collect()
    }

    /// Whether `ps` is not a server of the job: it left, its join has not been carried out
    /// yet, or it never asked to join (its registration is still on its way, or it asked to
    /// leave before it arrived). What it says of itself (up, answering) changes nothing: a
    /// server outside the job is never pinned by a restore or waited on.
    /// (A machine given no cluster spec, [`Scheduler::with_servers`], learns its servers from
    /// their hellos: there only a server that left or whose join waits is outside.)
    pub(super) fn outside_job(&self, ps: u32) -> bool {
        let r = &self.resharding;
        if self.server_set.contains(ps) {
            return false;
        }
        self.server_set.has_spec()
            || r.left.contains_key(&ps)
            || r.pending.joining.contains_key(&ps)
            || r.cutting
                .as_ref()
                .is_some_and(|c| c.joining.contains_key(&ps))
    }

    /// Incarnation `incarnation` of `ps` was declared dead before its join was carried out: the
    /// join is called off, so that the move does not wait on a server that is gone (a new
    /// incarnation that registers joins again). Returns whether a join was called off.
    pub(super) fn call_off_join(&mut self, ps: u32, incarnation: u64) -> bool {
        let r = &mut self.resharding;
        let mut called_off = false;
        for changes in [Some(&mut r.pending), r.cutting.as_mut()]
            .into_iter()
            .flatten()
        {
            if changes
                .joining
                .get(&ps)
                .is_some_and(|(e, _)| *e == incarnation)
            {
                changes.joining.remove(&ps);
                called_off = true;
            }
        }
        if called_off {
            tracing::warn!(
                "ps/{ps} (incarnation {incarnation}) died before its join was carried out: the join is \
                 called off"
            );
        }
        called_off
    }

    /// The newest incarnation of `ps` that asked to leave (pending, at the cut, or moving) or
    /// left the job.
    fn leaving_incarnation(&self, ps: u32) -> Option<u64> {
        let r = &self.resharding;
        [Some(&r.pending), r.cutting.as_ref(), r.moving.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|changes| changes.leaving.get(&ps).copied())
            .chain(r.left.get(&ps).copied())
            .max()
    }

    /// Whether a join or leave was asked for and has not ended yet.
    pub fn server_changes_pending(&self) -> bool {
        !self.resharding.pending.is_empty() || self.reshard_under_way()
    }

    /// Whether servers are being changed (a cut for it, or the move after it, under way):
    /// new variables wait.
    pub(super) fn reshard_under_way(&self) -> bool {
        self.resharding.cutting.is_some() || self.resharding.moving.is_some()
    }

    /// Starts the cut for the changes asked for, once nothing else holds the servers (part of
    /// every dispatch).
    pub(super) fn advance_reshard(&mut self, now: Instant) {
        let r = &self.resharding;
        if r.pending.is_empty() || r.cutting.is_some() || r.moving.is_some() {
            return;
        }
        if self.preemption.holds()
            || self.recovery.is_some()
            || self.start.under_way()
            || !self.servers_accounted()
            || !self.creates.is_empty()
            || self.preemption.stopping
        {
            return;
        }
        let Some(root) = self.preemption.root() else {
            return;
        };
        let changes = std::mem::take(&mut self.resharding.pending);
        tracing::info!(
            "taking a checkpoint cut to move the variables: {}",
            describe(&changes)
        );
        self.resharding.cutting = Some(changes);
        self.begin_cut_at_once(now, root);
    }

    /// The cut for the changes under way was taken and marked (`taken`), or given up.
    pub(super) fn reshard_cut_ended(&mut self, now: Instant, taken: bool) {
        let Some(mut changes) = self.resharding.cutting.take() else {
            return;
        };
        if taken && changes.is_empty() {
            // Every change was called off while the cut was taken: nothing moves.
            return;
        }
        if taken {
            self.move_servers(now, changes);
            return;
        }
        changes.attempts += 1;
        if changes.attempts < RESHARD_ATTEMPTS_MAX {
            // Tried again at the next dispatch, with any change asked for since.
            let pending = &mut self.resharding.pending;
            let mut out_now = BTreeMap::new();
            for (ps, join) in changes.joining {
                match pending.leaving.remove(&ps) {
                    // Asked to leave while its join was under way: it never joined, and may
                    // go now.
                    Some(incarnation) if !self.server_set.contains(ps) => {
                        out_now.insert(ps, incarnation);
                    }
                    Some(incarnation) => {
                        pending.leaving.insert(ps, incarnation);
                    }
                    None => {
                        pending.joining.entry(ps).or_insert(join);
                    }
                }
            }
            pending.attempts = pending.attempts.max(changes.attempts);
            for (ps, incarnation) in changes.leaving {
                self.ask_leave(ps, incarnation);
            }
            self.answer_leaving(out_now, Ok(()));
            return;
        }
        tracing::error!(
            "gave up moving the variables after {RESHARD_ATTEMPTS_MAX} cuts could not be \
             taken: {}",
            describe(&changes)
        );
        let reason = LeaveFailure::NoCut {
            tries: RESHARD_ATTEMPTS_MAX,
        };
        self.answer_leaving(changes.leaving, Err(reason));
    }

    /// The restore after a move ended (`Ok`), or the recovery failed (why): the servers that
    /// left are answered.
    pub(super) fn reshard_restore_ended(&mut self, result: Result<(), LeaveFailure>) {
        let Some(changes) = self.resharding.moving.take() else {
            return;
        };
        if result.is_ok() {
            self.resharding.done += 1;
            tracing::info!(
                "the variables are on parameter servers {:?} now ({})",
                self.server_set.indexes(),
                describe(&changes)
            );
        }
        self.answer_leaving(changes.leaving, result);
    }

    /// Step 2 of the module doc: the new set, the variables placed again, and a restore of
    /// every server from the cut just marked.
    fn move_servers(&mut self, now: Instant, changes: ServerChanges) {
        let before = self.server_set.indexes().len();
        for ps in changes.leaving.keys() {
            self.server_set.leave(*ps);
            self.servers.remove(ps);
            self.resharding.addresses.remove(ps);
            if let Some(incarnation) = changes.leaving.get(ps) {
                self.resharding.left.insert(*ps, *incarnation);
            }
            if let Some(r) = self.recovery.as_mut() {
                r.state_lost.remove(ps);
            }
        }
        for (&ps, (incarnation, addr)) in &changes.joining {
            self.server_set.join(ps);
            self.resharding.left.remove(&ps);
            let entry = self.servers.entry(ps).or_insert(PsEntry {
                incarnation: *incarnation,
                alive: true,
                dead: false,
            });
            if *incarnation > entry.incarnation {
                *entry = PsEntry {
                    incarnation: *incarnation,
                    alive: true,
                    dead: false,
                };
            }
            self.resharding.addresses.insert(ps, addr.clone());
        }
        let servers: Vec<u32> = self.server_set.indexes().iter().copied().collect();
        self.setup.layouts = place_again(&self.setup.layouts, before, &servers);
        self.setup.servers = self.addresses_in_job();
        self.setup_version += 1;
        // Every server of the new set gets its new shards from the cut: a restore.
        self.recovery(now).state_lost.extend(servers);
        self.resharding.moving = Some(changes);
    }

    /// Records incarnation `incarnation` of `ps` leaving at the next cut; another incarnation's
    /// request it replaces is answered (the older one is gone, or about to be).
    fn ask_leave(&mut self, ps: u32, incarnation: u64) {
        let leaving = &mut self.resharding.pending.leaving;
        let (kept, other) = match leaving.get(&ps).copied() {
            Some(known) if known > incarnation => (known, Some(incarnation)),
            Some(known) if known < incarnation => (incarnation, Some(known)),
            _ => (incarnation, None),
        };
        leaving.insert(ps, kept);
        if let Some(other) = other {
            let reason = LeaveFailure::NewerIncarnation { ps, newer: kept };
            self.answer_leaving(BTreeMap::from([(ps, other)]), Err(reason));
        }
    }

    fn answer_leaving(&mut self, leaving: BTreeMap<u32, u64>, result: Result<(), LeaveFailure>) {
        for (ps, incarnation) in leaving {
            // The answer crosses the wire: the reason goes as text.
            let result = match &result {
                Ok(()) => Ok(()),
                Err(reason) => Err(DrainRefusal::Failed {
                    ps,
                    reason: reason.to_string(),
                }),
            };
            self.actions.push_back(SchedulerAction::AnswerPsDraining {
                ps,
                incarnation,
                result,
            });
        }
    }
}

fn describe(changes: &ServerChanges) -> String {
    let names = |ids: Vec<u32>| {
        ids.iter()
            .map(|ps| format!("ps/{ps}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut parts = Vec::new();
    if !changes.joining.is_empty() {
        parts.push(format!(
            "{} joining",
            names(changes.joining.keys().copied().collect())
        ));
    }
    if !changes.leaving.is_empty() {
        parts.push(format!(
            "{} leaving",
            names(changes.leaving.keys().copied().collect())
        ));
    }
    parts.join("; ")
}
