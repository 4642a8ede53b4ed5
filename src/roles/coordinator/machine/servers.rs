//! The coordinator machine's control plane towards parameter servers, apart from recovery:
//! creating a variable's shards, and the chief's start (probing every server, then restoring
//! the newest checkpoint through the restore sub-machine, or starting afresh).
//!
//! Creating a variable ([`Scheduler::handle_create_variable`]):
//! 1. one [`SchedulerAction::CreateShard`] per shard, to the server the layout places it on;
//! 2. each answered with [`Scheduler::handle_shard_created`]; a server not reachable (not
//!    started yet, restarting, its name not resolving yet) is asked again after
//!    [`START_PROBE_BACKOFF`], within `ps_restart_wait` of the request (creating a shard is
//!    idempotent on the server), a refusal fails the creation at once;
//! 3. [`SchedulerAction::VariableCreated`] once every shard answered: `Ok`, or the first
//!    failure (the program hears it).
//!
//! The chief's start ([`Scheduler::handle_start`]):
//! 1. one [`SchedulerAction::ProbeServer`] per server, each answered with
//!    [`Scheduler::handle_server_probed`] (its incarnation, restore generation and the closure
//!    ids it has applied); one not reachable yet is probed again after a pause, within
//!    `ps_restart_wait`;
//! 2. once every server answered: with a checkpoint, the restore at start-up
//!    ([`Scheduler::handle_restore_at_start`]) to the incarnations that answered; without
//!    one, a start afresh only over servers that applied nothing (servers that trained under
//!    an earlier chief would see their closure ids reused, PS-1, and hold state no ledger
//!    accounts for). Where a server holds variables, an earlier chief's closure may still be
//!    on its way from a paused worker: a restore run with no checkpoint first opens a
//!    generation of this chief's own on every server (refusing such pushes from then on) and
//!    rewinds the workers, then every server is probed again, and the start is afresh only
//!    if none applied anything meanwhile;
//! 3. [`SchedulerAction::RestoreFinished`] with the start's ticket: the step restored, `None`
//!    for a start afresh, or why the chief cannot start.
//!
//! A server lost before the start (between the program's creation of its variables and the
//! start's fence, seen by the failure detector or by the start's probes as a new process that
//! holds none of them) is given the variables again and the start probes every server again
//! (`created_again.rs`): no chief restart.
//!
//! Pure: no IO, no clock; `now` is passed in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::control::REQUESTS_PENDING_MAX;
use super::recovery::{CallFault, CheckpointSource, RunEnd};
use super::reshard::RESHARDING;
use super::{
    ActiveRun, Purpose, RestoreTicket, Scheduler, SchedulerAction, ServerProbe, StartFailure,
};
use crate::checkpoint::Checkpoint;
use crate::layout::Layout;
use crate::ledger::ClosureId;
use crate::roles::protocol::{CreateVariable, InitSpec};

/// Why a variable's creation was refused, or failed on a server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CreateError {
    /// A variable of that name exists, or is being created.
    #[error("variable {name:?} is created twice")]
    Twice {
        /// The variable.
        name: String,
    },
    /// The initial values do not match the layout's shards.
    #[error("variable {name:?} has {shards} shards but {inits} initial values")]
    InitsMismatch {
        /// The variable.
        name: String,
        /// Shards in its layout.
        shards: usize,
        /// Initial values given.
        inits: usize,
    },
    /// A shard is placed on a server the job does not have.
    #[error(
        "variable {name:?} places a shard on ps/{ps}, but the job's parameter servers are {servers:?}"
    )]
    UnknownServer {
        /// The variable.
        name: String,
        /// The server named.
        ps: u32,
        /// The job's servers.
        servers: Vec<u32>,
    },
    /// The job's servers are being resharded: the layout would be made for servers that are
    /// changing. Refused for now; the client asks again.
    #[error("{RESHARDING}: variable {name:?} is created once the servers are resharded")]
    Resharding {
        /// The variable.
        name: String,
    },
    /// Too many creations are under way.
    #[error("{max} variable creations are under way already")]
    TooMany {
        /// The limit.
        max: usize,
    },
    /// A server did not create its shard.
    #[error("ps/{ps} did not create {name:?} (within {wait:?}): {fault}")]
    Server {
        /// The server.
        ps: u32,
        /// The variable.
        name: String,
        /// How long an unreachable server was waited for.
        wait: Duration,
        /// What it answered, or why it could not be reached.
        fault: String,
    },
}

/// Names a variable's creation asked for with [`Scheduler::handle_create_variable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CreateTicket(pub u64);

/// A variable whose shards are being created.
#[derive(Debug)]
pub(super) struct PendingCreate {
    /// The variable, or what the creation is for.
    name: String,
    /// The program's creation, or shards created again on a server lost before the start.
    again_before_start: bool,
    since: Instant,
    /// Per shard, its server and the request (sent again while it is not reachable).
    requests: BTreeMap<usize, (u32, CreateVariable)>,
    /// Shard indexes not answered yet.
    waiting: BTreeSet<usize>,
    /// Shards whose server could not be reached, and when to ask again.
    again_at: BTreeMap<usize, Instant>,
    /// The first failure.
    failed: Option<CreateError>,
}

/// The variables whose shards are being created, by ticket (the creation sub-machine's state:
/// each one's requests, the shards awaited, the pauses before asking an unreachable server
/// again, and the first failure).
#[derive(Debug, Default)]
pub(super) struct Creates {
    pending: BTreeMap<CreateTicket, PendingCreate>,
    /// Every shard the program created (server and request) while the chief's start had not
    /// ended well: a server lost before it is given them again (`created_again.rs`). Dropped
    /// once the servers are accounted for (the start ended well, or the program scheduled).
    made: Vec<(u32, CreateVariable)>,
}

impl Creates {
    /// The shards created on `servers` so far (by finished creations, and by those still
    /// under way that a server answered), each with its server and request.
    pub(super) fn made_on(&self, servers: &BTreeSet<u32>) -> Vec<(u32, CreateVariable)> {
        let answered = self
            .pending
            .values()
            .filter(|p| !p.again_before_start)
            .flat_map(|p| {
                p.requests
                    .iter()
                    .filter(|(shard, _)| !p.waiting.contains(shard))
                    .map(|(_, request)| request)
            });
        self.made
            .iter()
            .chain(answered)
            .filter(|(ps, _)| servers.contains(ps))
            .cloned()
            .collect()
    }

    /// Forgets the shards kept for a server lost before the start.
    pub(super) fn forget_made(&mut self) {
        self.made = Vec::new();
    }

    /// Whether a variable named `name` is being created.
    fn naming(&self, name: &str) -> bool {
        self.pending
            .values()
            .any(|c| !c.again_before_start && c.name == name)
    }

    /// Whether no creation is under way.
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// When a shard whose server could not be reached is asked again.
    fn deadline(&self) -> Option<Instant> {
        self.pending
            .values()
            .flat_map(|p| p.again_at.values())
            .min()
            .copied()
    }

    /// The shards whose pause is over at `now`, to ask again: (ticket, server, shard, request).
    fn due(&mut self, now: Instant) -> Vec<(CreateTicket, u32, usize, CreateVariable)> {
        let mut again = Vec::new();
        for (ticket, pending) in self.pending.iter_mut() {
            let due: Vec<usize> = pending
                .again_at
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|(shard, _)| *shard)
                .collect();
            for shard in due {
                pending.again_at.remove(&shard);
                if let Some((ps, msg)) = pending.requests.get(&shard) {
                    again.push((*ticket, *ps, shard, msg.clone()));
                }
            }
        }
        again
    }

    /// Takes creation `ticket` out once every shard answered: how it ended, and whether it
    /// created shards again on a server lost before the start. A program's creation that
    /// ended well is kept (`made`) while `keep`.
    fn take_finished(
        &mut self,
        ticket: CreateTicket,
        keep: bool,
    ) -> Option<(Result<(), CreateError>, bool)> {
        if !self
            .pending
            .get(&ticket)
            .is_some_and(|p| p.waiting.is_empty())
        {
            return None;
        }
        let pending = self.pending.remove(&ticket)?;
        let again = pending.again_before_start;
        match pending.failed {
            Some(e) => Some((Err(e), again)),
            None => {
                if keep && !again {
                    self.made.extend(pending.requests.into_values());
                }
                Some((Ok(()), again))
            }
        }
    }

    /// Creates `requests` (server and request each) again under `ticket`, from `now` (a
    /// server not reachable is asked again within `ps_restart_wait` of it): the actions.
    pub(super) fn create_again(
        &mut self,
        now: Instant,
        ticket: CreateTicket,
        requests: Vec<(u32, CreateVariable)>,
    ) -> Vec<SchedulerAction> {
        let requests: BTreeMap<usize, (u32, CreateVariable)> =
            requests.into_iter().enumerate().collect();
        let actions = requests
            .iter()
            .map(|(&shard, (ps, msg))| SchedulerAction::CreateShard {
                ticket,
                ps: *ps,
                shard,
                msg: msg.clone(),
            })
            .collect();
        self.pending.insert(
            ticket,
            PendingCreate {
                name: "(the shards of a server lost before the chief's start)".into(),
                again_before_start: true,
                since: now,
                waiting: requests.keys().copied().collect(),
                requests,
                again_at: BTreeMap::new(),
                failed: None,
            },
        );
        actions
    }
}

/// The chief's start, waiting for every server's probe.
#[derive(Debug)]
pub(super) struct PendingStart {
    ticket: RestoreTicket,
    /// These are the probes after a start afresh opened its generation ([`Purpose::FreshStart`]):
    /// they say whether an earlier chief's push slipped in before it.
    verifying: bool,
    checkpoint: Option<Arc<Checkpoint>>,
    root: PathBuf,
    since: Instant,
    probes: BTreeMap<u32, ServerProbe>,
    /// Servers with a probe out.
    out: BTreeSet<u32>,
    /// Servers that could not be reached, and when to probe them again.
    again_at: BTreeMap<u32, Instant>,
    /// Held for a recovery before the start (`created_again.rs`): every server is probed
    /// again once it ended.
    held: bool,
}

impl PendingStart {
    /// Start `ticket` (afresh, from `root`, since `since`) held for a recovery before it.
    fn held(ticket: RestoreTicket, root: PathBuf, since: Instant) -> Self {
        PendingStart {
            ticket,
            verifying: false,
            checkpoint: None,
            root,
            since,
            probes: BTreeMap::new(),
            out: BTreeSet::new(),
            again_at: BTreeMap::new(),
            held: true,
        }
    }
}

/// The chief's start (its sub-machine's state): the start while its probes are out, and
/// whether it ended well.
#[derive(Debug, Default)]
pub(super) struct ChiefStart {
    pending: Option<PendingStart>,
    /// The start ended well (restored, or afresh): what the servers hold is this
    /// coordinator's to account for (see [`Scheduler::servers_accounted`]).
    ended_well: bool,
    /// How often the start found a server emptied since the creation and had its variables
    /// created again (bounded by [`START_CREATE_AGAIN_MAX`]: a server that keeps restarting
    /// fails the start as lost).
    created_again: u32,
}

/// What a server's answer to the start's probe did ([`ChiefStart::probe_answered`]).
enum ProbeAnswered {
    /// Not for the start under way, or answered already.
    Ignored,
    /// Recorded: every server may have answered now.
    Recorded,
    /// Not reachable yet: probed again after a pause.
    Again,
    /// The start fails: the chief cannot know what the server holds.
    Failed(String),
}

impl ChiefStart {
    /// Whether the start's probes are out.
    pub(super) fn under_way(&self) -> bool {
        self.pending.is_some()
    }

    /// Whether the start ended well.
    pub(super) fn ended_well(&self) -> bool {
        self.ended_well
    }

    /// Whether the start may have an emptied server's variables created again once more
    /// (counting this time).
    fn may_create_again(&mut self) -> bool {
        self.created_again += 1;
        self.created_again <= START_CREATE_AGAIN_MAX
    }

    /// Whether the start's probes are those after its fence (a start afresh over servers
    /// that hold variables).
    pub(super) fn verifying(&self) -> bool {
        self.pending.as_ref().is_some_and(|s| s.verifying)
    }

    /// Holds the start for a recovery before it (`created_again.rs`); false where the start
    /// is past its fence, or none is under way.
    fn hold(&mut self) -> bool {
        match self.pending.as_mut().filter(|s| !s.verifying) {
            Some(start) => {
                start.held = true;
                true
            }
            None => false,
        }
    }

    /// A start held for a recovery probes `servers` again (what each answered before may be
    /// gone, or created again since): its ticket, where it was held.
    pub(super) fn probe_again_if_held(&mut self, servers: &BTreeSet<u32>) -> Option<RestoreTicket> {
        let start = self.pending.as_mut().filter(|s| s.held)?;
        start.held = false;
        start.probes.clear();
        start.again_at.clear();
        start.out = servers.clone();
        Some(start.ticket)
    }

    /// The start's restore of a checkpoint ended well.
    pub(super) fn restored(&mut self) {
        self.ended_well = true;
    }

    /// When a server the start could not reach is due to be probed again.
    fn deadline(&self) -> Option<Instant> {
        self.pending.as_ref()?.again_at.values().min().copied()
    }

    /// The servers whose pause is over at `now`, probed again: the start's ticket and each.
    fn due(&mut self, now: Instant) -> Vec<(RestoreTicket, u32)> {
        let Some(start) = self.pending.as_mut() else {
            return Vec::new();
        };
        let due: Vec<u32> = start
            .again_at
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(ps, _)| *ps)
            .collect();
        for ps in &due {
            start.again_at.remove(ps);
            start.out.insert(*ps);
        }
        due.into_iter().map(|ps| (start.ticket, ps)).collect()
    }

    /// Server `ps`'s answer (`result`) to the probe of start `ticket` at `now`; `bound`: how
    /// long an unreachable server is probed again.
    fn probe_answered(
        &mut self,
        now: Instant,
        ticket: RestoreTicket,
        ps: u32,
        result: Result<ServerProbe, CallFault>,
        bound: Duration,
    ) -> ProbeAnswered {
        let Some(start) = self.pending.as_mut().filter(|s| s.ticket == ticket) else {
            return ProbeAnswered::Ignored;
        };
        if !start.out.remove(&ps) {
            return ProbeAnswered::Ignored;
        }
        let fault = match result {
            Ok(probe) => {
                start.probes.insert(ps, ServerProbe { ps, ..probe });
                return ProbeAnswered::Recorded;
            }
            Err(CallFault::Unreachable(reason)) if now < start.since + bound => {
                tracing::debug!("ps/{ps} did not answer the chief's probe yet: {reason}");
                start.again_at.insert(ps, now + START_PROBE_BACKOFF);
                return ProbeAnswered::Again;
            }
            Err(CallFault::Unreachable(reason)) => {
                format!("it could not be reached within {bound:?} (ps_restart_wait): {reason}")
            }
            Err(fault) => fault.to_string(),
        };
        self.pending = None;
        ProbeAnswered::Failed(fault)
    }

    /// Takes the start out once all `servers` answered its probe.
    fn take_answered(&mut self, servers: usize) -> Option<PendingStart> {
        if self
            .pending
            .as_ref()
            .is_none_or(|s| s.probes.len() < servers)
        {
            return None;
        }
        self.pending.take()
    }
}

/// Most times one start has the variables of a server emptied since their creation created
/// again before it fails as a server lost.
const START_CREATE_AGAIN_MAX: u32 = 3;

/// Pause before probing again a server that could not be reached at the chief's start.
pub const START_PROBE_BACKOFF: Duration = Duration::from_millis(200);

impl Scheduler {
    /// Creates every shard of `layout` on the server it is placed on, shard `i` starting as
    /// `inits[i]` ([`SchedulerAction::CreateShard`]); [`SchedulerAction::VariableCreated`]
    /// with the returned ticket tells how it ended. Refused for a name created (or being
    /// created) already, an `inits` that does not match the shards, a shard on a server the
    /// cluster does not have, or more than `REQUESTS_PENDING_MAX` creations under way.
    pub fn handle_create_variable(
        &mut self,
        now: Instant,
        layout: &Layout,
        inits: Vec<InitSpec>,
    ) -> Result<CreateTicket, CreateError> {
        let name = &layout.name;
        if self.setup.layouts.iter().any(|l| &l.name == name) || self.creates.naming(name) {
            return Err(CreateError::Twice { name: name.clone() });
        }
        if inits.len() != layout.shards.len() {
            return Err(CreateError::InitsMismatch {
                name: name.clone(),
                shards: layout.shards.len(),
                inits: inits.len(),
            });
        }
        if let Some(shard) = layout
            .shards
            .iter()
            .find(|s| !self.server_set.contains(s.ps))
        {
            return Err(CreateError::UnknownServer {
                name: name.clone(),
                ps: shard.ps,
                servers: self.server_set.indexes().iter().copied().collect(),
            });
        }
        if self.reshard_under_way() {
            return Err(CreateError::Resharding { name: name.clone() });
        }
        if self.creates.pending.len() >= REQUESTS_PENDING_MAX {
            return Err(CreateError::TooMany {
                max: REQUESTS_PENDING_MAX,
            });
        }
        let ticket = CreateTicket(self.next_ticket);
        self.next_ticket += 1;
        let mut requests = BTreeMap::new();
        for (shard, (placed, init)) in layout.shards.iter().zip(inits).enumerate() {
            let msg = CreateVariable {
                name: layout.shard_name(shard),
                shape: layout
                    .shard_shape(shard)
                    .iter()
                    .map(|&d| d as u64)
                    .collect(),
                init,
            };
            self.actions.push_back(SchedulerAction::CreateShard {
                ticket,
                ps: placed.ps,
                shard,
                msg: msg.clone(),
            });
            requests.insert(shard, (placed.ps, msg));
        }
        let pending = PendingCreate {
            name: name.clone(),
            again_before_start: false,
            since: now,
            requests,
            waiting: (0..layout.shards.len()).collect(),
            again_at: BTreeMap::new(),
            failed: None,
        };
        self.creates.pending.insert(ticket, pending);
        self.finish_create(now, ticket);
        Ok(ticket)
    }

    /// The answer of server `ps` to the [`SchedulerAction::CreateShard`] of shard `shard`: a
    /// server not reachable is asked again after a pause, within `ps_restart_wait`.
    pub fn handle_shard_created(
        &mut self,
        now: Instant,
        ticket: CreateTicket,
        ps: u32,
        shard: usize,
        result: Result<(), CallFault>,
    ) {
        let wait = self.config.ps_restart_wait_max;
        let Some(pending) = self.creates.pending.get_mut(&ticket) else {
            return;
        };
        if !pending.waiting.contains(&shard) || pending.again_at.contains_key(&shard) {
            return;
        }
        match result {
            Err(CallFault::Unreachable(reason)) if now < pending.since + wait => {
                tracing::info!(
                    "ps/{ps} not reachable to create {:?} yet ({reason}); asking again",
                    pending.name
                );
                pending.again_at.insert(shard, now + START_PROBE_BACKOFF);
                return;
            }
            Err(fault) => {
                let name = &pending.name;
                pending.failed.get_or_insert_with(|| CreateError::Server {
                    ps,
                    name: name.clone(),
                    wait,
                    fault: fault.to_string(),
                });
            }
            Ok(()) => {}
        }
        pending.waiting.remove(&shard);
        self.finish_create(now, ticket);
    }

    /// When a shard whose server could not be reached is asked again.
    pub(super) fn create_deadline(&self) -> Option<Instant> {
        self.creates.deadline()
    }

    /// Asks again for the shards whose pause is over (part of `handle_timeout`).
    pub(super) fn create_again(&mut self, now: Instant) {
        for (ticket, ps, shard, msg) in self.creates.due(now) {
            self.actions.push_back(SchedulerAction::CreateShard {
                ticket,
                ps,
                shard,
                msg,
            });
        }
    }

    fn finish_create(&mut self, now: Instant, ticket: CreateTicket) {
        let keep = !self.servers_accounted();
        match self.creates.take_finished(ticket, keep) {
            Some((result, false)) => self
                .actions
                .push_back(SchedulerAction::VariableCreated { ticket, result }),
            Some((result, true)) => self.created_again(now, ticket, result),
            None => {}
        }
    }

    /// The chief's start: probes every parameter server ([`SchedulerAction::ProbeServer`]),
    /// then restores `checkpoint` (the newest that verifies under `root`, if any) onto the
    /// incarnations that answered, or starts afresh; [`SchedulerAction::RestoreFinished`] with
    /// the returned ticket tells how it ended (see the module doc). Refused if anything was
    /// scheduled, or a start or a restore is under way; a recovery of a server lost before it
    /// holds it until it ended (`created_again.rs`).
    pub fn handle_start(
        &mut self,
        now: Instant,
        checkpoint: Option<Arc<Checkpoint>>,
        root: PathBuf,
    ) -> Result<RestoreTicket, StartFailure> {
        if self.next_id != 0 || !self.closures.is_empty() {
            return Err(StartFailure::AfterScheduling);
        }
        if self.start.under_way() {
            return Err(StartFailure::StartUnderWay);
        }
        // A recovery before the start (a server lost while the program created its
        // variables) holds the start until it ended; a restore under way refuses it.
        if self.recovery.as_ref().is_some_and(|r| r.restoring()) {
            return Err(StartFailure::RecoveryUnderWay);
        }
        let ticket = RestoreTicket(self.next_ticket);
        self.next_ticket += 1;
        for ps in self.server_set.indexes().clone() {
            self.actions
                .push_back(SchedulerAction::ProbeServer { ticket, ps });
        }
        self.start.pending = Some(PendingStart {
            ticket,
            verifying: false,
            checkpoint,
            root,
            since: now,
            probes: BTreeMap::new(),
            out: self.server_set.indexes().clone(),
            again_at: BTreeMap::new(),
            held: false,
        });
        // Notices that waited for the start leave now, as those during it do.
        self.advance_waiting_notices(now);
        self.finish_start(now);
        Ok(ticket)
    }

    /// The answer of server `ps` to the [`SchedulerAction::ProbeServer`] of start `ticket`. A
    /// server that could not be reached (not up yet, restarting) is probed again after
    /// `START_PROBE_BACKOFF`, for as long as a lost server may take to come back
    /// (`ps_restart_wait`); past that, or at a refusal, the start fails: the chief cannot know
    /// what the server holds.
    pub fn handle_server_probed(
        &mut self,
        now: Instant,
        ticket: RestoreTicket,
        ps: u32,
        result: Result<ServerProbe, CallFault>,
    ) {
        let bound = self.config.ps_restart_wait_max;
        let fault = match self.start.probe_answered(now, ticket, ps, result, bound) {
            ProbeAnswered::Ignored | ProbeAnswered::Again => return,
            ProbeAnswered::Recorded => return self.finish_start(now),
            ProbeAnswered::Failed(fault) => fault,
        };
        let result = Err(StartFailure::Failed(format!(
            "parameter server ps/{ps} did not answer the chief's probe: {fault}"
        )));
        self.actions
            .push_back(SchedulerAction::RestoreFinished { ticket, result });
    }

    /// When a server the start could not reach is due to be probed again.
    pub(super) fn start_deadline(&self) -> Option<Instant> {
        self.start.deadline()
    }

    /// Probes again the servers whose pause is over (part of `handle_timeout`).
    pub(super) fn probe_again(&mut self, now: Instant) {
        for (ticket, ps) in self.start.due(now) {
            self.actions
                .push_back(SchedulerAction::ProbeServer { ticket, ps });
        }
    }

    fn finish_start(&mut self, now: Instant) {
        // A recovery before the start (a server lost, its variables being created again):
        // the start waits for it, then probes every server again.
        if self.recovery.as_ref().is_some_and(|r| !r.restoring()) && self.start.hold() {
            return;
        }
        let Some(start) = self.start.take_answered(self.server_set.indexes().len()) else {
            return;
        };
        let ticket = start.ticket;
        let probes: Vec<ServerProbe> = start.probes.into_values().collect();
        let Some(checkpoint) = start.checkpoint else {
            // A server mid-restore may hold a checkpoint's shards (their closures' effects),
            // whatever it applied since its start.
            let trained = probes
                .iter()
                .find(|p| p.next_free_closure_id > 0 || p.restoring);
            // A server that holds nothing where this chief created variables, beside servers
            // that hold them, restarted since their creation: training would find it lost with
            // no checkpoint to restore it from. A restarted chief creates them again (found by
            // the simulator once its chief program created its variables before each start: a
            // server killed between the creation and the probes, and the program's first save
            // then waited for it). Where no server holds anything, nothing tells a program
            // that restores before it creates from servers that all restarted: as before.
            let any_serving = probes.iter().any(|p| p.serving);
            let emptied = probes.iter().find(|p| {
                any_serving && !p.serving && self.holds_shards_of_created_variables(p.ps)
            });
            let result = match (trained, emptied) {
                // A server that restarted unnoticed since the creation gets the variables
                // again (`created_again.rs`), then every server is probed again.
                (None, Some(p))
                    if !start.verifying
                        && !self.creates.made_on(&BTreeSet::from([p.ps])).is_empty()
                        && self.start.may_create_again() =>
                {
                    self.recovery(now).state_lost.insert(p.ps);
                    self.start.pending = Some(PendingStart::held(ticket, start.root, start.since));
                    self.dispatch(now);
                    return;
                }
                (Some(p), _) => Err(StartFailure::TrainedWithoutCheckpoint {
                    root: start.root.clone(),
                    ps: p.ps,
                    next_free_closure_id: p.next_free_closure_id,
                    generation: p.generation,
                }),
                (None, Some(p)) => Err(StartFailure::ServerLost {
                    ps: p.ps,
                    reason: format!(
                        "it holds none of the variables this chief created on it (incarnation \
                         {} restarted after their creation); a restarted chief creates them again",
                        p.incarnation
                    ),
                }),
                // Servers that hold variables may yet take a push of a closure an earlier
                // chief dispatched (its worker paused): a generation of this chief's own
                // refuses those first (found by the simulator: seed 19028587 of 1 worker, 1
                // server and 14 faults, where such a push applied after the probes and the new
                // chief gave its closure id out again).
                (None, None) if !start.verifying && probes.iter().any(|p| p.serving) => {
                    match self.fence_fresh_start(now, ticket, start.root, &probes) {
                        Ok(()) => return,
                        Err(e) => Err(e),
                    }
                }
                (None, None) => Ok(None),
            };
            self.start.ended_well = result.is_ok();
            self.actions
                .push_back(SchedulerAction::RestoreFinished { ticket, result });
            // What waited for the start (servers joining or leaving) may go on.
            self.dispatch(now);
            return;
        };
        let servers = self.server_set.indexes().clone();
        if let Err(e) =
            self.restore_at_start(now, ticket, checkpoint, start.root, &probes, &servers)
        {
            self.actions.push_back(SchedulerAction::RestoreFinished {
                ticket,
                result: Err(e),
            });
        }
    }

    /// Whether a variable this chief created (the setup's layouts) has a shard on server `ps`.
    fn holds_shards_of_created_variables(&self, ps: u32) -> bool {
        self.setup
            .layouts
            .iter()
            .any(|l| l.shards.iter().any(|s| s.ps == ps))
    }

    /// A start afresh over servers that hold variables: a restore run with no checkpoint
    /// opens a generation above every server's (so that no push of an earlier chief's closure
    /// applies from then on) and rewinds the live workers to the start of their data; then
    /// [`Self::fresh_start_fenced`] probes the servers again.
    fn fence_fresh_start(
        &mut self,
        now: Instant,
        ticket: RestoreTicket,
        root: PathBuf,
        probes: &[ServerProbe],
    ) -> Result<(), StartFailure> {
        if self.recovery.is_some() {
            return Err(StartFailure::RecoveryUnderWay);
        }
        let (run, calls) = self.start_run_over(probes, ClosureId(0), CheckpointSource::Afresh);
        self.recovery(now).run = Some(ActiveRun {
            run,
            purpose: Purpose::FreshStart { ticket, root },
        });
        self.actions
            .extend(calls.into_iter().map(SchedulerAction::Restore));
        Ok(())
    }

    /// The run of [`Self::fence_fresh_start`] ended: where it went through, every server is
    /// probed again, and the start ends afresh only if none applied anything meanwhile (a
    /// push that slipped in before the generation opened), as [`Self::finish_start`] decides.
    pub(super) fn fresh_start_fenced(
        &mut self,
        now: Instant,
        ticket: RestoreTicket,
        root: PathBuf,
        end: RunEnd,
    ) {
        let result = match end {
            RunEnd::Done { .. } => {
                let servers = self.server_set.indexes().clone();
                for &ps in &servers {
                    self.actions
                        .push_back(SchedulerAction::ProbeServer { ticket, ps });
                }
                self.start.pending = Some(PendingStart {
                    ticket,
                    verifying: true,
                    checkpoint: None,
                    root,
                    since: now,
                    probes: BTreeMap::new(),
                    out: servers,
                    again_at: BTreeMap::new(),
                    held: false,
                });
                return self.finish_start(now);
            }
            RunEnd::Interrupted { ps, reason } => Err(StartFailure::ServerLost { ps, reason }),
            RunEnd::Failed { reason } | RunEnd::Unreadable { reason } => {
                Err(StartFailure::Failed(reason))
            }
        };
        self.actions
            .push_back(SchedulerAction::RestoreFinished { ticket, result });
    }
}
