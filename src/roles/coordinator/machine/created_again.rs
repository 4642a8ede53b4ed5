//! A parameter server lost before the chief's start: its variables created again, so that the
//! start goes on with no chief restart.
//!
//! Before the chief's start has ended well (and before the program scheduled anything), what
//! this chief asked of the servers is only the creation of its variables: a server lost then
//! (killed, or back as a new process) holds nothing of it, and no closure of this chief has
//! trained anything. Where a recovery would otherwise fail for want of a checkpoint (and the
//! chief restart to create them again), it waits for every server to be back, creates the lost
//! servers' shards again from the requests the program's creation made (creating a shard a
//! server holds changes nothing), and ends. The start waits for such a recovery, then probes
//! every server again: what they hold decides it as before (a server that trained under an
//! earlier chief is seen there, and the start restores the checkpoint or refuses to start
//! afresh). After the start's fence (a start afresh over servers that hold variables) a loss
//! goes the old way: the new process lacks the fence, and the start fails as interrupted.
//!
//! Part of [`Scheduler`]: pure, no IO, no clock.

use super::*;

impl Scheduler {
    /// Part of `advance_recovery`: whether the recovery is one before the chief's start, which
    /// this file carries out (waiting for the servers, or creating the shards again).
    pub(super) fn advance_recovery_before_start(&mut self) -> bool {
        // With a cut (or one being written), the servers are restored from it as ever.
        if self.servers_accounted()
            || self.start.verifying()
            || self.rollback.cut().is_some()
            || self.cut_being_written().is_some()
        {
            return false;
        }
        let Some(r) = self.recovery.as_ref() else {
            return false;
        };
        if r.restoring() || r.state_lost.is_empty() {
            return false;
        }
        if r.creating_again.is_some() {
            return true;
        }
        if !self.every_server_back() {
            return true;
        }
        let Some(r) = self.recovery.as_mut() else {
            return false;
        };
        let lost = std::mem::take(&mut r.state_lost);
        let since = r.since;
        let requests = self.creates.made_on(&lost);
        if requests.is_empty() {
            // Nothing was created on them yet: nothing to give them again.
            self.recovery = None;
            return true;
        }
        let ticket = CreateTicket(self.next_ticket);
        self.next_ticket += 1;
        tracing::info!(
            "ps/{} lost before the chief's start: creating its {} variable shard(s) again",
            lost.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ps/"),
            requests.len()
        );
        let actions = self.creates.create_again(since, ticket, requests);
        self.actions.extend(actions);
        if let Some(r) = self.recovery.as_mut() {
            r.creating_again = Some(ticket);
        }
        true
    }

    /// The creation again of `ticket` ended with `result`: the recovery ends (or goes on for
    /// servers lost meanwhile); a failure fails it as a loss no checkpoint can repair.
    pub(super) fn created_again(
        &mut self,
        now: Instant,
        ticket: CreateTicket,
        result: Result<(), CreateError>,
    ) {
        let Some(r) = self
            .recovery
            .as_mut()
            .filter(|r| r.creating_again == Some(ticket))
        else {
            return;
        };
        r.creating_again = None;
        match result {
            Ok(()) => {
                if r.state_lost.is_empty() && self.ps_down().is_empty() {
                    self.recovery = None;
                }
            }
            Err(e) => {
                let ps = match &e {
                    CreateError::Server { ps, .. } => *ps,
                    _ => self.recovering_ps().unwrap_or(0),
                };
                self.fail_recovery(
                    ps,
                    PsLossCause::RestoreFailed {
                        reason: format!(
                            "creating its variables again before the chief's start failed: {e}"
                        ),
                    },
                );
            }
        }
        self.dispatch(now);
    }

    /// Part of `dispatch`: a start held for a recovery before it probes every server again
    /// once that recovery ended (what they held before may be gone, or created again since),
    /// and the shards kept for a server lost before the start are forgotten once the servers
    /// are accounted for.
    pub(super) fn resume_start_after_recovery(&mut self) {
        if self.servers_accounted() {
            self.creates.forget_made();
        }
        if self.recovery.is_some() {
            return;
        }
        let servers = self.server_set.indexes().clone();
        if let Some(ticket) = self.start.probe_again_if_held(&servers) {
            for ps in servers {
                self.actions
                    .push_back(SchedulerAction::ProbeServer { ticket, ps });
            }
        }
    }
}
