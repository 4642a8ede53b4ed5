//! A parameter server's preemption notice, as the coordinator machine handles it: take a
//! checkpoint cut at once, so that when the server goes its restore rolls nothing back.
//! The same cut at once serves servers joining or leaving the job ([`super::reshard`]).
//!
//! A server that gets SIGTERM tells the chief ([`crate::roles::protocol::Leaving`]) and waits
//! for the answer within its grace. In the order the machine drives it
//! ([`Scheduler::handle_ps_leaving`]):
//! 1. **Draining**: no closure that never ran starts (new work may still be scheduled and
//!    waits in the queue); the closures in flight finish, and those queued again after an
//!    attempt (a lost worker, an unreachable server: their effect may be partly on the servers
//!    already) still go out until they finish, so that every closure that ever ran is finished;
//! 2. **Reading**: then a cut is read as a save's is ([`super::save`], purpose
//!    [`CutPurpose::Preemption`]): every shard, the workers' positions; its cut is the first
//!    closure not finished: every closure below it is finished, and none from it on ever ran
//!    (closures are first dispatched in id order), so the servers hold exactly the effects of
//!    the closures below it;
//! 3. **Writing**: [`SchedulerAction::WritePreemptionCut`]: the shell builds the checkpoint and
//!    writes it under [`PREEMPTION_CUTS_DIR`] beside the program's checkpoints, off the actor,
//!    and answers with [`Scheduler::handle_preemption_cut_written`];
//! 4. **Gone**: the checkpoint is marked as the cut, every server that gave notice is answered
//!    [`LeaveAnswer::Go`] ([`SchedulerAction::AnswerPsLeaving`]) and counted lost at once: a
//!    recovery holds dispatch until its new incarnation is up and restores every server from
//!    the cut just taken, with nothing committed since (0 closures run again).
//!
//! A notice that comes while a cut is being taken joins it (every server that gave notice
//! before the cut was read leaves with it). The preemption is given up, and every server
//! that gave notice is answered [`LeaveAnswer::Go`] at once (its loss is then recovered from
//! the last cut, as any other), when: no checkpoint directory is known; the chief's start is
//! still probing the servers (their state may be a dead chief's, which its restore rolls
//! back); a notice that came before the start waits for it (and is taken once the start ended
//! or work was scheduled, or leaves at once when the start begins); a recovery began before the cut was read (a server was lost: it holds dispatch
//! itself and restores from the last cut); the cut could not be read or written; or it took longer than
//! [`PREEMPTION_CUT_MAX`]. A chief that is stopping too answers [`LeaveAnswer::Stay`], also to
//! the servers whose cut it was taking when its own notice came
//! ([`Scheduler::handle_chief_stopping`]): its program's own checkpoint needs the servers.
//!
//! Pure: no IO, no clock; `now` is passed in.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::save::{CheckpointBuildError, CutPurpose, CutReadError, CutReading, CutTicket};
use super::{ClosureId, MarkCutError, Scheduler, SchedulerAction};
use crate::checkpoint::{PolicyError, SaveError};
use crate::roles::protocol::LeaveAnswer;

/// The directory, under the program's checkpoint directory, where preemption cuts are
/// written. The program's checkpoint manager ignores it (only `ckpt-<step>` directories are
/// checkpoints to restore at start-up): a preemption cut is taken mid-epoch, at no step of the
/// program, and serves only the recovery that follows it.
pub const PREEMPTION_CUTS_DIR: &str = "preemption-cuts";

/// Longest a preemption cut may hold dispatch, from the first notice: past it the cut is given
/// up and the servers leave without it. A server's grace bounds its own wait anyway.
pub const PREEMPTION_CUT_MAX: Duration = Duration::from_secs(60);

/// Why the shell did not write a preemption cut's checkpoint (its answer to
/// [`SchedulerAction::WritePreemptionCut`], [`Scheduler::handle_preemption_cut_written`]).
#[derive(Debug, thiserror::Error)]
pub enum CutWriteError {
    /// The cut read does not make a checkpoint.
    #[error(transparent)]
    Build(#[from] CheckpointBuildError),
    /// The checkpoint manager for the preemption cuts could not be made.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// Writing the checkpoint (or reading it back whole, CKPT-1) failed.
    #[error("writing the preemption cut under {}: {source}", root.display())]
    Save {
        /// The directory of the preemption cuts.
        root: PathBuf,
        /// What failed.
        source: SaveError,
    },
    /// It was written, but does not read back whole.
    #[error("the preemption cut does not verify")]
    Unverified,
    /// The writer (off the actor's thread) ended without an outcome: it panicked or was
    /// cancelled.
    #[error("the writing task failed: {0}")]
    WriterLost(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Why a cut at once was given up (logged; the servers that gave notice leave without it).
#[derive(Debug, thiserror::Error)]
enum CutGivenUp {
    /// Its read could not be taken.
    #[error(transparent)]
    NotRead(CutReadError),
    /// The shell could not write it.
    #[error(transparent)]
    NotWritten(CutWriteError),
    /// A restore began while it was written (CKPT-1: it would mix two cuts).
    #[error("a parameter-server restore began meanwhile")]
    RestoreBegan,
    /// Written, but the machine refused it as the cut.
    #[error(transparent)]
    NotMarked(MarkCutError),
    /// It was not taken within [`PREEMPTION_CUT_MAX`].
    #[error("the cut was not taken within {0:?}")]
    TooLong(Duration),
    /// A server was lost before it was read.
    #[error("a parameter server was lost first; its recovery restores every server")]
    ServerLostFirst,
}

/// The preemption sub-machine's state: the notices that wait for the chief's start, the cut
/// taken at once for servers that gave notice (or join or leave the job), where such cuts go,
/// and whether the chief itself is stopping.
#[derive(Debug, Default)]
pub(super) struct Preemptions {
    /// The cut at once under way: dispatch is held while it lasts.
    under_way: Option<PsPreemption>,
    /// Notices that came before what the servers hold was this coordinator's (before its
    /// start), by index with the incarnation: their cut waits for it.
    waiting: BTreeMap<u32, u64>,
    /// The chief got its own stop request: servers that give notice stay.
    pub(super) stopping: bool,
    /// Where the program's last save (or the checkpoint restored at start-up) lives.
    pub(super) saves_root: Option<PathBuf>,
    /// The configured checkpoint directory, for preemption cuts before the program's first
    /// save.
    pub(super) checkpoint_dir: Option<PathBuf>,
}

impl Preemptions {
    /// Where preemption cuts go: beside the program's last save, else the configured
    /// checkpoint directory.
    pub(super) fn root(&self) -> Option<PathBuf> {
        self.saves_root
            .as_ref()
            .or(self.checkpoint_dir.as_ref())
            .map(|root| root.join(PREEMPTION_CUTS_DIR))
    }

    /// Whether dispatch is held for a cut at once (closures that ran before may still go out
    /// while it drains).
    pub(super) fn holds(&self) -> bool {
        self.under_way.is_some()
    }

    /// Whether the cut under way still drains (it is not read yet).
    pub(super) fn drains(&self) -> bool {
        self.under_way
            .as_ref()
            .is_some_and(|p| matches!(p.phase, PreemptPhase::Reading(_)))
    }

    /// When the cut under way must be given up.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.under_way
            .as_ref()
            .map(|p| p.since + PREEMPTION_CUT_MAX)
    }

    /// Adds incarnation `incarnation` of server `ps` to those the cut under way serves;
    /// `false` if none is under way.
    fn join_cut(&mut self, ps: u32, incarnation: u64) -> bool {
        match self.under_way.as_mut() {
            Some(preemption) => {
                preemption.leaving.insert(ps, incarnation);
                true
            }
            None => false,
        }
    }
}

/// A parameter-server preemption under way.
#[derive(Debug)]
pub(super) struct PsPreemption {
    /// Servers that gave notice, by index, with the incarnation that did.
    leaving: BTreeMap<u32, u64>,
    since: Instant,
    root: PathBuf,
    phase: PreemptPhase,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreemptPhase {
    /// Waiting for the closures in flight, then the cut's read.
    Reading(CutTicket),
    /// The cut is being written by the shell.
    Writing { ticket: CutTicket, cut: ClosureId },
}

impl Scheduler {
    /// Incarnation `incarnation` of parameter server `ps` got a preemption notice and is about to
    /// go (see the module doc). `Some` is the answer now; `None`: the answer comes as
    /// [`SchedulerAction::AnswerPsLeaving`] once the cut is taken (or given up). `stopping`:
    /// the chief is stopping too.
    pub fn handle_ps_leaving(
        &mut self,
        now: Instant,
        ps: u32,
        incarnation: u64,
        stopping: bool,
    ) -> Option<LeaveAnswer> {
        if stopping || self.preemption.stopping {
            return Some(LeaveAnswer::Stay);
        }
        let live = self
            .servers
            .get(&ps)
            .is_some_and(|e| e.incarnation == incarnation && e.alive && !e.dead);
        if !live {
            // Not the incarnation serving (older, declared dead already): nothing to save.
            return Some(LeaveAnswer::Go);
        }
        // One cut serves every server that gave notice before it is marked: once read, it
        // holds this server's state too, since nothing ran after its read.
        if self.preemption.join_cut(ps, incarnation) {
            return None;
        }
        let Some(root) = self.preemption.root() else {
            tracing::warn!(
                "ps/{ps} (incarnation {incarnation}) got a preemption notice, but no checkpoint directory \
                 is known: it leaves now, and its loss is recovered from the last checkpoint"
            );
            return self.leave_now(now, ps, incarnation);
        };
        if self.is_holding() || self.start.under_way() {
            // A recovery holds dispatch already and will restore every server; or the chief's
            // start is still probing them: what they hold is not yet this chief's to cut
            // (it may be a dead chief's work that the start's restore rolls back).
            return self.leave_now(now, ps, incarnation);
        }
        if !self.servers_accounted() {
            // Before the start (a restarted chief's servers may hold a dead chief's work):
            // the cut waits for it, within the server's grace.
            tracing::info!(
                "ps/{ps} (incarnation {incarnation}) got a preemption notice before the chief's start: its \
                 cut waits for the start"
            );
            self.preemption.waiting.insert(ps, incarnation);
            return None;
        }
        self.begin_cut_at_once(now, root);
        self.preemption.join_cut(ps, incarnation);
        None
    }

    /// Begins a cut taken at once (see the module doc) to be written under `root`: for servers
    /// that gave notice (added to it by the caller), or for servers joining or leaving the job
    /// ([`super::reshard`]).
    pub(super) fn begin_cut_at_once(&mut self, now: Instant, root: PathBuf) {
        let ticket = self.queue_cut_read(now, 0, CutPurpose::Preemption);
        self.preemption.under_way = Some(PsPreemption {
            leaving: BTreeMap::new(),
            since: now,
            root,
            phase: PreemptPhase::Reading(ticket),
        });
        // With nothing to drain the read begins (and may end) at once.
        self.advance_preemption(now);
        self.advance_cut_read(now);
    }

    /// The shell wrote the preemption cut read as `ticket` (`Ok`), or could not (why). Written,
    /// it becomes the cut (unless a restore began since, CKPT-1) and every server that gave
    /// notice leaves; either way dispatch is no longer held for it.
    pub fn handle_preemption_cut_written(
        &mut self,
        now: Instant,
        ticket: CutTicket,
        result: Result<(), CutWriteError>,
    ) {
        let Some(preemption) = self.preemption.under_way.as_ref() else {
            return;
        };
        let PreemptPhase::Writing { ticket: t, cut } = preemption.phase else {
            return;
        };
        if t != ticket {
            return;
        }
        let root = preemption.root.clone();
        let marked = result.map_err(CutGivenUp::NotWritten).and_then(|()| {
            if self.is_restoring() {
                return Err(CutGivenUp::RestoreBegan);
            }
            self.mark_cut_at(cut, root).map_err(CutGivenUp::NotMarked)
        });
        match marked {
            Ok(()) => {
                self.control.preemption_cuts += 1;
                self.finish_preemption(now, LeaveAnswer::Go, true);
            }
            Err(reason) => self.give_up_preemption(now, reason),
        }
    }

    /// The chief is stopping (its own preemption notice): a preemption cut under way is given
    /// up and every server that gave notice is answered [`LeaveAnswer::Stay`] (the program's
    /// own checkpoint needs them); later notices are answered `Stay` at once.
    pub fn handle_chief_stopping(&mut self, now: Instant) {
        self.preemption.stopping = true;
        for (ps, incarnation) in std::mem::take(&mut self.preemption.waiting) {
            let answer = LeaveAnswer::Stay;
            self.actions.push_back(SchedulerAction::AnswerPsLeaving {
                ps,
                incarnation,
                answer,
            });
        }
        self.finish_preemption(now, LeaveAnswer::Stay, false);
    }

    /// Notices that waited for the chief's start (part of every dispatch): once a start runs
    /// they leave at once (as a notice during the start does); once what the servers hold is
    /// this chief's, one cut is taken for every live incarnation among them.
    pub(super) fn advance_waiting_notices(&mut self, now: Instant) {
        if self.preemption.waiting.is_empty() || self.preemption.holds() {
            return;
        }
        let waiting = std::mem::take(&mut self.preemption.waiting);
        if self.start.under_way() || self.is_holding() {
            for (ps, incarnation) in waiting {
                let answer = self
                    .leave_now(now, ps, incarnation)
                    .unwrap_or(LeaveAnswer::Go);
                self.actions.push_back(SchedulerAction::AnswerPsLeaving {
                    ps,
                    incarnation,
                    answer,
                });
            }
            return;
        }
        if !self.servers_accounted() {
            self.preemption.waiting = waiting;
            return;
        }
        let live: BTreeMap<u32, u64> = waiting
            .into_iter()
            .filter(|(ps, incarnation)| {
                self.servers
                    .get(ps)
                    .is_some_and(|e| e.incarnation == *incarnation && e.alive && !e.dead)
            })
            .collect();
        let Some(root) = self.preemption.root() else {
            return;
        };
        if live.is_empty() {
            return;
        }
        self.begin_cut_at_once(now, root);
        for (ps, incarnation) in live {
            self.preemption.join_cut(ps, incarnation);
        }
    }

    /// Whether a preemption cut may be read now: nothing in flight and nothing queued that
    /// ran before.
    pub(super) fn preemption_drained(&self) -> bool {
        self.in_flight_count() == 0 && self.first_retry().is_none()
    }

    /// Gives the preemption up when a recovery began before its cut was read, or when it
    /// took too long (part of every dispatch and `handle_timeout`).
    pub(super) fn advance_preemption(&mut self, now: Instant) {
        let Some(preemption) = self.preemption.under_way.as_ref() else {
            return;
        };
        if now >= preemption.since + PREEMPTION_CUT_MAX {
            self.give_up_preemption(now, CutGivenUp::TooLong(PREEMPTION_CUT_MAX));
            return;
        }
        let PreemptPhase::Reading(ticket) = preemption.phase else {
            return;
        };
        if self.is_holding() {
            self.give_up_preemption(now, CutGivenUp::ServerLostFirst);
        } else if self.preemption_drained() {
            // Drained: read now rather than at the read's next poll.
            self.begin_cut_read_now(now, ticket);
        }
    }

    /// The preemption cut was read: the shell writes it.
    pub(super) fn preemption_cut_read(
        &mut self,
        ticket: CutTicket,
        cut: ClosureId,
        reading: CutReading,
    ) {
        let Some(preemption) = self.preemption.under_way.as_mut() else {
            return;
        };
        if preemption.phase != PreemptPhase::Reading(ticket) {
            return;
        }
        preemption.phase = PreemptPhase::Writing { ticket, cut };
        let leaving = preemption.leaving.keys().copied().collect();
        self.actions.push_back(SchedulerAction::WritePreemptionCut {
            ticket,
            cut,
            root: preemption.root.clone(),
            leaving,
            reading: Box::new(reading),
        });
    }

    /// The preemption cut's read could not be taken.
    pub(super) fn preemption_cut_failed(
        &mut self,
        now: Instant,
        ticket: CutTicket,
        reason: CutReadError,
    ) {
        if self
            .preemption
            .under_way
            .as_ref()
            .is_some_and(|p| p.phase == PreemptPhase::Reading(ticket))
        {
            self.give_up_preemption(now, CutGivenUp::NotRead(reason));
        }
    }

    /// Answers `Go` to a notice now: the incarnation counts as lost at once.
    fn leave_now(&mut self, now: Instant, ps: u32, incarnation: u64) -> Option<LeaveAnswer> {
        self.control.servers_left += 1;
        self.handle_ps_lost(now, ps, incarnation);
        Some(LeaveAnswer::Go)
    }

    fn give_up_preemption(&mut self, now: Instant, reason: CutGivenUp) {
        if let Some(preemption) = self.preemption.under_way.as_ref() {
            if preemption.leaving.is_empty() {
                tracing::warn!(
                    "no cut taken for the servers joining or leaving the job ({reason}); \
                     nothing moved"
                );
            } else {
                tracing::warn!(
                    "preemption of {}: no cut taken ({reason}); the servers leave now and \
                     their loss is recovered from the last checkpoint",
                    preemption
                        .leaving
                        .keys()
                        .map(|ps| format!("ps/{ps}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            self.control.preemption_cuts_given_up += 1;
        }
        self.finish_preemption(now, LeaveAnswer::Go, false);
    }

    /// Ends the cut under way: its read (if still under way) is dropped, every server that
    /// gave notice is answered `answer` (and, told to go, counted lost), servers joining or
    /// leaving the job move if the cut was `taken` ([`super::reshard`]), and dispatch is no
    /// longer held for it (a recovery holds it again at once for the servers lost or moved).
    fn finish_preemption(&mut self, now: Instant, answer: LeaveAnswer, taken: bool) {
        let Some(preemption) = self.preemption.under_way.take() else {
            return;
        };
        if let PreemptPhase::Reading(ticket) = preemption.phase {
            self.drop_cut_read(now, ticket);
        }
        for (ps, incarnation) in preemption.leaving {
            self.actions.push_back(SchedulerAction::AnswerPsLeaving {
                ps,
                incarnation,
                answer,
            });
            if answer == LeaveAnswer::Go {
                self.control.servers_left += 1;
                self.handle_ps_lost(now, ps, incarnation);
            }
        }
        self.reshard_cut_ended(now, taken);
        self.dispatch(now);
    }
}
