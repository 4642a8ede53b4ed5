//! The save sub-machine's state: the reads of checkpoint cuts, one at a time in line
//! ([`CutReads`]). It owns each read's attempts (their number, the shards not answered yet,
//! what was read, the positions awaited), how long it waits before the next (the backoff
//! after a server could not be read) and how many attempts were disturbed. The `Scheduler`
//! (`save.rs`) decides when an attempt may begin, what a disturbed or refused read means and
//! what a finished read becomes; it asks this sub-machine, and tells it, through the methods
//! below. Pure: time is passed in.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::control::{CutState, PositionsTicket};
use super::recovery::{CallFault, WorkerPositions};
use super::save::{
    CutPurpose, CutTicket, ShardRead, SAVE_ATTEMPTS_MAX, SAVE_RETRY_BACKOFF_MAX,
    SAVE_RETRY_BACKOFF_MIN,
};

/// The reads of cuts: the first in line under way (or waiting for its next attempt), the
/// others waiting for it.
#[derive(Debug, Default)]
pub(super) struct CutReads {
    line: VecDeque<PendingCutRead>,
}

/// A cut's read, under way or waiting for the one before it.
#[derive(Debug)]
struct PendingCutRead {
    ticket: CutTicket,
    purpose: CutPurpose,
    step: u64,
    started: Instant,
    /// Attempts begun so far; answers name the attempt they belong to.
    attempt: u32,
    /// Attempts a recovery or new work disturbed.
    disturbed: u32,
    /// The next pause after a server could not be read.
    backoff: Duration,
    phase: CutPhase,
}

#[derive(Debug)]
enum CutPhase {
    /// Waiting until `until` to begin an attempt.
    Waiting { until: Instant },
    /// An attempt under way.
    Reading {
        before: CutState,
        /// (server, shard name) not answered yet.
        waiting: BTreeSet<(u32, String)>,
        reads: BTreeMap<String, ShardRead>,
        positions: PositionsTicket,
        collected: Option<WorkerPositions>,
    },
}

/// The first read in line, waiting, whose time to begin an attempt came.
#[derive(Debug, Clone, Copy)]
pub(super) struct DueRead {
    pub(super) purpose: CutPurpose,
    pub(super) step: u64,
    /// When it was asked for (it gives up past `SAVE_WAIT_MAX`).
    pub(super) started: Instant,
}

/// What a server's answer to a shard's read did ([`CutReads::shard_answered`]).
#[derive(Debug)]
pub(super) enum ShardAnswer {
    /// Not for the attempt under way (or answered already): nothing changes.
    Ignored,
    /// Recorded: the attempt may be complete now.
    Recorded,
    /// The server could not be reached: the read waits out its backoff, then begins again.
    BackedOff { step: u64, reason: String },
    /// The server refused the read. `disturbed`: a recovery or new work came since the
    /// attempt began (a server mid-restore refuses what it does not hold yet).
    Refused {
        step: u64,
        reason: String,
        disturbed: bool,
    },
}

/// How the attempt under way stands once an answer is in ([`CutReads::take_complete`]).
#[derive(Debug)]
pub(super) enum Completion {
    /// Shards or positions are still awaited (or no attempt is under way).
    NotYet,
    /// Everything is in, but a recovery or new work came between the reads: two cuts would mix.
    Disturbed,
    /// Everything is in and the cut is whole: the read leaves the line.
    Done(FinishedRead),
}

/// A read that ended with every shard and the positions in.
#[derive(Debug)]
pub(super) struct FinishedRead {
    pub(super) ticket: CutTicket,
    pub(super) purpose: CutPurpose,
    pub(super) step: u64,
    pub(super) reads: BTreeMap<String, ShardRead>,
    pub(super) positions: WorkerPositions,
}

impl CutReads {
    /// Whether a save's read is in line (one at a time).
    pub(super) fn save_in_line(&self) -> bool {
        self.line.iter().any(|r| r.purpose == CutPurpose::Save)
    }

    /// Puts read `ticket` of `step` for `purpose` in line, asked for at `now`.
    pub(super) fn queue(
        &mut self,
        now: Instant,
        ticket: CutTicket,
        step: u64,
        purpose: CutPurpose,
    ) {
        self.line.push_back(PendingCutRead {
            ticket,
            purpose,
            step,
            started: now,
            attempt: 0,
            disturbed: 0,
            backoff: SAVE_RETRY_BACKOFF_MIN,
            phase: CutPhase::Waiting { until: now },
        });
    }

    /// When the read under way must be advanced, if it waits.
    pub(super) fn deadline(&self) -> Option<Instant> {
        match &self.line.front()?.phase {
            CutPhase::Waiting { until } => Some(*until),
            CutPhase::Reading { .. } => None,
        }
    }

    /// The first read, if it waits and its time came at `now`.
    pub(super) fn due(&self, now: Instant) -> Option<DueRead> {
        let read = self.line.front()?;
        match read.phase {
            CutPhase::Waiting { until } if now >= until => Some(DueRead {
                purpose: read.purpose,
                step: read.step,
                started: read.started,
            }),
            _ => None,
        }
    }

    /// The first read waits until `until` before its next attempt.
    pub(super) fn wait_until(&mut self, until: Instant) {
        if let Some(read) = self.line.front_mut() {
            read.phase = CutPhase::Waiting { until };
        }
    }

    /// Begins the first read's next attempt: `before`, the cut state now; `shards`, every
    /// (server, shard) to read; `positions`, the collection of the workers' positions. Returns
    /// the read's ticket and the attempt's number.
    pub(super) fn begin_attempt(
        &mut self,
        before: CutState,
        shards: BTreeSet<(u32, String)>,
        positions: PositionsTicket,
    ) -> Option<(CutTicket, u32)> {
        let read = self.line.front_mut()?;
        read.attempt += 1;
        read.phase = CutPhase::Reading {
            before,
            waiting: shards,
            reads: BTreeMap::new(),
            positions,
            collected: None,
        };
        Some((read.ticket, read.attempt))
    }

    /// Server `ps`'s answer (`result`) to the read of `shard` for `attempt` of read `ticket`,
    /// at `now`; `cut_state`: the cut state now.
    pub(super) fn shard_answered(
        &mut self,
        now: Instant,
        (ticket, attempt): (CutTicket, u32),
        (ps, shard): (u32, &str),
        result: Result<ShardRead, CallFault>,
        cut_state: &CutState,
    ) -> ShardAnswer {
        let Some(read) = self
            .line
            .front_mut()
            .filter(|r| r.ticket == ticket && r.attempt == attempt)
        else {
            return ShardAnswer::Ignored;
        };
        let CutPhase::Reading {
            before,
            waiting,
            reads,
            ..
        } = &mut read.phase
        else {
            return ShardAnswer::Ignored;
        };
        if !waiting.remove(&(ps, shard.to_string())) {
            return ShardAnswer::Ignored;
        }
        match result {
            Ok(answer) => {
                reads.insert(shard.to_string(), answer);
                ShardAnswer::Recorded
            }
            Err(CallFault::Unreachable(reason)) => {
                read.phase = CutPhase::Waiting {
                    until: now + read.backoff,
                };
                read.backoff = (read.backoff * 2).min(SAVE_RETRY_BACKOFF_MAX);
                ShardAnswer::BackedOff {
                    step: read.step,
                    reason,
                }
            }
            Err(CallFault::Refused(reason)) => ShardAnswer::Refused {
                step: read.step,
                reason,
                disturbed: disturbed(read.purpose, before, cut_state),
            },
        }
    }

    /// The workers' positions of collection `ticket` arrived: whether the read under way
    /// awaited them.
    pub(super) fn positions_collected(
        &mut self,
        ticket: PositionsTicket,
        positions: WorkerPositions,
    ) -> bool {
        let Some(PendingCutRead {
            phase:
                CutPhase::Reading {
                    positions: awaited,
                    collected,
                    ..
                },
            ..
        }) = self.line.front_mut()
        else {
            return false;
        };
        if *awaited != ticket {
            return false;
        }
        *collected = Some(positions);
        true
    }

    /// Takes the attempt under way out of the line if every shard and the positions are in
    /// and the cut state is still `cut_state`'s.
    pub(super) fn take_complete(&mut self, cut_state: &CutState) -> Completion {
        let Some(read) = self.line.front() else {
            return Completion::NotYet;
        };
        let CutPhase::Reading {
            before,
            waiting,
            collected: Some(_),
            ..
        } = &read.phase
        else {
            return Completion::NotYet;
        };
        if !waiting.is_empty() {
            return Completion::NotYet;
        }
        if disturbed(read.purpose, before, cut_state) {
            return Completion::Disturbed;
        }
        let Some(read) = self.line.pop_front() else {
            return Completion::NotYet;
        };
        let CutPhase::Reading {
            reads, collected, ..
        } = read.phase
        else {
            return Completion::NotYet;
        };
        Completion::Done(FinishedRead {
            ticket: read.ticket,
            purpose: read.purpose,
            step: read.step,
            reads,
            positions: collected.unwrap_or_default(),
        })
    }

    /// The attempt under way was disturbed at `now`: it begins again at once (`Ok`, with the
    /// read's step), or, past `SAVE_ATTEMPTS_MAX` disturbed attempts, the read is to give up
    /// (`Err`, with its step).
    pub(super) fn disturbed(&mut self, now: Instant) -> Option<Result<u64, u64>> {
        let read = self.line.front_mut()?;
        read.disturbed += 1;
        if read.disturbed >= SAVE_ATTEMPTS_MAX {
            return Some(Err(read.step));
        }
        read.phase = CutPhase::Waiting { until: now };
        Some(Ok(read.step))
    }

    /// Takes the first read out of the line, ended without a cut: its ticket and purpose.
    pub(super) fn end_first(&mut self) -> Option<(CutTicket, CutPurpose)> {
        let read = self.line.pop_front()?;
        Some((read.ticket, read.purpose))
    }

    /// Read `ticket` begins its first attempt at `now` if it is first in line and waits for it:
    /// whether it does.
    pub(super) fn begin_now(&mut self, now: Instant, ticket: CutTicket) -> bool {
        let Some(read) = self.line.front_mut() else {
            return false;
        };
        if read.ticket != ticket || read.attempt != 0 {
            return false;
        }
        match &mut read.phase {
            CutPhase::Waiting { until } => {
                *until = now;
                true
            }
            CutPhase::Reading { .. } => false,
        }
    }

    /// Drops read `ticket` (under way or waiting) without an answer.
    pub(super) fn drop_read(&mut self, ticket: CutTicket) {
        self.line.retain(|r| r.ticket != ticket);
    }
}

/// Whether the cut state moved from `before` to `now` in a way that would mix two cuts for a
/// read of `purpose`: a recovery or a restore for either; new work only for a save (a
/// preemption's read holds dispatch, so new work does not run before it is taken).
fn disturbed(purpose: CutPurpose, before: &CutState, now: &CutState) -> bool {
    match purpose {
        CutPurpose::Save => before != now,
        CutPurpose::Preemption => {
            before.generation != now.generation || before.holding != now.holding
        }
    }
}
