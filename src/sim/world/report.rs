//! What a run reports ([`SimReport`]), built from the world at its end, and the trace: every
//! event folded into a hash (FNV-1a, with no per-process seed) and, if asked, kept as a line.

use super::super::outcome::ExpectedEnd;
use super::super::Violation;
use super::{Event, World};
use crate::roles::coordinator::Ledger;

/// How a run ended, and what it saw.
#[derive(Debug, Clone)]
pub struct SimReport {
    /// The scenario's seed.
    pub seed: u64,
    /// Events processed.
    pub events: u64,
    /// Every closure committed and the job ended without an error.
    pub finished: bool,
    /// How the job ended without finishing, if it did: an expected end, its cause borne out
    /// by the scenario (any other end is a violation).
    pub failure: Option<ExpectedEnd>,
    /// The first invariant broken, if any (the run stops there).
    pub violation: Option<Violation>,
    /// A hash of every event line, in order: equal for equal traces.
    pub trace_hash: u64,
    /// Every event line, when
    /// [`SimConfig::record_trace`](super::super::SimConfig::record_trace) is set.
    pub trace: Vec<String>,
    /// The ledger at the end.
    pub ledger: Ledger,
    /// Simulated time at the end, milliseconds.
    pub sim_ms: u64,
    /// Chief incarnations that resumed the job from a checkpoint.
    pub chief_resumes: u64,
    /// Workers drained out of the job (let go by the chief, never restarted).
    pub drained: u64,
    /// Starts of workers past the cluster spec that joined the running job.
    pub workers_joined: u64,
    /// Closures workers past the cluster spec ran whole (their answers as the chief read them).
    pub ran_past_spec: u64,
    /// Parameter servers started to join the running job.
    pub ps_joined: u64,
    /// Parameter servers let go for good after their variables moved.
    pub ps_left: u64,
    /// Incarnations declared dead from their supervisor's exit report.
    pub deaths_reported: u64,
    /// Exit reports that named an incarnation the chief no longer watched (replaced, or
    /// declared dead already): nothing done.
    pub reports_ignored: u64,
    /// Incarnations declared dead because a probe of their address was refused (their process
    /// was down, its successor not started yet, and no partition in between).
    pub deaths_refused: u64,
    /// Restores that found no checkpoint at their cut that verifies (damaged after it became
    /// the cut): a recovery then rolls back to the cut before.
    pub unreadable_cuts: u64,
    /// Parameter servers killed while the program wrote a checkpoint whose cut was read and not
    /// marked yet, with no cut before it (a recovery waits for that one).
    pub ps_lost_before_first_cut: u64,
}

impl World<'_> {
    /// Folds the event into the trace hash (cheaply: every event of every schedule goes
    /// through here) and, if asked, keeps its line.
    pub(super) fn record(&mut self, event: &Event) {
        let mut hasher = Fnv(self.trace_hash);
        std::hash::Hash::hash(&self.now, &mut hasher);
        std::hash::Hash::hash(event, &mut hasher);
        self.trace_hash = hasher.0;
        if self.config.record_trace {
            self.trace
                .push(format!("{:>9.3}s {event:?}", self.now.as_secs_f64()));
        }
    }

    /// The report of a run that ended (or stopped at its first violation).
    pub(super) fn into_report(self) -> SimReport {
        let failure = match &self.ended {
            Some(Err(e)) => Some(e.clone()),
            _ => None,
        };
        SimReport {
            seed: self.scenario.seed,
            events: self.events,
            finished: matches!(self.ended, Some(Ok(()))),
            failure,
            violation: self.violation,
            trace_hash: self.trace_hash,
            trace: self.trace,
            ledger: self.coord.ledger().clone(),
            sim_ms: self.now.as_millis() as u64,
            chief_resumes: self.chief_resumes,
            // Started once at least: past the spec, a worker never started is out too.
            drained: self
                .workers
                .iter()
                .filter(|w| w.drained && w.incarnation > 0)
                .count() as u64,
            workers_joined: self.workers_joined,
            ran_past_spec: self.ran_past_spec,
            ps_joined: self.ps_joined,
            ps_left: self.ps_left,
            deaths_reported: self.deaths_reported,
            reports_ignored: self.reports_ignored,
            deaths_refused: self.deaths_refused,
            unreadable_cuts: self.unreadable_cuts,
            ps_lost_before_first_cut: self.ps_lost_before_first_cut,
        }
    }
}

/// FNV-1a: a hasher with no per-process seed, so a trace hashes the same in every run.
struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(FNV_PRIME);
        }
    }

    // Integers in one step rather than byte by byte: an event's fields are mostly integers,
    // and hashing every event is a good part of a schedule's cost.
    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0 ^ value).wrapping_mul(FNV_PRIME);
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

pub(super) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
