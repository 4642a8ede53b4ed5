//! The elastic membership of a [`MultiWorkerMirrored`]: re-forming after a lost worker
//! ([`MultiWorkerMirrored::recover`]), the group's changes at a step boundary
//! ([`MultiWorkerMirrored::at_step_boundary`]: workers admitted after they asked to join,
//! workers leaving after a notice), agreeing on the training state, the status page's record
//! of each change, and what they report ([`ElasticState`], [`Recovery`], [`GroupChange`],
//! [`Departure`], [`Admission`]).

use std::sync::atomic::Ordering;

use candle_core::{Device, Tensor};
use cohort_transport::NodeId;

use super::config::check_same_settings;
use super::quorum::{no_quorum_detail, node_list};
use super::vote::{Ballot, CountedVote, Tally};
use super::{span_of, MultiWorkerMirrored, FLUSH_MAX};
use crate::cluster::node_id;
use crate::collective::boundary::{self, BoundaryChange, Leavers};
use crate::collective::reforming::{AttemptFailure, Probes, ReformStep, Reforming};
pub use crate::collective::Leave;
use crate::collective::{
    CollectiveError, FormFailed, GroupMember, Joiner, ProcessGroup, ProcessSpan,
};
use crate::optim::{LearningRateSchedule, OptimizerState, Slots};
use crate::process::Incarnation;
use crate::status::TaskState;
use crate::strategy::StrategyError;
use crate::variable::Variable;

impl MultiWorkerMirrored {
    /// Re-forms the workers' group with the survivors after a step failed because a worker
    /// was lost (elastic training, as Horovod Elastic and torchft do: no checkpoint is read,
    /// the survivors hold the model), and makes every survivor's training `state` identical.
    /// Call it on every survivor, in cross-replica context, once `run` (or `reduce`) failed
    /// with a collective error; then go on training from `state.step` and `state.position`
    /// with the new
    /// [`Strategy::num_replicas_in_sync`](crate::strategy::Strategy::num_replicas_in_sync)
    /// and input pipelines.
    ///
    /// Each attempt, bounded in time:
    /// 1. *Who survives*: this worker probes every member of the broken group
    ///    ([`ProcessGroup::reachable`]); the members that answer within `probe_timeout` (and
    ///    itself) are its survivors (each attempt probes the members of the group that broke,
    ///    not of a group an earlier attempt formed). Every survivor probes every member, so
    ///    the dead ones (one, two, any number at once) are left out by all. A live member that
    ///    does not answer in time (stopped, or starved) is left out too: the others go on
    ///    without it.
    /// 2. *Quorum*: a survivor forms the next generation only if its survivors are a quorum of the
    ///    members of the group that broke (`has_quorum`: more than half of them, or exactly
    ///    half with its lowest-ranked member, the chief or worker 0). Under a partition only
    ///    one side can have one: a survivor on the other side does not train on alone; its
    ///    attempt fails (another one follows, the partition may heal), and after
    ///    `recover_attempts` attempts `recover` fails with [`StrategyError::Recovery`] saying
    ///    "no quorum" and whom it reached: the process is to be restarted. A member whose
    ///    address answered the probe as a new process waiting to be admitted is not counted:
    ///    its old process is gone and is on no side. A new process answers so only once
    ///    every peer it asked to enter answered and none was a member of a group later than
    ///    the prober's (its old process may have been in that group, which left the prober
    ///    out); until then it counts as a member that did not answer. So survivors whose lost peers all came
    ///    back so go on, however few (a worker alone whose two peers were killed and
    ///    restarted), from their own state, and admit the new processes at the next step
    ///    boundary, instead of the job starting again from its checkpoint.
    /// 3. *Agreeing on them*: the survivors form the next generation with that list; forming
    ///    succeeds only where every member formed the same generation with the same members (each
    ///    link's join compares the lists), so survivors whose views differ (a member died
    ///    while being probed) all fail the attempt instead of splitting (a member refusing a
    ///    join whose list differs from its own fails its forming too, at once), and try again,
    ///    each attempt spanning at least the probe timeout, with a new probe at the next
    ///    generation. A member never mixes generations: a late message of the old group is refused by
    ///    its generation.
    ///
    ///    Each survivor decides the quorum on its own probes, and views may differ (under an
    ///    asymmetric partition A hears B while B does not hear A): that is safe because any
    ///    two lists that pass share a member of the broken group, and forming needs every
    ///    member of the list to form that same list at that generation; a member forms one group
    ///    at a time (forming a later one supersedes the earlier, whose collectives then fail
    ///    for want of it), so two groups never train side by side.
    /// 4. *Agreeing on the state*: the survivors gather their completed steps; the one with
    ///    the highest (ties: the lowest rank) is the source, since with a ring one survivor
    ///    may have applied a step's full all-reduce that another never got. Its step, input
    ///    position, optimizer step count, every variable of `state` and every optimizer slot
    ///    are broadcast to the others, which install them on every local replica: every
    ///    survivor holds the same bits again.
    ///
    /// An attempt that fails (no quorum, another worker lost while re-forming, the agreement
    /// on the state failing) is followed by the next, which begins a probe timeout after the
    /// failed one began. It probes the same broken group, except after a generation formed
    /// here whose agreement on the state failed: it probes that generation's members, since a
    /// member that agreed on the state before the failure measures its quorum on them from
    /// then on; after `recover_attempts` attempts
    /// it fails with [`StrategyError::Recovery`] naming the last error. These decisions (the
    /// verdict on the probes, when the next attempt begins, when to give up) are
    /// `collective::reforming`'s, taken alike by the member machine that the membership
    /// simulator drives. A group broken by an error that
    /// re-forming cannot mend ([`CollectiveError::Application`], mismatched calls, this
    /// worker stopping) fails with [`StrategyError::Recovery`] at once, and so does a worker
    /// that was left out (it comes back, say from SIGSTOP, after the others re-formed
    /// without it: a member's answer to its probe says so).
    pub fn recover(&mut self, state: &mut ElasticState<'_>) -> Result<Recovery, StrategyError> {
        let recovery = self.re_form(state)?;
        let lost: Vec<String> = recovery.lost.iter().map(ToString::to_string).collect();
        let what = if lost.is_empty() {
            "re-formed, no worker lost".to_string()
        } else {
            format!("lost {}", lost.join(", "))
        };
        self.note_change(recovery.step, &recovery.lost, TaskState::Dead, what);
        Ok(recovery)
    }

    /// The body of [`MultiWorkerMirrored::recover`], which also records the change for the
    /// status page.
    fn re_form(&mut self, state: &mut ElasticState<'_>) -> Result<Recovery, StrategyError> {
        let before = self.span.group().clone();
        let Some(cause) = before.broken() else {
            return Err(StrategyError::Recovery {
                reason: format!(
                    "the group of generation {} is not broken: there is nothing to recover from",
                    before.generation()
                ),
            });
        };
        if !recoverable(&cause) {
            return Err(StrategyError::Recovery {
                reason: format!("the group broke by an error re-forming cannot mend: {cause}"),
            });
        }
        let (limit, span) = (self.recover_attempts, self.probe_timeout);
        let now = std::time::Instant::now();
        let mut reforming = Reforming::new(before.clone(), now, limit, span);
        // What the last attempt failed with, for the error where the process gives up.
        let mut last = String::new();
        loop {
            let attempt = reforming.attempt();
            let probed = reforming.probed().clone();
            let found = self.probe(&probed);
            let now = std::time::Instant::now();
            let step = match found {
                Ok(found) => reforming.probes_answered(probed.members(), found, now),
                // No later attempt can bring it back: the others go on without it.
                Err(left_out) => {
                    return Err(StrategyError::Recovery {
                        reason: format!("this worker was left out: {left_out}"),
                    })
                }
            };
            let step = match step {
                ReformStep::Form { survivors } => {
                    match self.form_and_adopt(
                        &probed,
                        survivors,
                        (&before, &cause),
                        state,
                        attempt,
                    )? {
                        Formed::Trains(recovery) => return Ok(recovery),
                        Formed::AgreementFailed { error } => {
                            last = error;
                            let now = std::time::Instant::now();
                            reforming.agreement_failed(self.span.group().clone(), now)
                        }
                        Formed::FormingFailed { attempted, error } => {
                            last = error;
                            let attempted = attempted.map(|group| group.members().to_vec());
                            reforming.forming_failed(attempted, std::time::Instant::now())
                        }
                    }
                }
                other => other,
            };
            match step {
                // Taken above: what follows a forming is one of the others.
                ReformStep::Form { .. } => {}
                ReformStep::LeftOut(by) => {
                    return Err(StrategyError::Recovery {
                        reason: format!("this worker was left out by {by}"),
                    })
                }
                ReformStep::Retry { at, why } => {
                    last = failure_detail(&probed, why, last, attempt);
                    std::thread::sleep(at.saturating_duration_since(std::time::Instant::now()));
                    reforming.begin_next(std::time::Instant::now());
                }
                ReformStep::GiveUp { why } => {
                    let no_quorum = why.no_quorum();
                    let last = failure_detail(&probed, why, last, attempt);
                    let reason = if no_quorum {
                        format!("{last} (after {limit} attempt(s))")
                    } else {
                        format!("gave up after {limit} attempt(s); the last failed with: {last}")
                    };
                    return Err(StrategyError::Recovery { reason });
                }
            }
        }
    }

    /// Forms the next generation after `probed` with `survivors` and trains on with it
    /// ([`Self::adopt_reformed`]; `was`: the group that broke, and why): how the attempt
    /// ended, or the error no later attempt mends (a mismatch, or a group none of whose
    /// members holds the state).
    fn form_and_adopt(
        &mut self,
        probed: &ProcessGroup,
        survivors: Vec<NodeId>,
        (before, cause): (&ProcessGroup, &CollectiveError),
        state: &mut ElasticState<'_>,
        attempt: usize,
    ) -> Result<Formed, StrategyError> {
        tracing::info!(
            attempt,
            ?survivors,
            "re-forming: forming the next generation with the members that answered"
        );
        let broken = probed.clone();
        let reformed = self.block(async move { Ok(broken.reform_attempt(&survivors).await) });
        let group = match reformed {
            Ok(Ok(group)) => group,
            Ok(Err(FormFailed { attempted, error })) => {
                return forming_failed(attempted, error, attempt)
            }
            Err(error) => return forming_failed(None, error, attempt),
        };
        match self.adopt_reformed(group, before, state, cause, attempt) {
            Ok(recovery) => Ok(Formed::Trains(recovery)),
            Err(err @ (StrategyError::Config { .. } | StrategyError::NoStateHolder { .. })) => {
                Err(err)
            }
            Err(err) => {
                tracing::info!(attempt, %err, "re-forming: agreeing on the state failed");
                Ok(Formed::AgreementFailed {
                    error: err.to_string(),
                })
            }
        }
    }

    /// The probes of one re-forming attempt: every other member of `group` (the group it
    /// probes) asked whether it lives ([`ProcessGroup::probe_members`], whose round is the
    /// member machine's too). Fails where a member re-formed a later generation without this
    /// worker.
    fn probe(&self, group: &ProcessGroup) -> Result<Probes, CollectiveError> {
        let group = group.clone();
        let within = self.probe_timeout;
        self.block(async move { group.probe_members(within).await })
            .map(|probed| Probes::Answered {
                alive: probed.alive,
                joining: probed.joining,
            })
    }

    /// Trains on with `group`, re-formed from `before` (broken by `cause`) at `attempt`: the
    /// settings compared (a group broken before they were, a worker lost right after the
    /// first forming, is checked now) and the state agreed on.
    fn adopt_reformed(
        &mut self,
        group: ProcessGroup,
        before: &ProcessGroup,
        state: &mut ElasticState<'_>,
        cause: &CollectiveError,
        attempt: usize,
    ) -> Result<Recovery, StrategyError> {
        self.install(group);
        let source = check_same_settings(
            &self.span,
            self.local_replicas,
            self.bucket_bytes_max,
            self.communication.0,
        )
        .and_then(|()| self.agree_state(state))?;
        let group = self.span.group();
        let m = crate::metrics::instruments();
        m.group_reformed.inc();
        // The lost members: peers this worker declared dead.
        m.detections
            .inc_by((before.size().saturating_sub(group.size())) as u64);
        Ok(Recovery {
            generation: group.generation(),
            members: group.members().to_vec(),
            lost: before
                .members()
                .iter()
                .filter(|n| !group.members().contains(n))
                .cloned()
                .collect(),
            cause: cause.clone(),
            source,
            step: state.step,
            position: state.position,
            attempts: attempt,
        })
    }

    /// The membership changes of a step boundary (elastic training): call it on every worker
    /// before each step, in cross-replica context, with the training `state` as for
    /// [`MultiWorkerMirrored::recover`], whether this worker is to leave and why (`leaving`:
    /// [`Leave::Preempted`] on a preemption notice, e.g. SIGTERM; [`Leave::Drained`] when it
    /// is scaled down, e.g. SIGUSR1), and how the chief saves a checkpoint of `state` (`save`,
    /// called on the chief only, when a preempted worker leaves). `Ok(None)` where nothing
    /// changes: one small all-gather (every worker's notice, and the leader's count of joiners);
    /// none where the step before it carried the vote
    /// ([`MultiWorkerMirrored::at_step_boundary_counted`]).
    ///
    /// - **Preemption**: where any worker has a notice, every worker learns it at the same
    ///   step (the all-gather): the chief (rank 0) saves the agreed step with `save`, and says
    ///   whether it saved; then the leavers get [`GroupChange::Leaving`] (stop training and
    ///   exit, e.g. with 143, within the notice's grace), and the others re-form without them at
    ///   the next generation, by agreement (no probe, no failure to detect), and get
    ///   [`GroupChange::Departed`]. Every stayer holds the same state already. If the chief
    ///   leaves, it saves first; if everyone leaves, the job stops at a checkpoint (as
    ///   TensorFlow's `PreemptionCheckpointHandler` does).
    /// - **Drain**: the same agreement, without the checkpoint where every leaver was drained
    ///   (it leaves for good, and the stayers hold the state): [`Departure::drained`] names
    ///   them.
    /// - **Joining**: a worker made while the others were training (its strategy found a live
    ///   group and was admitted to it when made) calls it first, after creating its model: it
    ///   receives the step, input position, variables and optimizer state of the member with
    ///   the most completed steps, and gets [`GroupChange::Admitted`]; until then its `run` is
    ///   refused. On the members, the leader (rank 0) offers the joiners that asked it, every
    ///   member forms the next generation with them ([`ProcessGroup::admit`]), and the state goes to
    ///   them as `recover` sends it to survivors. Where the leader could not tell every joiner
    ///   its admission, nothing changes (`Ok(None)`) and the joiners ask again.
    ///
    /// What the votes decide (a departure before any admission, the chief's save only where a
    /// leaver was preempted) is `collective::boundary`'s, taken alike by the member machine
    /// that the membership simulator drives.
    ///
    /// Training goes on from the returned step with the new
    /// [`Strategy::num_replicas_in_sync`](crate::strategy::Strategy::num_replicas_in_sync)
    /// and input pipelines (the global batch follows the
    /// replicas; the input goes on from the agreed position). A failure (a joiner that went
    /// away before forming, a member lost meanwhile) fails it with the collective error: the
    /// group of the attempt is broken, and [`MultiWorkerMirrored::recover`] re-forms with the
    /// survivors as after a failed step. Where the admission's generation failed to form here, that
    /// generation's group is the one installed, broken, so that `recover` measures its quorum on
    /// the admission's members (the joiners among them), as a member that formed it does.
    pub fn at_step_boundary(
        &mut self,
        state: &mut ElasticState<'_>,
        leaving: Option<Leave>,
        save: &mut dyn FnMut(&ElasticState<'_>) -> Result<(), SaveStateError>,
    ) -> Result<Option<GroupChange>, StrategyError> {
        self.at_boundary(state, Ballot::Now(leaving), save)
    }

    /// [`MultiWorkerMirrored::at_step_boundary`], voted in the step before it: `counted` is
    /// the vote [`MultiWorkerMirrored::cast_vote`] cast before that step, counted with the
    /// step's sums ([`CastVote::counted`](super::CastVote::counted)). Where nothing changes it
    /// takes no collective. Not for the boundary after the last step (see
    /// [`CastVote`](super::CastVote)).
    pub fn at_step_boundary_counted(
        &mut self,
        state: &mut ElasticState<'_>,
        counted: CountedVote,
        save: &mut dyn FnMut(&ElasticState<'_>) -> Result<(), SaveStateError>,
    ) -> Result<Option<GroupChange>, StrategyError> {
        self.at_boundary(state, Ballot::Counted(counted), save)
    }

    /// A step boundary voted by `ballot` (see [`MultiWorkerMirrored::at_step_boundary`]).
    pub(crate) fn at_boundary(
        &mut self,
        state: &mut ElasticState<'_>,
        ballot: Ballot,
        save: &mut dyn FnMut(&ElasticState<'_>) -> Result<(), SaveStateError>,
    ) -> Result<Option<GroupChange>, StrategyError> {
        if !self.change_noted && !self.awaiting_state.load(Ordering::SeqCst) {
            self.note_change(state.step, &[], TaskState::Alive, "formed".into());
        }
        let change = self.boundary_change(state, ballot, save)?;
        match &change {
            Some(GroupChange::Admitted(a)) => {
                let what = format!("admitted {}", node_list(&a.joined));
                self.note_change(a.step, &a.joined, TaskState::Alive, what);
            }
            Some(GroupChange::Departed(d) | GroupChange::Leaving(d)) => {
                let what = d.describe();
                self.note_change(d.step, &d.left, TaskState::Retired, what);
            }
            None => {}
        }
        if let Some(GroupChange::Leaving(_)) = &change {
            self.report.left();
        }
        Ok(change)
    }

    /// The body of [`MultiWorkerMirrored::at_step_boundary`], which also records the change
    /// for the status page.
    fn boundary_change(
        &mut self,
        state: &mut ElasticState<'_>,
        ballot: Ballot,
        save: &mut dyn FnMut(&ElasticState<'_>) -> Result<(), SaveStateError>,
    ) -> Result<Option<GroupChange>, StrategyError> {
        let me = node_id(self.task);
        self.boundary_reached(state.step);
        if self.awaiting_state.load(Ordering::SeqCst) {
            let source = self.agree_state(state)?;
            crate::metrics::instruments().group_admitted.inc();
            let group = self.span.group();
            return Ok(Some(GroupChange::Admitted(Admission {
                generation: group.generation(),
                members: group.members().to_vec(),
                joined: vec![me],
                source,
                step: state.step,
                position: state.position,
            })));
        }
        self.broken()?;
        let group = self.span.group().clone();
        let Tally {
            notices,
            offer_len: len,
            offer,
        } = self.tally(&group, ballot)?;
        match boundary::decide(notices, len > 0) {
            BoundaryChange::Depart(leavers) => return self.depart(state, &leavers, save).map(Some),
            BoundaryChange::Unchanged => return Ok(None),
            BoundaryChange::Admit => {}
        }
        let cpu = &Device::Cpu;
        let bytes = if offer.len() == len {
            offer
        } else {
            vec![0u8; len]
        };
        let bytes = self
            .span
            .broadcast(0, &Tensor::from_vec(bytes, len, cpu)?)?
            .to_vec1::<u8>()?;
        let joiners = decode_joiners(&bytes)?;
        let joined: Vec<NodeId> = joiners.iter().map(|j| j.member.node.clone()).collect();
        let Some(admitted) = self.block(async move { group.admit(&joiners).await })? else {
            // The leader could not tell every joiner its admission: nobody formed the next
            // generation, the group goes on as it was, and the joiners ask again.
            return Ok(None);
        };
        // Installed even where forming it failed here: `recover` then probes and measures
        // its quorum on the admission's members, as the members that formed it do.
        self.install(admitted);
        self.broken()?;
        crate::metrics::instruments()
            .group_admitted
            .inc_by(joined.len() as u64);
        check_same_settings(
            &self.span,
            self.local_replicas,
            self.bucket_bytes_max,
            self.communication.0,
        )?;
        let source = self.agree_state(state)?;
        let group = self.span.group();
        Ok(Some(GroupChange::Admitted(Admission {
            generation: group.generation(),
            members: group.members().to_vec(),
            joined,
            source,
            step: state.step,
            position: state.position,
        })))
    }

    /// Makes every worker's training `state` that of the worker with the most completed
    /// steps (ties: the lowest rank), as re-forming does: call it on every worker together,
    /// e.g. at a fresh start where the chief restored a checkpoint. Returns the source.
    pub fn agree(&mut self, state: &mut ElasticState<'_>) -> Result<NodeId, StrategyError> {
        self.broken()?;
        self.agree_state(state)
    }

    /// The leaving part of [`MultiWorkerMirrored::at_step_boundary`]: `leavers` leave at
    /// this step.
    fn depart(
        &mut self,
        state: &mut ElasticState<'_>,
        leavers: &Leavers,
        save: &mut dyn FnMut(&ElasticState<'_>) -> Result<(), SaveStateError>,
    ) -> Result<GroupChange, StrategyError> {
        let group = self.span.group().clone();
        let members = group.members().to_vec();
        let left = leavers.leaving(&members);
        let drained = leavers.drained(&members);
        crate::metrics::instruments()
            .group_departed
            .inc_by(left.len() as u64);
        let stayers = leavers.stayers(&members);
        // The chief saves the agreed step before anyone leaves, and says whether it did
        // (every worker knows the leavers, so all skip the save together where none is needed).
        let saved_here = if group.rank() == 0 && leavers.needs_save() {
            match save(state) {
                Ok(()) => 1u8,
                Err(error) => {
                    tracing::warn!(%error, step = state.step, "the chief could not save the checkpoint of a departure");
                    0
                }
            }
        } else {
            0
        };
        let saved = self
            .span
            .broadcast(0, &Tensor::new(&[saved_here], &Device::Cpu)?)?
            .to_vec1::<u8>()?
            .first()
            == Some(&1);
        let mut departure = Departure {
            generation: group.generation(),
            members: stayers.clone(),
            left,
            drained,
            step: state.step,
            position: state.position,
            saved,
        };
        if leavers.of(group.rank()).is_some() {
            // Every message of this worker taken before it goes: the others must not take
            // its leaving for a loss.
            let flushed = group.clone();
            let _ = self.block(async move {
                flushed.flush(FLUSH_MAX).await;
                Ok(())
            });
            return Ok(GroupChange::Leaving(departure));
        }
        let formed = self.block(async move { group.reform(&stayers).await })?;
        self.install(formed);
        departure.generation = self.span.group().generation();
        Ok(GroupChange::Departed(departure))
    }

    /// Whether this worker joined a live group and waits for its state (the first
    /// [`MultiWorkerMirrored::at_step_boundary`] gives it).
    pub fn awaits_state(&self) -> bool {
        self.awaiting_state.load(Ordering::SeqCst)
    }

    /// A step boundary at `step` completed steps, in this worker's metrics: the step, and the
    /// time since the previous boundary.
    fn boundary_reached(&mut self, step: u64) {
        let m = crate::metrics::instruments();
        m.group_step.set(i64::try_from(step).unwrap_or(i64::MAX));
        let now = std::time::Instant::now();
        if let Some(previous) = self.last_boundary.replace(now) {
            m.observe_group_step(now.duration_since(previous));
        }
    }

    /// A membership change for the status page: the current group's members are up, the
    /// `changed` ones (lost, left, or admitted) are `state`, and the change is listed as
    /// starting at `step`.
    fn note_change(&mut self, step: u64, changed: &[NodeId], state: TaskState, what: String) {
        let group = self.span.group();
        for member in group.members() {
            self.task_states.insert(member.clone(), TaskState::Alive);
        }
        for node in changed {
            if state != TaskState::Alive || group.members().contains(node) {
                self.task_states.insert(node.clone(), state);
            }
        }
        self.report
            .generation(group.generation(), group.size(), step);
        crate::status::record_group_change(crate::status::GroupChange {
            generation: group.generation(),
            workers: group.size(),
            from_step: step,
            what,
        });
        self.change_noted = true;
        self.publish_status();
    }

    /// Makes `group` the one every later step's collectives span.
    fn install(&mut self, group: ProcessGroup) {
        crate::metrics::record_group(group.generation(), group.size());
        let Some(runtime) = &self.runtime else { return };
        let span = span_of(
            group,
            runtime,
            self.local_replicas,
            self.bucket_bytes_max,
            self.communication,
        );
        self.replicas.set_span(span.clone());
        // The old generation's communicator goes now, not with the last clone of its span.
        std::mem::replace(&mut self.span, span).close_nccl();
    }

    /// Step 3 of [`MultiWorkerMirrored::recover`] over the freshly formed group; returns the
    /// source's node.
    fn agree_state(&self, state: &mut ElasticState<'_>) -> Result<NodeId, StrategyError> {
        let cpu = &Device::Cpu;
        let span = &self.span;
        // A joiner never handed the state offers none (-1): its variables are not the job's.
        let own = if self.awaiting_state.load(Ordering::SeqCst) {
            -1
        } else {
            i64::try_from(state.step).unwrap_or(i64::MAX)
        };
        let steps = span
            .all_gather(&Tensor::new(&[own], cpu)?)?
            .to_vec1::<i64>()?;
        let highest = steps.iter().copied().max().unwrap_or(-1);
        if highest < 0 {
            // A group of joiners only must not train (`MemberMachine::state_agreed` alike).
            return Err(StrategyError::NoStateHolder {
                generation: span.group().generation(),
            });
        }
        // The first of the highest: the lowest rank.
        let source = steps.iter().position(|s| *s == highest).unwrap_or(0);
        let iterations = state.optimizer.map_or(0, |o| o.steps());
        let schedule = encode_schedule(state.optimizer)?;
        let figures = &state.epochs.figures;
        let header = span
            .broadcast(
                source,
                &Tensor::new(
                    &[
                        state.step as i64,
                        state.position as i64,
                        iterations as i64,
                        i64::try_from(state.epochs.begun).unwrap_or(i64::MAX),
                        schedule.len() as i64,
                        figures.len() as i64,
                    ],
                    cpu,
                )?,
            )?
            .to_vec1::<i64>()?;
        // The learning-rate schedule in force at the source (a rate a callback set is part of
        // the state: a worker that took it at another rate would diverge from the others).
        let schedule = agree_schedule(span, source, schedule, header[4])?;
        let figures = agree_figures(span, source, figures, header[5])?;
        for variable in state.variables {
            let value = span.broadcast(source, &variable.try_read_value()?)?;
            variable.assign(&value)?;
        }
        if let Some(optimizer) = state.optimizer {
            self.agree_slots(source, state.variables, optimizer)?;
            optimizer.set_steps(header[2].max(0) as u64, self.local_replicas);
            if let Some(schedule) = schedule {
                optimizer
                    .set_learning_rate_schedule(schedule)
                    .map_err(|e| StrategyError::Recovery {
                        reason: format!("the source's learning-rate schedule: {e}"),
                    })?;
            }
        }
        state.step = header[0].max(0) as u64;
        state.position = header[1].max(0) as u64;
        state.epochs = EpochProgress {
            begun: header[3].max(0) as u64,
            figures,
        };
        // A joiner whose admission broke and that re-formed with a member holding the state
        // holds it now too.
        self.awaiting_state.store(false, Ordering::SeqCst);
        crate::metrics::instruments()
            .group_step
            .set(i64::try_from(state.step).unwrap_or(i64::MAX));
        Ok(span.group().members()[source].clone())
    }
}

impl MultiWorkerMirrored {
    /// The source's optimizer slots of every variable of `variables`, installed on every local
    /// copy (part of [`MultiWorkerMirrored::agree_state`]).
    fn agree_slots(
        &self,
        source: usize,
        variables: &[Variable],
        optimizer: &dyn OptimizerState,
    ) -> Result<(), StrategyError> {
        let (cpu, span) = (&Device::Cpu, &self.span);
        let names = optimizer.kernel().slot_names();
        for variable in variables.iter().filter(|_| !names.is_empty()) {
            let len: usize = variable.shape().iter().product();
            let own = optimizer.export_slots(variable, 0);
            // Whether the source has slots for it: if not, no survivor ever updated it.
            let has = u8::from(own.is_some());
            let has = span
                .broadcast(source, &Tensor::new(&[has], cpu)?)?
                .to_vec1::<u8>()?;
            if has.first() != Some(&1) {
                continue;
            }
            let mut flat = Vec::with_capacity(len * names.len());
            for name in names {
                match own.as_ref().and_then(|o| o.get(name)) {
                    Some(buffer) => flat.extend_from_slice(buffer),
                    None => flat.extend(std::iter::repeat_n(0.0f32, len)),
                }
            }
            let flat = Tensor::from_vec(flat, len * names.len(), cpu)?;
            let got = span.broadcast(source, &flat)?.to_vec1::<f32>()?;
            let named = names
                .iter()
                .enumerate()
                .map(|(k, name)| (*name, got[k * len..(k + 1) * len].to_vec()));
            let skipped = own.as_ref().map_or(0, |o| o.skipped_non_finite());
            let slots = Slots::restore(optimizer.kernel(), variable.name(), len, named, skipped)
                .map_err(|e| StrategyError::Recovery {
                    reason: format!("the source's optimizer slots: {e}"),
                })?;
            for component in 0..self.local_replicas {
                optimizer.import_slots(variable, component, slots.clone());
            }
        }
        Ok(())
    }
}

/// The source's learning-rate schedule (`own`: this worker's, encoded; `len`: the source's
/// length, from the header), or none where it has none to carry.
fn agree_schedule(
    span: &ProcessSpan,
    source: usize,
    own: Vec<u8>,
    len: i64,
) -> Result<Option<LearningRateSchedule>, StrategyError> {
    let bytes = match usize::try_from(len).unwrap_or(usize::MAX) {
        0 => return Ok(None),
        len if len > SCHEDULE_BYTES_MAX => {
            return Err(StrategyError::Recovery {
                reason: format!(
                    "the source's learning-rate schedule is {len} bytes, above the \
                     {SCHEDULE_BYTES_MAX} allowed"
                ),
            })
        }
        len => {
            let own = if own.len() == len {
                own
            } else {
                vec![0u8; len]
            };
            span.broadcast(source, &Tensor::from_vec(own, len, &Device::Cpu)?)?
                .to_vec1::<u8>()?
        }
    };
    decode_schedule(&bytes).map(Some)
}

/// The source's running figures of its epoch (`own`: this worker's; `len`: the source's count,
/// from the header).
fn agree_figures(
    span: &ProcessSpan,
    source: usize,
    own: &[f64],
    len: i64,
) -> Result<Vec<f64>, StrategyError> {
    match usize::try_from(len).unwrap_or(usize::MAX) {
        0 => Ok(Vec::new()),
        len if len > FIGURES_MAX => Err(StrategyError::Recovery {
            reason: format!(
                "the source's epoch figures are {len}, above the {FIGURES_MAX} allowed"
            ),
        }),
        len => {
            let own = if own.len() == len {
                own.to_vec()
            } else {
                vec![0.0; len]
            };
            Ok(span
                .broadcast(source, &Tensor::from_vec(own, len, &Device::Cpu)?)?
                .to_vec1::<f64>()?)
        }
    }
}

/// Why the save a departure asks of [`MultiWorkerMirrored::at_step_boundary`] failed: the
/// caller's own error, kept whole (a [`crate::train::StateCheckpointError`], say). The chief
/// logs it and the departing workers leave without that save.
pub type SaveStateError = Box<dyn std::error::Error + Send + Sync>;

/// What a training loop carries over a re-forming of the workers' group
/// ([`MultiWorkerMirrored::recover`]): the survivor with the most completed steps gives its
/// own to the others.
#[derive(Debug)]
pub struct ElasticState<'a> {
    /// Steps this worker completed (its optimizer applied them); after recovery, the source's.
    pub step: u64,
    /// Examples of the (global, unsharded) input consumed by those steps; after recovery, the
    /// source's. Training goes on from here: the input is rebuilt to start at this example
    /// and batched to the new global batch, so that no example is skipped or seen twice.
    pub position: u64,
    /// The variables to make identical (every trainable and non-trainable variable of the
    /// model), in the same order on every worker.
    pub variables: &'a [Variable],
    /// The optimizer whose slots, step count and learning-rate schedule follow the variables
    /// (e.g. a `train::DistributedOptimizer`).
    pub optimizer: Option<&'a dyn OptimizerState>,
    /// Where the training loop stands in its epochs; a loop without epochs leaves it empty
    /// (the default). After recovery, the source's.
    pub epochs: EpochProgress,
}

/// Where a training loop with epochs (Keras' `fit`) stands in them, carried with the state
/// ([`ElasticState::epochs`]) so that a worker taking it goes on with the epoch as the worker
/// it came from would.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EpochProgress {
    /// The training epochs begun (whose start-of-epoch callbacks ran): at a step that ends one
    /// epoch, it tells whether the next one has begun (its learning rate set), so that the
    /// taker neither skips nor repeats that.
    pub begun: u64,
    /// The running figures of the epoch in progress (the loop's sums of loss, examples and
    /// metric states since it began), the same on every worker, so that the epoch's figures
    /// count its steps before the state was taken too. Empty for a loop that keeps none.
    pub figures: Vec<f64>,
}

/// What [`MultiWorkerMirrored::recover`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// The new group's generation.
    pub generation: u64,
    /// Its members (the survivors), in rank order.
    pub members: Vec<NodeId>,
    /// The members of the broken group left out.
    pub lost: Vec<NodeId>,
    /// The error that broke the old group here.
    pub cause: CollectiveError,
    /// The survivor whose state every survivor took.
    pub source: NodeId,
    /// The agreed completed step: training goes on with the next.
    pub step: u64,
    /// The agreed input position (examples consumed).
    pub position: u64,
    /// Attempts it took.
    pub attempts: usize,
}

/// A change of the workers' group at a step boundary
/// ([`MultiWorkerMirrored::at_step_boundary`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupChange {
    /// Workers joined (on a joiner: itself, which received the state).
    Admitted(Admission),
    /// Workers with a notice (preempted or drained) left at this step; the others re-formed
    /// without them.
    Departed(Departure),
    /// This worker had a notice and leaves at this step: stop training.
    Leaving(Departure),
}

/// What [`MultiWorkerMirrored::at_step_boundary`] did when workers left after a notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departure {
    /// The group's generation after it (a leaver: the generation it left).
    pub generation: u64,
    /// The workers that go on, in rank order (empty when every worker left).
    pub members: Vec<NodeId>,
    /// The workers that left.
    pub left: Vec<NodeId>,
    /// Those of `left` that were drained (scaled down for good); the others were preempted.
    pub drained: Vec<NodeId>,
    /// The step every worker agreed on (completed by all): the chief's checkpoint holds it
    /// where a worker was preempted.
    pub step: u64,
    /// The input position at that step.
    pub position: u64,
    /// Whether the chief saved the checkpoint of that step (never where every leaver was
    /// drained: none is needed).
    pub saved: bool,
}

impl Departure {
    /// Who left and why, e.g. "worker/2 left after a preemption notice; worker/3 drained".
    pub fn describe(&self) -> String {
        let preempted: Vec<&NodeId> = self
            .left
            .iter()
            .filter(|n| !self.drained.contains(n))
            .collect();
        let mut parts = Vec::new();
        if !preempted.is_empty() {
            parts.push(format!(
                "{} left after a preemption notice",
                node_list(preempted)
            ));
        }
        if !self.drained.is_empty() {
            parts.push(format!(
                "{} drained (scaled down)",
                node_list(&self.drained)
            ));
        }
        parts.join("; ")
    }

    /// Whether `node` was drained here (rather than preempted).
    pub fn was_drained(&self, node: &NodeId) -> bool {
        self.drained.contains(node)
    }
}

/// What [`MultiWorkerMirrored::at_step_boundary`] did when it admitted workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The new group's generation.
    pub generation: u64,
    /// Its members, in rank order.
    pub members: Vec<NodeId>,
    /// The workers admitted (on a joiner: itself).
    pub joined: Vec<NodeId>,
    /// The member whose state every worker took.
    pub source: NodeId,
    /// The agreed completed step: training goes on with the next.
    pub step: u64,
    /// The agreed input position (examples consumed).
    pub position: u64,
}

/// The joiners the leader offers, as `(node, host:port, incarnation)` triples (bincode); no
/// bytes for none.
/// The most bytes a learning-rate schedule handed over with the state may take (a schedule
/// is a few numbers; a piecewise one a few per boundary).
const SCHEDULE_BYTES_MAX: usize = 1 << 20;

/// The most running figures of an epoch handed over with the state (a loop keeps a few per
/// metric).
const FIGURES_MAX: usize = 1 << 16;

/// The learning-rate schedule in force on `optimizer`, encoded to hand over (empty: none).
fn encode_schedule(optimizer: Option<&dyn OptimizerState>) -> Result<Vec<u8>, StrategyError> {
    let Some(schedule) = optimizer.and_then(|o| o.learning_rate_schedule()) else {
        return Ok(Vec::new());
    };
    serde_json::to_vec(&schedule).map_err(|e| StrategyError::Recovery {
        reason: format!("encoding the learning-rate schedule: {e}"),
    })
}

/// A learning-rate schedule handed over with the state ([`encode_schedule`]).
fn decode_schedule(bytes: &[u8]) -> Result<LearningRateSchedule, StrategyError> {
    serde_json::from_slice(bytes).map_err(|e| StrategyError::Recovery {
        reason: format!("the source's learning-rate schedule does not decode: {e}"),
    })
}

pub(super) fn encode_joiners(joiners: &[Joiner]) -> Result<Vec<u8>, StrategyError> {
    if joiners.is_empty() {
        return Ok(Vec::new());
    }
    let triples: Vec<(&NodeId, String, u64)> = joiners
        .iter()
        .map(|j| {
            (
                &j.member.node,
                j.member.addr.to_string(),
                j.incarnation.raw(),
            )
        })
        .collect();
    bincode::encode_to_vec(&triples, bincode::config::standard()).map_err(|e| {
        StrategyError::Recovery {
            reason: format!("encoding the joiners: {e}"),
        }
    })
}

/// The joiners the leader offered ([`encode_joiners`]).
fn decode_joiners(bytes: &[u8]) -> Result<Vec<Joiner>, StrategyError> {
    let bad = |detail: String| StrategyError::Recovery {
        reason: format!("the leader's list of joiners: {detail}"),
    };
    let config = bincode::config::standard().with_limit::<{ 1 << 20 }>();
    let (triples, _): (Vec<(NodeId, String, u64)>, usize) =
        bincode::decode_from_slice(bytes, config).map_err(|e| bad(e.to_string()))?;
    triples
        .into_iter()
        .map(|(node, addr, incarnation)| {
            let addr = addr
                .parse()
                .map_err(|_| bad(format!("the address {addr:?} of {node} does not parse")))?;
            Ok(Joiner {
                member: GroupMember { node, addr },
                incarnation: Incarnation::from_raw(incarnation),
            })
        })
        .collect()
}

/// How a re-forming attempt that formed a group here ended.
enum Formed {
    /// The group agreed on the state: training goes on with it.
    Trains(Recovery),
    /// Forming failed with `error`; `attempted`: the group of that generation where the
    /// forming had begun (the next attempt probes it: see `Reforming::forming_failed`).
    FormingFailed {
        attempted: Option<ProcessGroup>,
        error: String,
    },
    /// Agreeing on the state in the formed group failed with `error`.
    AgreementFailed { error: String },
}

/// Re-forming attempt `attempt`, whose forming failed with `error` (`attempted`: the group of
/// that generation, where the forming had begun).
fn forming_failed(
    attempted: Option<ProcessGroup>,
    error: CollectiveError,
    attempt: usize,
) -> Result<Formed, StrategyError> {
    tracing::info!(attempt, %error, "re-forming: forming the next generation failed");
    Ok(Formed::FormingFailed {
        attempted,
        error: error.to_string(),
    })
}

/// What an attempt of re-forming `probed` that failed (`why`) failed with: for want of a
/// quorum, which members this worker reached (logged); else `last`, the error it met.
fn failure_detail(
    probed: &ProcessGroup,
    why: AttemptFailure,
    last: String,
    attempt: usize,
) -> String {
    match why {
        AttemptFailure::NoQuorum { reached, replaced } => {
            let detail =
                no_quorum_detail(probed.members(), probed.generation(), &replaced, &reached);
            tracing::info!(attempt, "re-forming: {detail}");
            detail
        }
        AttemptFailure::NoQuorumOfAttempt { reached, attempted } => {
            let detail = format!(
                "no quorum of {}, the members of a generation whose forming began here and \
                 failed (another worker may have formed it and gone on with it): this worker \
                 reached {}",
                node_list(&attempted),
                node_list(&reached)
            );
            tracing::info!(attempt, "re-forming: {detail}");
            detail
        }
        AttemptFailure::FormingFailed | AttemptFailure::AgreementFailed => last,
    }
}

/// Whether re-forming with the survivors can mend a group broken by `err`: a lost, silent or
/// refusing member can be left out; a failed step, disagreeing calls or this worker stopping
/// cannot.
fn recoverable(err: &CollectiveError) -> bool {
    matches!(
        err,
        CollectiveError::MemberLost { .. }
            | CollectiveError::PeerTimeout { .. }
            | CollectiveError::GenerationRefused { .. }
            | CollectiveError::Link { .. }
            | CollectiveError::Superseded { .. }
            | CollectiveError::Form { .. }
            | CollectiveError::Communicator { .. }
    )
}

/// Whether `group` broke by an error re-forming mends (see [`recoverable`]).
pub(super) fn broken_mendably(group: &ProcessGroup) -> bool {
    group.broken().is_some_and(|cause| recoverable(&cause))
}

/// `result` of a collective call made before training starts, or `Ok` where it failed because
/// `group` broke by an error re-forming mends (a lost worker): the loop's next call then
/// fails with it, and [`MultiWorkerMirrored::recover`] re-forms and settles the state. So a
/// worker lost between forming and the first step costs a recovery, not the job.
pub(super) fn unless_mendable(
    result: Result<(), StrategyError>,
    group: &ProcessGroup,
) -> Result<(), StrategyError> {
    match result {
        Err(StrategyError::Collective(_)) if broken_mendably(group) => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The leader's offer reaches every member as it was: nodes, addresses and the processes
    /// that asked; no joiner is no bytes; bytes that do not decode are an error naming the list.
    #[test]
    fn the_leaders_offer_of_joiners_round_trips_and_garbage_is_refused() {
        let joiners: Vec<Joiner> = (2..4)
            .map(|i| Joiner {
                member: GroupMember {
                    node: NodeId::new("worker", i),
                    addr: format!("127.0.0.1:{}", 4000 + i).parse().unwrap(),
                },
                incarnation: Incarnation::from_raw(0xfeed_0000 + u64::from(i)),
            })
            .collect();
        let bytes = encode_joiners(&joiners).unwrap();
        assert_eq!(decode_joiners(&bytes).unwrap(), joiners);
        assert!(encode_joiners(&[]).unwrap().is_empty());
        let err = decode_joiners(&[0xff, 0xff, 0xff]).unwrap_err();
        assert!(
            err.to_string().contains("the leader's list of joiners"),
            "{err}"
        );
    }
}

/// The state's agreement over a real group of two workers on loopback QUIC.
#[cfg(test)]
mod agreement_tests {
    use super::*;
    use crate::cluster::ClusterConfig;
    use crate::strategy::MultiWorkerConfig;
    use cohort_transport::ClusterCa;

    /// What one worker's agreement on the state came to.
    #[derive(Debug, PartialEq, Eq)]
    enum Agreed {
        /// It holds this step now.
        Step(u64),
        /// No member held the state: the group of this generation refused to train.
        NoStateHolder { generation: u64 },
    }

    /// Two workers' `MultiWorkerMirrored`, formed over loopback; `awaiting[i]`: worker `i`
    /// joined a live group and was never handed its state; `steps[i]` its own step count.
    /// Each agrees on the state; returns what each got (any other error fails the test).
    fn agree_pair(name: &str, awaiting: [bool; 2], steps: [u64; 2]) -> Vec<Agreed> {
        let dir = std::env::temp_dir().join(format!("cohort-agree-{name}-{}", std::process::id()));
        let ca = ClusterCa::generate(name).unwrap();
        let sockets: Vec<std::net::UdpSocket> = (0..2)
            .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let addrs: Vec<String> = sockets
            .iter()
            .map(|s| format!("\"{}\"", s.local_addr().unwrap()))
            .collect();
        for i in 0..2 {
            ca.issue(&NodeId::new("worker", i))
                .unwrap()
                .save(&dir)
                .unwrap();
        }
        drop(sockets);
        let threads: Vec<_> = (0..2)
            .map(|i| {
                let json = format!(
                    r#"{{"cluster": {{"worker": [{}]}}, "task": {{"type": "worker", "index": {i}}}}}"#,
                    addrs.join(", ")
                );
                let dir = dir.clone();
                std::thread::spawn(move || {
                    let cluster = ClusterConfig::from_tf_config(&json).unwrap();
                    let mut strategy =
                        MultiWorkerMirrored::new(MultiWorkerConfig::new(cluster, dir)).unwrap();
                    strategy.awaiting_state.store(awaiting[i], Ordering::SeqCst);
                    let mut state = ElasticState {
                        step: steps[i],
                        position: 0,
                        variables: &[],
                        optimizer: None,
                        epochs: EpochProgress::default(),
                    };
                    match strategy.agree(&mut state) {
                        Ok(_) => Agreed::Step(state.step),
                        Err(StrategyError::NoStateHolder { generation }) => {
                            Agreed::NoStateHolder { generation }
                        }
                        Err(other) => panic!("worker {i}: {other}"),
                    }
                })
            })
            .collect();
        let out = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let _ = std::fs::remove_dir_all(&dir);
        out
    }

    /// A worker never handed the state offers none: the holder is the source even with fewer
    /// steps and a higher rank, and a group of such workers only refuses to train
    /// (`MemberMachine::state_agreed` alike; seed 11001485 of the membership simulator).
    #[test]
    fn only_a_worker_holding_the_state_can_be_its_source() {
        let got = agree_pair("agree-holder", [true, false], [9, 4]);
        assert_eq!(got, vec![Agreed::Step(4), Agreed::Step(4)]);
        let got = agree_pair("agree-none", [true, true], [9, 4]);
        let refused = || Agreed::NoStateHolder { generation: 1 };
        assert_eq!(got, vec![refused(), refused()]);
    }
}
