//! The coordinator machine's half of a checkpoint save: reading one consistent cut of every
//! parameter server, the workers' dataset positions and the ledger. Writing it (and reading it
//! back, CKPT-1) is the checkpoint manager's; marking it as the cut is
//! [`Scheduler::handle_mark_cut`].
//!
//! A save survives every fault the job survives. In the order the machine drives it
//! ([`Scheduler::handle_read_cut`]):
//! 1. wait until nothing is pending and no recovery holds dispatch (the program joined
//!    before asking; a recovery may run closures again meanwhile);
//! 2. an attempt: note the [`CutState`], send [`SchedulerAction::SnapshotShard`] for every
//!    shard of every variable, and collect every live worker's dataset positions (a worker
//!    that does not answer is lost and recorded where its next incarnation starts);
//! 3. each shard's answer ([`Scheduler::handle_shard_read`]): a server that could not be
//!    reached (gone, restarting, busy, not serving yet) makes the attempt wait out a backoff
//!    and begin again, for as long as [`SAVE_WAIT_MAX`]; a refusal fails the save unless a
//!    restore or new work came meanwhile (a server mid-restore refuses what it does not hold
//!    yet), which counts as a disturbed attempt;
//! 4. once every shard and the positions are in, the attempt counts only if the cut state is
//!    unchanged (a recovery or new work between the reads would mix two cuts, CKPT-1);
//!    otherwise it is disturbed and begins again, at most [`SAVE_ATTEMPTS_MAX`] times;
//! 5. [`SchedulerAction::CutRead`]: what was read ([`CutReading`], turned into the checkpoint
//!    on the caller's thread) with the restore generation it was read in (the mark is refused
//!    if a restore began since), or why no checkpoint can be taken;
//! 6. while the shell writes it, the cut is "being written": closures committed meanwhile are
//!    kept to run again after a rollback to it, and a recovery with no earlier cut waits for
//!    it (within `ps_restart_wait_max`) instead of failing for want of a checkpoint. The
//!    shell ends it with [`Scheduler::handle_mark_cut`] once the checkpoint reads back whole,
//!    or [`Scheduler::handle_cut_abandoned`] if it could not be written.
//!
//! The same read serves a parameter server's preemption cut ([`super::preempt`]), which waits
//! for the closures that ran rather than for nothing pending, and ends with the cut to write
//! instead. One read at a time: a save asked for during a preemption cut's read begins after
//! it. Pure: no IO, no clock; `now` is passed in.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::control::LedgerState;
use super::cut_reads::{Completion, DueRead, ShardAnswer};
use super::recovery::{CallFault, WorkerPositions, DATASET_POSITIONS_KEY};
use super::{ClosureFailure, ClosureId, PositionsTicket, Scheduler, SchedulerAction};
use crate::checkpoint::{self, Checkpoint, TensorBytes, TensorError};
use crate::layout::Layout;
use crate::roles::protocol::{blob, bytes_to_f32, BlobError, ShardState};
use crate::roles::push::LearningRate;

/// Why no checkpoint cut was read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CutReadError {
    /// Another read is under way.
    #[error("a checkpoint is being read already")]
    Busy,
    /// Too many collections of the workers' dataset positions are under way.
    #[error("{max} collections of dataset positions are under way already")]
    PositionsBusy {
        /// The limit.
        max: usize,
    },
    /// A server refused to read a shard, and reading again would not help.
    #[error(
        "no checkpoint taken at step {step}: ps/{ps} refused to read shard {shard:?}, and \
         reading again would not help: {reason}"
    )]
    ServerRefused {
        /// The checkpoint's step.
        step: u64,
        /// The server.
        ps: u32,
        /// The shard.
        shard: String,
        /// What it said.
        reason: String,
    },
    /// The servers could not be read without a recovery or new work in between, in time.
    #[error(
        "the parameter servers could not be read undisturbed within {waited:?}: no checkpoint \
         taken at step {step}"
    )]
    NotUndisturbed {
        /// The checkpoint's step.
        step: u64,
        /// How long it was tried.
        waited: Duration,
    },
    /// The job failed while the cut was read.
    #[error("the job failed while a checkpoint was read: {error}")]
    JobFailed {
        /// The job's failure.
        error: ClosureFailure,
    },
    /// Every attempt was disturbed by recoveries or new work.
    #[error(
        "the checkpoint at step {step} was disturbed by parameter-server recoveries or new work \
         {attempts} times; last: {last}"
    )]
    Disturbed {
        /// The checkpoint's step.
        step: u64,
        /// Attempts made.
        attempts: u32,
        /// What disturbed the last.
        last: String,
    },
}

/// Why a cut read does not make a checkpoint ([`CutReading::into_checkpoint`]): a server's
/// answer that is not what it should be.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointBuildError {
    /// A shard of the layouts has no answer among the reads.
    #[error("shard {shard:?} was not read")]
    ShardNotRead {
        /// The shard.
        shard: String,
    },
    /// A server answered a read whose blobs do not make the shard's tensors.
    #[error("ps/{ps} answered a malformed read of {shard:?}: {source}")]
    MalformedRead {
        /// The server.
        ps: u32,
        /// The shard.
        shard: String,
        /// What is wrong with it.
        source: MalformedRead,
    },
    /// A shard is placed on a server beyond the cut's servers.
    #[error("shard {shard:?} is placed on unknown ps/{ps}")]
    UnknownServer {
        /// The shard.
        shard: String,
        /// The server.
        ps: u32,
    },
    /// The workers' dataset positions do not encode.
    #[error("{0}")]
    Positions(#[source] serde_json::Error),
}

/// What is wrong with a server's answer to a shard's read
/// ([`CheckpointBuildError::MalformedRead`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MalformedRead {
    /// A blob is missing or ragged.
    #[error(transparent)]
    Blob(BlobError),
    /// The values do not make a tensor of the shard's shape.
    #[error(transparent)]
    Tensor(TensorError),
}

/// Times a save's read is begun again because a parameter-server recovery or new work came
/// while the servers were read (CKPT-1).
pub const SAVE_ATTEMPTS_MAX: u32 = 5;
/// How long a save waits for the parameter servers to be readable undisturbed (a recovery
/// that holds dispatch to end, a lost server to be restored). Only faults that reading again
/// can cure are waited out.
pub const SAVE_WAIT_MAX: Duration = Duration::from_secs(600);
/// First (and the idle poll's) pause before reading the servers again.
pub const SAVE_RETRY_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest pause before reading the servers again after one could not be read.
pub const SAVE_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Names a save's read asked for with [`Scheduler::handle_read_cut`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CutTicket(pub u64);

/// A server's answer to a [`SchedulerAction::SnapshotShard`]: the shard's state and its
/// blobs (the values, then every optimizer slot in the state's order, little-endian f32).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardRead {
    /// Shape, slot names and steps.
    pub state: ShardState,
    /// Values, then slots.
    pub blobs: Vec<Bytes>,
}

/// A cut read whole, as read: every shard's answer, the workers' positions and the ledger at
/// the cut, with the restore generation it was read in. [`CutReading::into_checkpoint`] turns
/// it into the checkpoint to write; that copies every tensor (hundreds of megabytes for a large
/// embedding), so it is left to the caller's thread, never done on the coordinator's actor,
/// whose thread also serves the node's heartbeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutReading {
    /// The checkpoint's step.
    pub step: u64,
    /// The restore generation the servers were read in (for [`Scheduler::handle_mark_cut`]).
    pub generation: u64,
    /// Parameter servers in the cluster.
    pub num_servers: u32,
    /// Every variable's layout.
    pub layouts: Vec<Layout>,
    /// Every shard's answer, by shard name.
    pub reads: BTreeMap<String, ShardRead>,
    /// Worker → dataset → elements read.
    pub positions: WorkerPositions,
    /// The ledger at the cut, with the ids a checkpoint keeps.
    pub ledger: LedgerState,
    /// The rate the closures scheduled after the cut carry
    /// ([`Scheduler::handle_set_learning_rate`]; `None`: the servers' own): a chief that
    /// restores this checkpoint at its start goes on at it.
    pub learning_rate: Option<LearningRate>,
}

/// Where a checkpoint's manifest keeps the rate the closures after its cut carry (a number, or
/// `null` for the servers' own rate; absent in a checkpoint from before it was kept).
pub const LEARNING_RATE_KEY: &str = "learning_rate";

/// A checkpoint's recorded rate that no optimizer accepts.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "checkpoint at step {step}: {LEARNING_RATE_KEY} is {found}, not a finite, non-negative \
     number or null"
)]
pub struct RecordedRateError {
    /// The checkpoint's step.
    pub step: u64,
    /// What the manifest holds there.
    pub found: String,
}

/// The rate the closures after `ckpt`'s cut carried ([`LEARNING_RATE_KEY`]): `None` for the
/// servers' own (or a checkpoint from before it was kept).
pub fn recorded_learning_rate(
    ckpt: &Checkpoint,
) -> Result<Option<LearningRate>, RecordedRateError> {
    match ckpt.extra.get(LEARNING_RATE_KEY) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(value) => value
            .as_f64()
            .and_then(|rate| LearningRate::new(rate as f32))
            .map(Some)
            .ok_or_else(|| RecordedRateError {
                step: ckpt.step,
                found: value.to_string(),
            }),
    }
}

/// The program's save whose cut was read and handed out ([`SchedulerAction::CutRead`]), while
/// its checkpoint is written: until [`Scheduler::handle_mark_cut`] or
/// [`Scheduler::handle_cut_abandoned`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CutBeingWritten {
    /// Its cut (the next closure id when it was read).
    pub(super) cut: ClosureId,
    /// The restore generation it was read in: a restore since makes it stale (its mark is
    /// refused).
    pub(super) generation: u64,
}

/// Why a cut is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CutPurpose {
    /// The program's save ([`Scheduler::handle_read_cut`]): read once nothing is pending, at
    /// the next closure id; ends with [`SchedulerAction::CutRead`].
    Save,
    /// A parameter server's preemption notice ([`super::preempt`]): read once every closure
    /// that ever ran is finished, while no other starts, at the first closure not finished;
    /// new work queued meanwhile does not disturb it (none of it runs). Ends with
    /// [`SchedulerAction::WritePreemptionCut`], or with the preemption given up.
    Preemption,
}

impl Scheduler {
    /// Reads a consistent cut of every parameter server for a checkpoint at `step` (see the
    /// module doc); [`SchedulerAction::CutRead`] with the returned ticket tells how it ended.
    /// Refused while another save's read is under way; one behind a parameter server's
    /// preemption cut begins once that one ended.
    pub fn handle_read_cut(&mut self, now: Instant, step: u64) -> Result<CutTicket, CutReadError> {
        if self.cut_reads.save_in_line() {
            return Err(CutReadError::Busy);
        }
        let ticket = self.queue_cut_read(now, step, CutPurpose::Save);
        self.advance_cut_read(now);
        Ok(ticket)
    }

    /// Queues a read of a cut for `purpose`; it begins when the reads before it ended (the
    /// caller advances the reads once it is ready for the outcome).
    pub(super) fn queue_cut_read(
        &mut self,
        now: Instant,
        step: u64,
        purpose: CutPurpose,
    ) -> CutTicket {
        let ticket = CutTicket(self.next_ticket);
        self.next_ticket += 1;
        self.cut_reads.queue(now, ticket, step, purpose);
        ticket
    }

    /// Server `ps`'s answer to the [`SchedulerAction::SnapshotShard`] of shard `shard`, sent
    /// for `attempt` of read `ticket`. An answer to an attempt given up since changes nothing.
    pub fn handle_shard_read(
        &mut self,
        now: Instant,
        ticket: CutTicket,
        attempt: u32,
        ps: u32,
        shard: &str,
        result: Result<ShardRead, CallFault>,
    ) {
        let cut_state = self.cut_state();
        let answer =
            self.cut_reads
                .shard_answered(now, (ticket, attempt), (ps, shard), result, &cut_state);
        match answer {
            ShardAnswer::Ignored => {}
            ShardAnswer::Recorded => self.complete_cut_read(now),
            // The loss reaches the machine through the failure detector (or the server
            // answers again); until then, back off and read again.
            ShardAnswer::BackedOff { step, reason } => tracing::warn!(
                "checkpoint at step {step}: ps/{ps} could not be read ({reason}); reading again \
                 once it is back"
            ),
            ShardAnswer::Refused {
                step,
                reason,
                disturbed: false,
            } => self.end_cut_read(
                now,
                CutReadError::ServerRefused {
                    step,
                    ps,
                    shard: shard.to_string(),
                    reason,
                },
            ),
            ShardAnswer::Refused { reason, .. } => {
                let detail = format!("ps/{ps} refused a read ({reason})");
                self.disturb_cut_read(now, &detail);
            }
        }
    }

    /// The workers' positions for the save's read arrived (from the collection it started).
    pub(super) fn cut_positions_collected(
        &mut self,
        now: Instant,
        ticket: PositionsTicket,
        positions: WorkerPositions,
    ) {
        if self.cut_reads.positions_collected(ticket, positions) {
            self.complete_cut_read(now);
        }
    }

    /// When the read under way must be advanced, if it waits.
    pub(super) fn cut_read_deadline(&self) -> Option<Instant> {
        self.cut_reads.deadline()
    }

    /// Begins an attempt if the read waits and its time came (part of `handle_timeout`).
    pub(super) fn advance_cut_read(&mut self, now: Instant) {
        let Some(DueRead {
            purpose,
            step,
            started,
        }) = self.cut_reads.due(now)
        else {
            return;
        };
        if now.saturating_duration_since(started) > SAVE_WAIT_MAX {
            self.end_cut_read(
                now,
                CutReadError::NotUndisturbed {
                    step,
                    waited: SAVE_WAIT_MAX,
                },
            );
            return;
        }
        if let Some(error) = self
            .first_error
            .as_ref()
            .filter(|_| purpose == CutPurpose::Save)
        {
            let error = CutReadError::JobFailed {
                error: error.clone(),
            };
            self.end_cut_read(now, error);
            return;
        }
        let ready = match purpose {
            CutPurpose::Save => self.is_idle() && !self.is_holding(),
            // Only closures that ran before still go out: they are waited for.
            CutPurpose::Preemption => self.preemption_drained() && !self.is_holding(),
        };
        if !ready {
            // A recovery holds dispatch or runs closures again: it is bounded; read after it.
            self.cut_reads.wait_until(now + SAVE_RETRY_BACKOFF_MIN);
            return;
        }
        let positions = match self.collect_positions() {
            Ok(ticket) => ticket,
            Err(e) => {
                self.end_cut_read(now, e);
                return;
            }
        };
        let before = self.cut_state();
        let shards: Vec<(u32, String)> = self
            .setup
            .layouts
            .iter()
            .flat_map(|l| (0..l.shards.len()).map(move |i| (l.shards[i].ps, l.shard_name(i))))
            .collect();
        let waiting = shards.iter().cloned().collect();
        let Some((ticket, attempt)) = self.cut_reads.begin_attempt(before, waiting, positions)
        else {
            return;
        };
        for (ps, shard) in shards {
            self.actions.push_back(SchedulerAction::SnapshotShard {
                ticket,
                attempt,
                ps,
                shard,
            });
        }
        // The collection may have ended at once (no live worker).
        self.finish_positions(positions, now);
    }

    /// Ends the attempt once every shard and the positions are in.
    fn complete_cut_read(&mut self, now: Instant) {
        let cut_state = self.cut_state();
        let read = match self.cut_reads.take_complete(&cut_state) {
            Completion::NotYet => return,
            Completion::Disturbed => {
                self.disturb_cut_read(now, "a parameter-server recovery or new work came");
                return;
            }
            Completion::Done(read) => read,
        };
        let mut reading = CutReading {
            step: read.step,
            generation: cut_state.generation,
            num_servers: self.server_span(),
            layouts: self.setup.layouts.clone(),
            reads: read.reads,
            positions: read.positions,
            ledger: self.ledger_state(),
            learning_rate: self.learning_rate,
        };
        match read.purpose {
            CutPurpose::Save => {
                self.rollback.write_began(CutBeingWritten {
                    cut: ClosureId(reading.ledger.next_closure_id),
                    generation: reading.generation,
                });
                self.actions.push_back(SchedulerAction::CutRead {
                    ticket: read.ticket,
                    result: Ok(reading),
                });
            }
            CutPurpose::Preemption => {
                // Nothing ran since the read began: every closure below the first one not
                // finished is finished, and none from it on has run (dispatch is held).
                let cut = self.unfinished.first().map_or(self.next_id, |c| c.0);
                reading.ledger.next_closure_id = cut;
                // Named by its cut: unique, and growing from one preemption to the next.
                reading.step = cut;
                self.preemption_cut_read(read.ticket, ClosureId(cut), reading);
            }
        }
        // The next read in line may begin.
        self.advance_cut_read(now);
    }

    /// The attempt was disturbed: begin again at once, or give up past the bound.
    fn disturb_cut_read(&mut self, now: Instant, why: &str) {
        match self.cut_reads.disturbed(now) {
            None => {}
            Some(Err(step)) => self.end_cut_read(
                now,
                CutReadError::Disturbed {
                    step,
                    attempts: SAVE_ATTEMPTS_MAX,
                    last: why.to_string(),
                },
            ),
            Some(Ok(step)) => {
                tracing::warn!(
                    "checkpoint at step {step}: {why} while the servers were read; reading again"
                );
                self.advance_cut_read(now);
            }
        }
    }

    /// Ends the read under way, which could not be taken (`reason`); the next in line may begin.
    pub(super) fn end_cut_read(&mut self, now: Instant, reason: CutReadError) {
        let Some((ticket, purpose)) = self.cut_reads.end_first() else {
            return;
        };
        match purpose {
            CutPurpose::Save => self.actions.push_back(SchedulerAction::CutRead {
                ticket,
                result: Err(reason),
            }),
            CutPurpose::Preemption => self.preemption_cut_failed(now, ticket, reason),
        }
        self.advance_cut_read(now);
    }

    /// Begins read `ticket` now if it is first in line and waits for its first attempt (its
    /// condition, polled otherwise, is known to hold now).
    pub(super) fn begin_cut_read_now(&mut self, now: Instant, ticket: CutTicket) {
        if self.cut_reads.begin_now(now, ticket) {
            self.advance_cut_read(now);
        }
    }

    /// The program's save of cut `cut` was not written, or did not read back whole (`reason`):
    /// it never becomes the cut. A recovery that waited for it as the first checkpoint fails.
    pub fn handle_cut_abandoned(&mut self, cut: ClosureId, reason: &str) {
        self.cut_write_ended(cut, Some(reason.to_string()));
    }

    /// The shell is done with the save of cut `cut`: marked (`refused` is `None`), refused, or
    /// abandoned. A recovery waiting for it moves on.
    pub(super) fn cut_write_ended(&mut self, cut: ClosureId, refused: Option<String>) {
        if self.rollback.write_ended(cut, refused) {
            self.advance_recovery();
        }
    }

    /// The program's save being written, if one was read in the current restore generation.
    pub(super) fn cut_being_written(&self) -> Option<CutBeingWritten> {
        self.rollback.being_written(self.generation)
    }

    /// Drops the read `ticket` (under way or waiting) without an answer: its purpose is gone.
    pub(super) fn drop_cut_read(&mut self, now: Instant, ticket: CutTicket) {
        self.cut_reads.drop_read(ticket);
        self.advance_cut_read(now);
    }
}

impl CutReading {
    /// The checkpoint of this cut: every shard with its optimizer slots and steps, every
    /// worker's dataset positions, and the ledger with its retained ids (whole, LEDGER-1 across
    /// restarts). A malformed answer (a blob missing or ragged) is an error naming the shard.
    pub fn into_checkpoint(self) -> Result<Checkpoint, CheckpointBuildError> {
        let mut ckpt = Checkpoint::new(self.step, self.num_servers as usize);
        for layout in &self.layouts {
            ckpt.layout.push(layout.clone());
            for (i, shard) in layout.shards.iter().enumerate() {
                let name = layout.shard_name(i);
                let read =
                    self.reads
                        .get(&name)
                        .ok_or_else(|| CheckpointBuildError::ShardNotRead {
                            shard: name.clone(),
                        })?;
                let malformed = |source: MalformedRead| CheckpointBuildError::MalformedRead {
                    ps: shard.ps,
                    shard: name.clone(),
                    source,
                };
                let shape: Vec<usize> = read.state.shape.iter().map(|&d| d as usize).collect();
                let tensor = |index: usize| -> Result<TensorBytes, CheckpointBuildError> {
                    let bytes = blob(&read.blobs, index, &name)
                        .map_err(|e| malformed(MalformedRead::Blob(e)))?;
                    let values = bytes_to_f32(bytes, "snapshot")
                        .map_err(|e| malformed(MalformedRead::Blob(e)))?;
                    TensorBytes::from_f32(shape.clone(), &values)
                        .map_err(|e| malformed(MalformedRead::Tensor(e)))
                };
                let shard_tensors = ckpt.shards.get_mut(shard.ps as usize).ok_or_else(|| {
                    CheckpointBuildError::UnknownServer {
                        shard: name.clone(),
                        ps: shard.ps,
                    }
                })?;
                shard_tensors.tensors.insert(name.clone(), tensor(0)?);
                for (slot_index, slot) in read.state.slots.iter().enumerate() {
                    shard_tensors.tensors.insert(
                        checkpoint::slot_tensor_name(&name, slot),
                        tensor(slot_index + 1)?,
                    );
                }
                ckpt.set_update_count(&name, read.state.steps);
            }
        }
        for (worker, datasets) in &self.positions {
            ckpt.dataset_positions
                .insert(*worker, datasets.values().sum());
        }
        ckpt.extra[DATASET_POSITIONS_KEY] =
            serde_json::to_value(&self.positions).map_err(CheckpointBuildError::Positions)?;
        ckpt.extra[LEARNING_RATE_KEY] =
            serde_json::json!(self.learning_rate.map(LearningRate::get));
        let state = self.ledger;
        ckpt.ledger = checkpoint::Ledger {
            next_closure_id: state.next_closure_id,
            // Whole: every count as the coordinator keeps it (LEDGER-1 across restarts).
            counts: state.ledger,
            // The retained ones (SchedulerConfig::finished_retained_max); the counts are whole.
            committed_ids: state.committed_ids.into_iter().collect(),
            pending_ids: Default::default(),
            cancelled_ids: state.ended_ids.into_iter().collect(),
        };
        Ok(ckpt)
    }
}
