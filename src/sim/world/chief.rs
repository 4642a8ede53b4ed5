//! The chief program, as the real one runs on the coordinator: schedule a batch, join it,
//! every few batches save a checkpoint (the coordinator reads a cut, the program writes it, in
//! the background half the time); and a new chief incarnation's start from the newest
//! checkpoint that verifies. The chief process's death and restart are `processes`'s; the
//! checkpoint's bytes are `storage`'s.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::Rng;

use super::super::outcome::{self, UnexpectedEnd};
use super::super::Node;
use super::job;
use super::storage::PendingWrite;
use super::{Event, ProcState, World};
use crate::roles::coordinator::{
    CreateError, CreateTicket, CutReadError, CutReading, CutTicket, RestoreTicket, StartFailure,
};

/// The chief program: schedule a batch, join, sometimes save, until every closure ran.
pub(super) struct Chief {
    pub(super) scheduled: u64,
    pub(super) batches: u64,
    pub(super) phase: ChiefPhase,
    pub(super) saves: u32,
    /// Restores at start-up that failed (each one restarts the chief).
    pub(super) startup_failures: u32,
    /// The servers this chief incarnation's cluster spec names (`0..spec_servers`): where
    /// its program places its variables (`job::layouts`).
    pub(super) spec_servers: u32,
    /// Per read of a cut and server, the snapshot its newest shard read returned, with the
    /// read's attempt (the harness's record of what the saved state holds, PS-1).
    pub(super) read: BTreeMap<(CutTicket, u32, String), (u32, usize)>,
    /// A save written in the background while the program schedules on
    /// (`save_checkpoint_in_background`): the next save, and the job's end, wait for it.
    pub(super) background: Option<Box<PendingWrite>>,
}

/// Where the chief program is.
pub(super) enum ChiefPhase {
    Schedule,
    Join,
    /// Time to save a checkpoint: ask the coordinator to read a cut.
    Save,
    /// The coordinator reads a cut for the save (read `ticket`).
    Saving {
        ticket: CutTicket,
    },
    /// The program writes the checkpoint of the cut read (and reads it back), as
    /// `save_checkpoint` does before it marks the cut; a fault may come meanwhile.
    Writing(Box<PendingWrite>),
    /// A chief incarnation's program begins at this time: it creates its variables, then
    /// starts (probes every server, restores).
    Starting(Duration),
    /// The program creates variable `v` (`ticket`: its creation under way; `None`: not asked
    /// yet, or asked again at the next turn while the servers are resharded), one at a time
    /// as `create_variable` does; past the last one it configures the workers and starts.
    Creating {
        v: u32,
        ticket: Option<CreateTicket>,
    },
    /// The chief's start runs: restoring stored checkpoint `stored`, or afresh (`None`).
    Restoring {
        ticket: RestoreTicket,
        stored: Option<usize>,
    },
}

impl World<'_> {
    /// The chief program: schedule a batch, join it, every few batches save a checkpoint.
    pub(super) fn program(&mut self) {
        let now = self.instant();
        match &self.chief.phase {
            ChiefPhase::Schedule => {
                let n = self
                    .config
                    .batch
                    .min(self.config.closures - self.chief.scheduled);
                for _ in 0..n {
                    if self.coord.handle_schedule(now, "step", Vec::new()).is_err() {
                        self.violate("LIVENESS", "the schedule queue refused a closure".into());
                        return;
                    }
                }
                self.chief.scheduled += n;
                self.chief.batches += 1;
                self.chief.phase = ChiefPhase::Join;
            }
            ChiefPhase::Join => {
                if !self.coord.is_idle() {
                    return;
                }
                if let Some(error) = self.coord.take_error() {
                    self.end_early(outcome::of_closure_failure(&error));
                    return;
                }
                if self.chief.scheduled >= self.config.closures {
                    // As the program's final save would, the end waits for the servers to
                    // settle (no restore, and no server joining or leaving, under way) and for
                    // a save still written in the background.
                    let settled = !self.coord.is_holding() && !self.coord.server_changes_pending();
                    if settled && self.chief.background.is_none() {
                        self.ended = Some(Ok(()));
                    }
                    return;
                }
                self.chief.phase =
                    if self.chief.batches % self.config.save_every_batches.max(1) == 0 {
                        ChiefPhase::Save
                    } else {
                        ChiefPhase::Schedule
                    };
            }
            ChiefPhase::Save => {
                // One save in the background at a time: the one before ends first.
                if self.chief.background.is_some() {
                    return;
                }
                // As the real save: the coordinator reads the cut (waiting out recoveries and
                // servers that cannot be read for now, within SAVE_WAIT_MAX).
                let step = self.storage.len() as u64;
                match self.coord.handle_read_cut(now, step) {
                    Ok(ticket) => self.chief.phase = ChiefPhase::Saving { ticket },
                    Err(e) => self.end_early(Err(UnexpectedEnd::CutRead(e))),
                }
            }
            ChiefPhase::Saving { .. } | ChiefPhase::Writing(_) => {}
            ChiefPhase::Starting(at) => {
                if self.now < *at {
                    return;
                }
                self.chief.phase = ChiefPhase::Creating { v: 0, ticket: None };
                self.create_next_variable();
            }
            ChiefPhase::Creating { ticket: None, .. } => self.create_next_variable(),
            ChiefPhase::Creating { .. } | ChiefPhase::Restoring { .. } => {}
        }
    }

    /// The coordinator's read of a cut for the chief's save ended: save it, or the program
    /// fails as the real one does when `save_checkpoint` raises.
    pub(super) fn cut_read(&mut self, ticket: CutTicket, result: Result<CutReading, CutReadError>) {
        let ChiefPhase::Saving { ticket: awaited } = self.chief.phase else {
            return;
        };
        if awaited != ticket {
            return;
        }
        match result {
            Ok(reading) => {
                let Some(history) = self.take_read(ticket) else {
                    return;
                };
                let generation = reading.generation;
                let checkpoint = match reading.into_checkpoint() {
                    Ok(checkpoint) => checkpoint,
                    Err(e) => {
                        self.end_early(Err(UnexpectedEnd::Checkpoint(e)));
                        return;
                    }
                };
                let write = Box::new(PendingWrite {
                    checkpoint,
                    generation,
                    history,
                    committed: self.committed_ids(),
                    scheduled: self.chief.scheduled,
                    batches: self.chief.batches,
                });
                // As the demo, half the saves are written in the background while the program
                // schedules on (closures commit between the cut's read and its mark); the
                // others block the program until they are written.
                if self.rng.gen_bool(0.5) {
                    self.chief.background = Some(write);
                    self.chief.phase = ChiefPhase::Schedule;
                } else {
                    self.chief.phase = ChiefPhase::Writing(write);
                }
                // Writing and reading back takes a while (a large embedding's checkpoint takes
                // seconds): faults that come meanwhile find the cut read and not yet marked.
                let most = self.config.save_write_max.as_millis().max(1) as u64;
                let took = Duration::from_millis(self.rng.gen_range(1..=most));
                let chief = self.chief_incarnation;
                self.at(self.now + took, Event::SaveWritten { chief });
            }
            Err(e) => self.end_early(outcome::of_cut_read(&e)),
        }
    }

    /// The chief's write of its checkpoint ended (if the incarnation that began it lives): it
    /// is stored, and marked as the cut if it reads back whole; the program goes on.
    pub(super) fn save_written(&mut self, chief: u64) {
        if chief != self.chief_incarnation || self.chief_state != ProcState::Up {
            return;
        }
        let write = match std::mem::replace(&mut self.chief.phase, ChiefPhase::Schedule) {
            ChiefPhase::Writing(write) => write,
            phase => {
                self.chief.phase = phase;
                match self.chief.background.take() {
                    Some(write) => write,
                    None => return,
                }
            }
        };
        self.save(*write);
    }

    /// The chief's start ended: the program goes on from the checkpoint's step (or from the
    /// beginning, afresh), or the chief exits (its supervisor restarts it, and it tries again).
    pub(super) fn startup_restored(
        &mut self,
        ticket: RestoreTicket,
        result: Result<Option<u64>, StartFailure>,
    ) {
        let ChiefPhase::Restoring { ticket: t, stored } = self.chief.phase else {
            return;
        };
        if t != ticket {
            return;
        }
        match (result, stored) {
            (Ok(Some(step)), Some(stored)) if step as usize == stored => {
                let s = &self.storage[stored];
                self.chief.scheduled = s.scheduled;
                self.chief.batches = s.batches;
                self.committed_before = s.committed.clone();
                self.chief.phase = ChiefPhase::Schedule;
                self.chief_resumes += 1;
            }
            (Ok(None), None) => {
                // Afresh, over the variables the program created before its start. A server
                // that restarted since holds none: the coordinator finds it lost when a
                // closure reads it, as the real one does.
                self.chief.scheduled = 0;
                self.chief.batches = 0;
                self.chief.phase = ChiefPhase::Save;
            }
            (Ok(step), stored) => {
                let detail =
                    format!("the start restored {step:?}, not the checkpoint read ({stored:?})");
                self.violate("CKPT-1", detail);
            }
            (Err(e), _) => {
                self.chief.startup_failures += 1;
                if self.chief.startup_failures > CHIEF_START_ATTEMPTS_MAX {
                    self.end_early(outcome::of_start_failure(&e, stored.is_some()));
                    return;
                }
                self.kill(Node::Chief);
            }
        }
    }

    /// The program's next variable, created as a real chief program creates its variables
    /// before its start (`ServerModel::create_variables`, then `restore_checkpoint`): through
    /// the coordinator, variable `v` whole on server `v % spec_servers` (a server that holds
    /// it keeps it; one restarted since the last start holds none). The coordinator asks a
    /// server it cannot reach again until `ps_restart_wait`. Once every variable is created
    /// the workers are configured with them, and the start begins.
    fn create_next_variable(&mut self) {
        let ChiefPhase::Creating { v, ticket: None } = self.chief.phase else {
            return;
        };
        let mut layouts = job::layouts(self.config.num_ps, self.chief.spec_servers.max(1));
        if v as usize >= layouts.len() {
            self.coord.handle_configure(job::setup(self.config, layouts));
            self.start_from_checkpoint();
            return;
        }
        let layout = layouts.swap_remove(v as usize);
        let now = self.instant();
        match self
            .coord
            .handle_create_variable(now, &layout, vec![job::initial_spec(v)])
        {
            Ok(ticket) => {
                self.chief.phase = ChiefPhase::Creating {
                    v,
                    ticket: Some(ticket),
                }
            }
            // As the client: asked again (at the next turn) once the servers are resharded.
            Err(CreateError::Resharding { .. }) => {}
            Err(e) => self.end_early(Err(UnexpectedEnd::Create(e))),
        }
    }

    /// The coordinator's creation `ticket` ended: the program creates its next variable, or
    /// fails as the real one does when `create_variable` raises.
    pub(super) fn variable_created(&mut self, ticket: CreateTicket, result: Result<(), CreateError>) {
        let ChiefPhase::Creating {
            v,
            ticket: Some(awaited),
        } = self.chief.phase
        else {
            return;
        };
        if awaited != ticket {
            return;
        }
        match result {
            Ok(()) => {
                self.chief.phase = ChiefPhase::Creating {
                    v: v + 1,
                    ticket: None,
                };
                self.create_next_variable();
            }
            Err(e) => self.end_early(outcome::of_create_failure(&e)),
        }
    }

    /// The new chief incarnation's start, as the real program's `restore_checkpoint`: the
    /// newest checkpoint that verifies (CKPT-1), if any, goes to the coordinator, which probes
    /// every server and restores it (rolling back servers that went on past it), or starts
    /// afresh only if no server has applied anything (their ids and values would otherwise be
    /// reused or lost).
    fn start_from_checkpoint(&mut self) {
        let candidates: Vec<usize> = (0..self.storage.len())
            .rev()
            .filter(|stored| !self.storage[*stored].preemption)
            .collect();
        let newest = candidates
            .into_iter()
            .find_map(|stored| Some((stored, self.read_stored(stored)?)));
        let (stored, checkpoint) = match newest {
            Some((stored, checkpoint)) => (Some(stored), Some(checkpoint)),
            None => (None, None),
        };
        let root = std::path::PathBuf::from("sim-checkpoints");
        let now = self.instant();
        match self.coord.handle_start(now, checkpoint, root) {
            Ok(ticket) => self.chief.phase = ChiefPhase::Restoring { ticket, stored },
            Err(e) => self.end_early(Err(UnexpectedEnd::Start(e))),
        }
    }
}

/// Restores at start-up a chief may fail before the job fails.
const CHIEF_START_ATTEMPTS_MAX: u32 = 3;
