//! The coordinator machine's parameter-server recoveries: what it does when a server is seen
//! alive, answers, is declared dead or unreachable; the restore that rolls every server back to
//! the last checkpoint cut and queues again what committed since (or falls back, or fails the
//! loss naming its cause); and the chief's restore at start-up, which runs through the same
//! restore. The [`RestoreRun`] sub-machine owns one restore's phases; this file decides when one
//! starts and what its end means. Part of [`Scheduler`]: pure, no IO, no clock.

use super::*;

impl Scheduler {
    /// A parameter-server incarnation was seen alive. The first incarnation seen of a server is its
    /// original; a newer one means the process restarted and lost its state, so a recovery
    /// starts (or goes on) for it; the same incarnation after a worker reported the server
    /// unreachable clears the suspicion (never after the failure detector declared it dead).
    pub fn handle_ps_up(&mut self, now: Instant, ps: u32, incarnation: u64) {
        if self.outside_job(ps) {
            // Not a server of the job (yet, or any more: see `reshard`).
            return;
        }
        let fresh = PsEntry {
            incarnation,
            alive: true,
            dead: false,
        };
        match self.servers.get_mut(&ps) {
            None => {
                self.servers.insert(ps, fresh);
            }
            Some(entry) if incarnation > entry.incarnation => {
                *entry = fresh;
                if !self.lost_for_good.contains_key(&ps) {
                    self.recovery(now).state_lost.insert(ps);
                }
            }
            Some(entry) if incarnation == entry.incarnation && !entry.alive && !entry.dead => {
                entry.alive = true
            }
            Some(_) => return,
        }
        self.dispatch(now);
    }

    /// A parameter server answered a call (the coordinator's dial): as
    /// [`Self::handle_ps_up`], and an incarnation that holds no variable although a checkpoint
    /// cut exists has lost its state (it restarted unnoticed, or its restore never finished):
    /// a recovery restores it. While a restore runs this is left to the restore's own outcome.
    pub fn handle_ps_answered(&mut self, now: Instant, ps: u32, incarnation: u64, serving: bool) {
        if self.outside_job(ps) {
            return;
        }
        let restoring = self.recovery.as_ref().is_some_and(Recovery::restoring);
        let known = self.servers.get(&ps).map(|e| (e.incarnation, e.dead));
        if !serving
            && self.rollback.floor(self.generation).is_some()
            && !restoring
            && !self.lost_for_good.contains_key(&ps)
            && known.is_none_or(|(e, dead)| incarnation > e || (incarnation == e && !dead))
        {
            self.recovery(now).state_lost.insert(ps);
        }
        self.handle_ps_up(now, ps, incarnation);
        self.dispatch(now);
    }

    /// The failure detector declared a parameter-server incarnation dead: its state is gone
    /// (a dead incarnation never comes back, FENCE-1). Dispatch is held until a new
    /// incarnation is up and every server is restored.
    pub fn handle_ps_lost(&mut self, now: Instant, ps: u32, incarnation: u64) {
        if self.outside_job(ps) {
            // Not a server of the job: a join not carried out yet is called off.
            if self.call_off_join(ps, incarnation) {
                self.dispatch(now);
            }
            return;
        }
        match self.servers.get_mut(&ps) {
            Some(entry) if entry.incarnation == incarnation => {
                entry.alive = false;
                entry.dead = true;
            }
            _ => return,
        }
        if !self.lost_for_good.contains_key(&ps) {
            self.recovery(now).state_lost.insert(ps);
        }
        self.dispatch(now);
    }

    /// A worker could not reach parameter server `ps` while running a closure: the server's
    /// failure, not the closure's, nor the worker's. The closure is queued again (counted as
    /// re-dispatched) and dispatch is held until the server answers again (the same
    /// incarnation: nothing was lost, PS-1 keeps a partial push from applying twice) or comes
    /// back as a new one (then every server is restored). For a server already lost for good
    /// the closure fails as unavailable. A report from a fenced incarnation or for a
    /// superseded attempt is ignored (FENCE-1).
    pub fn handle_ps_unavailable(
        &mut self,
        now: Instant,
        worker: u32,
        incarnation: WorkerIncarnation,
        closure: ClosureId,
        attempt: u32,
        ps: u32,
    ) -> ResultDisposition {
        if !self.is_current(worker, incarnation, closure, attempt) {
            self.ledger.rejected_stale += 1;
            return ResultDisposition::RejectedStale;
        }
        if let Some(entry) = self.workers.get_mut(&worker) {
            entry.in_flight.retain(|c| *c != closure);
        }
        if let Some(reason) = self.lost_for_good.get(&ps).cloned() {
            self.fail_unavailable(closure, format!("parameter server ps/{ps} lost: {reason}"));
            self.dispatch(now);
            return ResultDisposition::Failed;
        }
        if let Some(c) = self.closures.get_mut(&closure) {
            c.state = ClosureState::Queued;
            self.queue.push_front(closure);
            self.ledger.redispatched += 1;
        }
        if let Some(entry) = self.servers.get_mut(&ps) {
            entry.alive = false;
        }
        self.recovery(now);
        self.dispatch(now);
        ResultDisposition::PsUnavailable
    }

    /// The shell restored every parameter server from the checkpoint taken at `cut`: the
    /// closures committed since the cut lost their effect, so they are queued again (counted
    /// in [`Ledger::rolled_back`]; LEDGER-1 holds: they are pending again, not committed) and
    /// dispatch resumes. If a server restarted (or was declared dead) while the restore ran,
    /// the incarnation restored is not the one serving now: a new recovery starts at once and
    /// dispatch stays held. Returns how many were queued again; an error if no restore was
    /// asked for at that cut (nothing changes).
    pub(super) fn handle_restored(
        &mut self,
        now: Instant,
        cut: ClosureId,
    ) -> Result<u64, NoRestoreAsked> {
        if !self.recovery.as_ref().is_some_and(Recovery::restoring)
            || self.rollback.cut() != Some(cut)
        {
            return Err(NoRestoreAsked { cut: cut.0 });
        }
        // What committed since the cut runs again; what committed between the fallback cut
        // and this one stays kept for a later rollback to the fallback.
        let replay = self.rollback.take_replay(cut);
        let requeued = replay.len() as u64;
        let ids: BTreeSet<ClosureId> = replay.keys().copied().collect();
        self.finished.retain(|id| !ids.contains(id));
        for (id, retained) in replay.into_iter().rev() {
            match self.closures.get_mut(&id) {
                Some(c) => {
                    assert!(
                        matches!(c.state, ClosureState::Committed(_)),
                        "LEDGER-1: a closure kept for rollback is committed"
                    );
                    c.state = ClosureState::Queued;
                    c.args = retained.args;
                }
                // Committed, then forgotten (finished_retained_max): known again.
                None => {
                    self.closures.insert(
                        id,
                        Closure {
                            function: retained.function,
                            args: retained.args,
                            state: ClosureState::Queued,
                            attempts: retained.attempts,
                            learning_rate: retained.learning_rate,
                        },
                    );
                }
            }
            self.unfinished.insert(id);
            self.queue.push_front(id);
            self.ledger.committed -= 1;
            self.ledger.pending += 1;
            self.ledger.rolled_back += 1;
        }
        self.ledger.ps_restores += 1;
        let pinned = self.recovery.take().map(|r| r.pinned()).unwrap_or_default();
        // A server whose incarnation changed (or died) during the restore is not restored.
        let changed: BTreeSet<u32> = self
            .servers
            .iter()
            .filter(|(ps, e)| {
                e.dead
                    || pinned
                        .get(ps)
                        .is_none_or(|incarnation| *incarnation != e.incarnation)
            })
            .map(|(ps, _)| *ps)
            .filter(|ps| !self.lost_for_good.contains_key(ps))
            .collect();
        if !changed.is_empty() {
            self.recovery(now).state_lost = changed;
        }
        self.reshard_restore_ended(Ok(()));
        self.dispatch(now);
        Ok(requeued)
    }

    /// The restore asked for could not reach parameter server `ps` (or one of them, if
    /// `None`): it may have restarted meanwhile. Nothing is lost yet: the servers are dialled
    /// again and, once every one answers, restored again from the same cut, within
    /// [`SchedulerConfig::ps_restart_wait_max`] of now and at most [`RESTORE_ATTEMPTS_MAX`]
    /// times per recovery; past that the loss is unrecoverable as for a failed restore.
    pub(super) fn handle_restore_interrupted(
        &mut self,
        now: Instant,
        ps: Option<u32>,
        reason: String,
    ) {
        let Some(r) = self.recovery.as_mut().filter(|r| r.restoring()) else {
            return;
        };
        r.interrupted += 1;
        if r.interrupted >= RESTORE_ATTEMPTS_MAX {
            let ps = ps.or_else(|| self.recovering_ps()).unwrap_or(0);
            self.fail_recovery(
                ps,
                PsLossCause::RestoreInterrupted {
                    attempts: RESTORE_ATTEMPTS_MAX,
                    reason,
                },
            );
            self.dispatch(now);
            return;
        }
        let pinned = r.pinned();
        r.run = None;
        r.since = now;
        let suspects: Vec<u32> = match ps {
            Some(ps) => vec![ps],
            None => pinned.into_keys().collect(),
        };
        for ps in suspects {
            r.state_lost.insert(ps);
            // Dialled until it answers; one never seen counts as incarnation 0 (any answer is newer).
            self.servers
                .entry(ps)
                .or_insert(PsEntry {
                    incarnation: 0,
                    alive: false,
                    dead: false,
                })
                .alive = false;
        }
        self.dispatch(now);
    }

    /// The restore asked for failed: the loss cannot be recovered; `join` fails naming the
    /// server and what was queued fails as unavailable.
    pub(super) fn handle_restore_failed(&mut self, now: Instant, reason: String) {
        if !self.recovery.as_ref().is_some_and(Recovery::restoring) {
            return;
        }
        let ps = self.recovering_ps().unwrap_or(0);
        self.fail_recovery(ps, PsLossCause::RestoreFailed { reason });
        self.dispatch(now);
    }

    /// A checkpoint taken at `cut` (the next closure id then, with nothing pending) is durable:
    /// a parameter-server recovery rolls back to it. Closures committed before it are no
    /// longer kept for a rollback. Refused if a closure below `cut` is unfinished, `cut` is
    /// beyond the ids given out, or a restore is under way (CKPT-1: a checkpoint read across a
    /// restore mixes two cuts; the shell also refuses a cut read before the current restore
    /// generation). A recovery that only holds dispatch does not refuse it: the servers were
    /// read before it, and the restore it leads to then rolls back to this newer cut.
    pub fn mark_cut(&mut self, cut: ClosureId, root: PathBuf) -> Result<(), MarkCutError> {
        let marked = self.mark_cut_at(cut, root.clone());
        if marked.is_ok() {
            // The program's checkpoints live here: preemption cuts go beside them.
            self.preemption.saves_root = Some(root);
        }
        self.cut_write_ended(cut, marked.as_ref().err().map(ToString::to_string));
        marked
    }

    /// [`Self::mark_cut`] for any checkpoint (the program's, or a preemption cut).
    pub(super) fn mark_cut_at(
        &mut self,
        cut: ClosureId,
        root: PathBuf,
    ) -> Result<(), MarkCutError> {
        if cut.0 > self.next_id {
            return Err(MarkCutError::BeyondNextId {
                cut: cut.0,
                next: self.next_id,
            });
        }
        if self.unfinished.first().is_some_and(|first| *first < cut) {
            return Err(MarkCutError::Pending { cut: cut.0 });
        }
        if self.is_restoring() {
            return Err(MarkCutError::Restoring);
        }
        // A save written in the background can be overtaken by a newer cut (a parameter
        // server's preemption cut taken meanwhile): going back to it would roll back past
        // closures only the newer cut accounts for, which are no longer kept to run again.
        if let Some(current) = self.rollback.cut().filter(|current| cut < *current) {
            return Err(MarkCutError::Older {
                cut: cut.0,
                current: current.0,
            });
        }
        self.rollback.set(cut, cut, root);
        Ok(())
    }

    /// The checkpoint of the last cut could not be read for a recovery: roll back to the
    /// fallback cut instead (its checkpoint is read by a new restore, and everything committed
    /// since it runs again), or fail the recovery if there is none.
    pub(super) fn handle_cut_unreadable(&mut self, now: Instant, reason: String) {
        if !self.recovery.as_ref().is_some_and(Recovery::restoring) {
            return;
        }
        if !self.rollback.fall_back() {
            self.handle_restore_failed(now, reason);
            return;
        }
        if let Some(r) = self.recovery.as_mut() {
            r.run = None;
        }
        self.advance_recovery();
    }

    /// The answer to one [`SchedulerAction::Restore`] call of restore `generation`. An answer
    /// for another generation (a restore given up since) or one not awaited changes nothing.
    /// The restore's end is acted on here: a recovery queues again what committed since the
    /// cut (or restores again if a server changed meanwhile), a restore at start-up continues
    /// the checkpoint's ledger; either way workers whose datasets could not be rewound are
    /// lost, and setups handed out before are outdated.
    pub fn handle_restore_report(&mut self, now: Instant, generation: u64, report: RestoreReport) {
        let live: Vec<(u32, WorkerIncarnation)> = self
            .workers
            .iter()
            .filter(|(_, w)| w.alive)
            .map(|(i, w)| (*i, w.incarnation))
            .collect();
        let Some(active) = self
            .recovery
            .as_mut()
            .and_then(|r| r.run.as_mut())
            .filter(|a| a.run.generation() == generation)
        else {
            return;
        };
        // A rewind a restore sends outdates every setup handed out before it, so that a worker
        // never lets a delayed older setup undo it (the end of the restore bumps it again).
        self.setup_version += 1;
        let mut setup = self.setup.clone();
        setup.version = self.setup_version;
        setup.generation = generation;
        let targets = RewindTargets {
            workers: &live,
            setup: &setup,
        };
        let (calls, end) = active.run.handle(report, targets);
        self.actions
            .extend(calls.into_iter().map(SchedulerAction::Restore));
        let Some(end) = end else { return };
        let purpose = active.purpose.clone();
        if let RunEnd::Done {
            positions,
            lost_workers,
            ..
        } = &end
        {
            self.positions = positions.clone();
            // Setups handed out before now carry the old positions.
            self.setup_version += 1;
            for (worker, incarnation) in lost_workers {
                self.handle_worker_lost(now, *worker, *incarnation);
            }
        }
        match (purpose, end) {
            (Purpose::Recovery { cut }, RunEnd::Done { .. }) => {
                // Every server's low watermark is the cut now.
                self.watermark_sent = cut.0;
                let _ = self.handle_restored(now, cut);
            }
            (Purpose::Recovery { .. }, RunEnd::Interrupted { ps, reason }) => {
                self.handle_restore_interrupted(now, Some(ps), reason)
            }
            (Purpose::Recovery { .. }, RunEnd::Failed { reason }) => {
                self.handle_restore_failed(now, reason)
            }
            (Purpose::Recovery { .. }, RunEnd::Unreadable { reason }) => {
                self.handle_cut_unreadable(now, reason)
            }
            (
                Purpose::Startup {
                    ticket,
                    ledger,
                    next_id,
                    stored_at,
                    root,
                    learning_rate,
                },
                end,
            ) => {
                let result = match end {
                    RunEnd::Done { step, .. } => self.resume(ledger, next_id).map(|()| {
                        self.start.restored();
                        self.learning_rate = learning_rate;
                        self.resume_generation(generation);
                        self.watermark_sent = next_id;
                        // The variables are at this checkpoint now: a recovery rolls back
                        // to it until the next save.
                        self.preemption.saves_root = Some(root.clone());
                        self.rollback
                            .set(ClosureId(next_id), ClosureId(stored_at), root);
                        Some(step)
                    }),
                    RunEnd::Interrupted { ps, reason } => {
                        Err(StartFailure::ServerLost { ps, reason })
                    }
                    RunEnd::Failed { reason } | RunEnd::Unreadable { reason } => {
                        Err(StartFailure::Failed(reason))
                    }
                };
                self.end_startup_restore(now);
                self.actions
                    .push_back(SchedulerAction::RestoreFinished { ticket, result });
            }
            (Purpose::FreshStart { ticket, root }, end) => {
                self.end_startup_restore(now);
                self.fresh_start_fenced(now, ticket, root, end);
            }
        }
        self.dispatch(now);
    }

    /// Restores every parameter server from `checkpoint` (read from `root` by the chief
    /// program) before anything is scheduled, through the same restore as a recovery. The
    /// servers answered as `probes` (every one of them, each once): the restore goes to those
    /// incarnations, opens a generation above every one they are at, and rolls their PS-1
    /// state back to above every closure id any of them has applied (a restarted coordinator
    /// reconnecting to live servers must never reuse one, PS-1). The ledger and closure ids
    /// carry on from the checkpoint's (LEDGER-1 across restarts). Dispatch is held while it
    /// runs; [`SchedulerAction::RestoreFinished`] with the returned ticket tells how it ended.
    /// Refused if anything was scheduled, a restore is under way, or a server is missing.
    pub fn handle_restore_at_start(
        &mut self,
        now: Instant,
        checkpoint: std::sync::Arc<Checkpoint>,
        root: PathBuf,
        probes: &[ServerProbe],
        num_servers: u32,
    ) -> Result<RestoreTicket, StartFailure> {
        let ticket = RestoreTicket(self.next_ticket);
        self.next_ticket += 1;
        let servers = (0..num_servers).collect();
        self.restore_at_start(now, ticket, checkpoint, root, probes, &servers)?;
        Ok(ticket)
    }

    /// [`Self::handle_restore_at_start`] under `ticket` (also the end of
    /// [`Self::handle_start`]'s probes).
    pub(super) fn restore_at_start(
        &mut self,
        now: Instant,
        ticket: RestoreTicket,
        checkpoint: std::sync::Arc<Checkpoint>,
        root: PathBuf,
        probes: &[ServerProbe],
        servers: &BTreeSet<u32>,
    ) -> Result<(), StartFailure> {
        if self.next_id != 0 || !self.closures.is_empty() {
            return Err(StartFailure::AfterScheduling);
        }
        if self.recovery.is_some() {
            return Err(StartFailure::RecoveryUnderWay);
        }
        let answered: BTreeSet<u32> = probes.iter().map(|p| p.ps).collect();
        if let Some(&missing) = servers.iter().find(|ps| !answered.contains(ps)) {
            return Err(StartFailure::ServerMissing { ps: missing });
        }
        if servers.is_empty() {
            return Err(StartFailure::NoServers);
        }
        let learning_rate =
            recorded_learning_rate(&checkpoint).map_err(|e| StartFailure::Failed(e.to_string()))?;
        let saved = &checkpoint.ledger;
        let saved_cut = saved.next_closure_id;
        let ledger = saved.counts.clone();
        let live_next = probes
            .iter()
            .map(|p| p.next_free_closure_id)
            .max()
            .unwrap_or(0);
        let next_id = saved.next_closure_id.max(live_next);
        let (run, calls) = self.start_run_over(
            probes,
            ClosureId(next_id),
            CheckpointSource::Loaded(CheckpointRef(checkpoint)),
        );
        let recovery = self.recovery(now);
        recovery.run = Some(ActiveRun {
            run,
            purpose: Purpose::Startup {
                ticket,
                ledger,
                next_id,
                stored_at: saved_cut,
                root,
                learning_rate,
            },
        });
        self.actions
            .extend(calls.into_iter().map(SchedulerAction::Restore));
        Ok(())
    }

    /// A start's restore run over the servers that answered `probes`: it opens a generation
    /// above every one they are at (and this coordinator's), goes to the incarnations that
    /// answered, and rolls their PS-1 state back to `finished_below`.
    pub(super) fn start_run_over(
        &mut self,
        probes: &[ServerProbe],
        finished_below: ClosureId,
        source: CheckpointSource,
    ) -> (RestoreRun, Vec<RestoreCall>) {
        let generation = probes
            .iter()
            .map(|p| p.generation)
            .max()
            .unwrap_or(0)
            .max(self.generation)
            + 1;
        self.generation = generation;
        self.see_probed(probes);
        let pinned = probes.iter().map(|p| (p.ps, p.incarnation)).collect();
        RestoreRun::start(
            generation,
            pinned,
            self.fenced.iter().map(|(w, e)| (*w, *e)).collect(),
            finished_below,
            source,
            self.setup.layouts.clone(),
        )
    }

    /// The servers a start's probes answered are seen as those incarnations: a recovery
    /// begun later (a move of the variables right after the start) restores them without
    /// waiting for the failure detector to hear them first.
    pub(super) fn see_probed(&mut self, probes: &[ServerProbe]) {
        let seen: Vec<(u32, u64)> = probes
            .iter()
            .filter(|p| !self.outside_job(p.ps))
            .map(|p| (p.ps, p.incarnation))
            .collect();
        for (ps, incarnation) in seen {
            let fresh = PsEntry {
                incarnation,
                alive: true,
                dead: false,
            };
            let entry = self.servers.entry(ps).or_insert(fresh);
            if incarnation > entry.incarnation {
                *entry = fresh;
            }
        }
    }

    /// Ends the restore at start-up: dispatch resumes, unless a server was lost meanwhile
    /// (then a recovery goes on for it).
    pub(super) fn end_startup_restore(&mut self, now: Instant) {
        let Some(r) = self.recovery.as_mut() else {
            return;
        };
        r.run = None;
        r.since = now;
        if r.state_lost.is_empty() && self.ps_down().is_empty() {
            self.recovery = None;
        }
    }

    /// Whether every server of the job answers as a known incarnation: none down, and none
    /// never seen by this coordinator (it restarted while the server was cut off), which has no
    /// incarnation to pin and waits for its dial to answer.
    pub(super) fn every_server_back(&self) -> bool {
        self.ps_down().is_empty()
            && self
                .server_set
                .indexes()
                .iter()
                .all(|ps| self.servers.contains_key(ps))
    }

    /// The recovery under way, or a new one from `now`.
    pub(super) fn recovery(&mut self, now: Instant) -> &mut Recovery {
        self.recovery.get_or_insert_with(|| Recovery {
            since: now,
            state_lost: BTreeSet::new(),
            run: None,
            interrupted: 0,
            creating_again: None,
        })
    }

    /// The server a recovery is about: the first that lost its state, else the first down.
    pub(super) fn recovering_ps(&self) -> Option<u32> {
        let r = self.recovery.as_ref()?;
        r.state_lost
            .first()
            .copied()
            .or_else(|| self.ps_down().first().copied())
    }

    /// Moves a recovery on: fails it at once if it cannot succeed; ends it when nothing was
    /// lost; asks for the restore once every server is back and nothing is in flight.
    pub(super) fn advance_recovery(&mut self) {
        if self.advance_recovery_before_start() {
            return;
        }
        let Some(r) = &self.recovery else { return };
        if r.restoring() {
            return;
        }
        if let Some(&ps) = r.state_lost.first() {
            match self.rollback.restore_blocker(self.generation) {
                // The first checkpoint was read before the loss and is being written: the
                // restore begins once it is marked (bounded by `ps_restart_wait_max`).
                Some(RestoreBlocker::FirstCutBeingWritten) => return,
                Some(RestoreBlocker::Cannot(cause)) => {
                    self.fail_recovery(ps, cause);
                    return;
                }
                None => {}
            }
        }
        let in_flight = self.workers.values().any(|w| !w.in_flight.is_empty());
        if !self.every_server_back() || in_flight {
            return;
        }
        let lost = self
            .recovery
            .as_ref()
            .is_some_and(|r| !r.state_lost.is_empty());
        match self.rollback.restore_point().cloned() {
            Some(KeptCut {
                cut,
                stored_at,
                root,
            }) if lost => {
                self.generation += 1;
                let pinned = self
                    .servers
                    .iter()
                    .map(|(ps, e)| (*ps, e.incarnation))
                    .collect();
                let (run, calls) = RestoreRun::start(
                    self.generation,
                    pinned,
                    self.fenced.iter().map(|(w, e)| (*w, *e)).collect(),
                    cut,
                    CheckpointSource::AtCut {
                        root,
                        cut: stored_at,
                    },
                    self.setup.layouts.clone(),
                );
                if let Some(r) = self.recovery.as_mut() {
                    r.run = Some(ActiveRun {
                        run,
                        purpose: Purpose::Recovery { cut },
                    });
                }
                self.actions
                    .extend(calls.into_iter().map(SchedulerAction::Restore));
            }
            // Every server answered as the incarnation it was: nothing was lost.
            _ => self.recovery = None,
        }
    }

    /// Ends a recovery that cannot succeed: `join` raises [`ClosureFailure::PsLost`] and what
    /// was queued fails as unavailable; closures the server's absence fails later fail too
    /// (never waiting), and the coordinator stays usable.
    pub(super) fn fail_recovery(&mut self, ps: u32, cause: PsLossCause) {
        if self.first_error.is_none() {
            self.first_error = Some(ClosureFailure::PsLost {
                ps,
                cause: cause.clone(),
            });
        }
        let reason = cause.to_string();
        let lost = self
            .recovery
            .take()
            .map(|r| r.state_lost)
            .unwrap_or_default();
        for server in lost.into_iter().chain([ps]) {
            self.lost_for_good.insert(server, cause.clone());
        }
        self.reshard_restore_ended(Err(cause.into()));
        while let Some(id) = self.queue.pop_front() {
            self.fail_unavailable(id, format!("parameter server ps/{ps} lost: {reason}"));
        }
    }
}
