//! How a simulated job may end without finishing: the documented list of expected ends, each
//! a fault beyond repair with its cause, and the check of that cause against the scenario.
//!
//! A job that ends with an error the coordinator or the chief's program raised is classified
//! here: an error of a kind in [`ExpectedEnd`] whose cause the scenario bears out (a server
//! named as lost was hit by a fault; no checkpoint to resume from while storage faults or an
//! early chief loss explain why) is an expected end; any other error, or an expected kind
//! whose cause the scenario does not bear out, is a violation (`END`). So a bug that makes a
//! job fail cannot hide among the jobs that fail for good reasons.

use std::fmt;

use super::{Fault, Node, Scenario, StorageFault};
use crate::roles::coordinator::{
    CheckpointBuildError, ClosureFailure, CreateError, CutReadError, PsLossCause, StartFailure,
};

/// Why a simulated job may end without finishing (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpectedEnd {
    /// Server `ps` lost its variables while no checkpoint had become the cut (none saved
    /// yet, or the first one's write or read-back failed, or it was not marked in time):
    /// nothing could restore it. Its cause: `ps` was hit by a fault (killed, preempted, or
    /// paused or cut off past the detection budget, after which its process is refused and
    /// restarts).
    ServerLostBeforeFirstCut { ps: u32 },
    /// Server `ps` was not back and restored within `ps_restart_wait`. Its cause: `ps` was
    /// hit by a fault.
    ServerNotBack { ps: u32 },
    /// Restoring a lost server `ps` from the cut failed: the cut's checkpoint (and any
    /// fallback) could not be read whole. Its cause: storage faults in the scenario.
    RestoreFailed { ps: u32 },
    /// Restoring a lost server `ps` was interrupted again and again by further losses. Its
    /// cause: servers were hit by faults.
    RestoreInterrupted { ps: u32 },
    /// A new chief found no checkpoint that verifies, while the servers had trained: it
    /// cannot resume, and must not start afresh. Its cause: the chief was lost (killed,
    /// preempted, paused or cut off, or crashed in a save), no stored checkpoint verified at
    /// its start, and a server had applied a closure, taken a watermark above closure 0 or begun
    /// a restore of a checkpoint's shards (a start afresh cut short does none of these, and the
    /// next chief starts afresh).
    ChiefWithoutCheckpoint,
    /// A new chief's start could not restore the servers: server `ps` was lost or did not
    /// answer at every attempt. Its cause: the chief was lost, and `ps` was hit by a fault.
    ChiefStartInterrupted { ps: u32 },
    /// A save could not read the servers undisturbed (no recovery, no new work in between)
    /// within its wait, and the program's `save_checkpoint` raised. Its cause: a server was
    /// hit by a fault.
    SaveNotRead,
}

/// How a simulated job ended that no expected end accounts for: a violation (`END`).
#[derive(Debug, thiserror::Error)]
pub enum UnexpectedEnd {
    /// An expected kind of end, but no fault of the scenario explains it.
    #[error("the job ended with \"{0}\", but no fault of the scenario explains it")]
    Unexplained(ExpectedEnd),
    /// The coordinator failed the job with an error no expected end is.
    #[error("{0}")]
    Closure(ClosureFailure),
    /// Reading a cut for a save failed for a reason no expected end is.
    #[error("reading a cut: {0}")]
    CutRead(CutReadError),
    /// The chief's start failed for a reason no expected end is.
    #[error("the chief's start failed: {0}")]
    Start(StartFailure),
    /// The chief program's creation of its variables failed for a reason no expected end is.
    #[error("creating the variables: {0}")]
    Create(CreateError),
    /// A cut read whole did not make a checkpoint.
    #[error("the cut read does not make a checkpoint: {0}")]
    Checkpoint(CheckpointBuildError),
}

impl ExpectedEnd {
    /// A short name of its kind, as summaries count them.
    pub fn kind(&self) -> &'static str {
        match self {
            ExpectedEnd::ServerLostBeforeFirstCut { .. } => "server lost before the first cut",
            ExpectedEnd::ServerNotBack { .. } => "server not back in time",
            ExpectedEnd::RestoreFailed { .. } => "restore failed (damaged checkpoints)",
            ExpectedEnd::RestoreInterrupted { .. } => "restore interrupted by more losses",
            ExpectedEnd::ChiefWithoutCheckpoint => "chief restarted with no checkpoint",
            ExpectedEnd::ChiefStartInterrupted { .. } => "chief's start interrupted",
            ExpectedEnd::SaveNotRead => "save could not read the servers",
        }
    }

    /// Whether `scenario` bears out this end's cause: `Err` says what is missing.
    /// `servers_trained`: whether a server ever applied a closure, took a watermark above
    /// closure 0 or began a restore of a checkpoint's shards (the harness's record): a chief
    /// without a checkpoint over servers that never did may start afresh, and failing to is no
    /// expected end.
    pub(super) fn cause_holds(
        &self,
        scenario: &Scenario,
        servers_trained: bool,
    ) -> Result<(), UnexpectedEnd> {
        let hit = |node: Node| scenario.faults.iter().any(|f| hits(f, node));
        let any_server_hit = scenario.faults.iter().any(|f| {
            matches!(fault_node(f), Some(Node::Ps(_)))
                || matches!(f, Fault::PsJoin { .. } | Fault::PsLeave { .. })
        });
        let storage_faulted = scenario
            .faults
            .iter()
            .any(|f| matches!(f, Fault::Storage { .. }));
        let chief_lost = hit(Node::Chief)
            || scenario.faults.iter().any(|f| {
                matches!(
                    f,
                    Fault::Storage {
                        fault: StorageFault::CrashBeforePublish | StorageFault::CrashAfterPublish,
                        ..
                    }
                )
            });
        let ok = match self {
            ExpectedEnd::ServerLostBeforeFirstCut { ps }
            | ExpectedEnd::ServerNotBack { ps }
            | ExpectedEnd::RestoreInterrupted { ps } => hit(Node::Ps(*ps)),
            ExpectedEnd::RestoreFailed { .. } => storage_faulted,
            ExpectedEnd::ChiefWithoutCheckpoint => chief_lost && servers_trained,
            ExpectedEnd::ChiefStartInterrupted { ps } => chief_lost && hit(Node::Ps(*ps)),
            ExpectedEnd::SaveNotRead => any_server_hit,
        };
        if ok {
            Ok(())
        } else {
            Err(UnexpectedEnd::Unexplained(self.clone()))
        }
    }
}

impl fmt::Display for ExpectedEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExpectedEnd::ServerLostBeforeFirstCut { ps } => write!(
                f,
                "ps/{ps} lost its variables before any checkpoint became the cut"
            ),
            ExpectedEnd::ServerNotBack { ps } => {
                write!(
                    f,
                    "ps/{ps} was not back and restored within ps_restart_wait"
                )
            }
            ExpectedEnd::RestoreFailed { ps } => write!(
                f,
                "restoring ps/{ps} failed: no checkpoint at the cut (or before it) reads back whole"
            ),
            ExpectedEnd::RestoreInterrupted { ps } => {
                write!(
                    f,
                    "restoring ps/{ps} was interrupted by further losses too often"
                )
            }
            ExpectedEnd::ChiefWithoutCheckpoint => f.write_str(
                "a new chief found no checkpoint that verifies over servers that trained",
            ),
            ExpectedEnd::ChiefStartInterrupted { ps } => {
                write!(f, "a new chief's start lost ps/{ps} at every attempt")
            }
            ExpectedEnd::SaveNotRead => {
                f.write_str("a save could not read the servers undisturbed in time")
            }
        }
    }
}

/// The expected end a job failure of the coordinator's is, or why it is none.
pub(super) fn of_closure_failure(failure: &ClosureFailure) -> Result<ExpectedEnd, UnexpectedEnd> {
    match failure {
        ClosureFailure::PsLost { ps, cause } => {
            let ps = *ps;
            match cause {
                PsLossCause::NoCheckpoint
                | PsLossCause::FirstCheckpointNeverCut { .. }
                | PsLossCause::FirstCheckpointNotMarked { .. } => {
                    Ok(ExpectedEnd::ServerLostBeforeFirstCut { ps })
                }
                PsLossCause::NotBack { .. } => Ok(ExpectedEnd::ServerNotBack { ps }),
                PsLossCause::RestoreFailed { .. } => Ok(ExpectedEnd::RestoreFailed { ps }),
                PsLossCause::RestoreInterrupted { .. } => {
                    Ok(ExpectedEnd::RestoreInterrupted { ps })
                }
                // The simulated job keeps far fewer closures than the bound.
                PsLossCause::RetentionOverflow { .. }
                | PsLossCause::RetentionBytesOverflow { .. } => {
                    Err(UnexpectedEnd::Closure(failure.clone()))
                }
            }
        }
        other => Err(UnexpectedEnd::Closure(other.clone())),
    }
}

/// The expected end a failed read of a cut for a save is, or why it is none.
pub(super) fn of_cut_read(error: &CutReadError) -> Result<ExpectedEnd, UnexpectedEnd> {
    match error {
        CutReadError::JobFailed { error } => of_closure_failure(error),
        CutReadError::NotUndisturbed { .. } => Ok(ExpectedEnd::SaveNotRead),
        other => Err(UnexpectedEnd::CutRead(other.clone())),
    }
}

/// The expected end a chief's start that failed at every attempt is, or why it is none;
/// `checkpoint_given`: whether the start was given a checkpoint that verifies.
pub(super) fn of_start_failure(
    failure: &StartFailure,
    checkpoint_given: bool,
) -> Result<ExpectedEnd, UnexpectedEnd> {
    match failure {
        StartFailure::TrainedWithoutCheckpoint { .. } if !checkpoint_given => {
            Ok(ExpectedEnd::ChiefWithoutCheckpoint)
        }
        StartFailure::ServerLost { ps, .. } | StartFailure::ServerMissing { ps } => {
            Ok(ExpectedEnd::ChiefStartInterrupted { ps: *ps })
        }
        other => Err(UnexpectedEnd::Start(other.clone())),
    }
}

/// How the chief program's creation of a variable ended the job: a server not reachable
/// within `ps_restart_wait` is one not back in time (the real program's `create_variable`
/// raises, and the chief exits); any other failure is a violation.
pub(super) fn of_create_failure(failure: &CreateError) -> Result<ExpectedEnd, UnexpectedEnd> {
    match failure {
        CreateError::Server { ps, .. } => Ok(ExpectedEnd::ServerNotBack { ps: *ps }),
        other => Err(UnexpectedEnd::Create(other.clone())),
    }
}

/// Whether `fault` strikes `node` (a kill, pause, cut or preemption of it).
fn hits(fault: &Fault, node: Node) -> bool {
    fault_node(fault) == Some(node)
}

/// The node a kill, pause, partition or preemption strikes.
fn fault_node(fault: &Fault) -> Option<Node> {
    match fault {
        Fault::Kill { node, .. }
        | Fault::Pause { node, .. }
        | Fault::Partition { node, .. }
        | Fault::Preempt { node, .. } => Some(*node),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An end is expected only where the scenario's faults explain it: the same end on a
    /// fault-free run, or naming a server no fault touched, is a violation.
    #[test]
    fn an_end_is_expected_only_where_a_fault_of_the_scenario_explains_it() {
        let quiet = Scenario::fault_free(1);
        let server_killed = Scenario {
            faults: vec![Fault::Kill {
                at_ms: 10,
                node: Node::Ps(1),
            }],
            ..Scenario::fault_free(1)
        };
        let chief_crashed_in_a_save = Scenario {
            faults: vec![Fault::Storage {
                save: 0,
                fault: StorageFault::CrashBeforePublish,
            }],
            ..Scenario::fault_free(1)
        };
        for end in [
            ExpectedEnd::ServerNotBack { ps: 1 },
            ExpectedEnd::ServerLostBeforeFirstCut { ps: 1 },
            ExpectedEnd::ChiefWithoutCheckpoint,
            ExpectedEnd::RestoreFailed { ps: 1 },
            ExpectedEnd::SaveNotRead,
        ] {
            let err = end.cause_holds(&quiet, true).unwrap_err();
            assert!(err.to_string().contains(&end.to_string()), "{err}");
        }
        assert!(ExpectedEnd::ServerNotBack { ps: 1 }
            .cause_holds(&server_killed, true)
            .is_ok());
        assert!(ExpectedEnd::ServerNotBack { ps: 0 }
            .cause_holds(&server_killed, true)
            .is_err());
        assert!(ExpectedEnd::ChiefWithoutCheckpoint
            .cause_holds(&chief_crashed_in_a_save, true)
            .is_ok());
        // A chief lost before any server trained may start afresh: failing to is no end
        // its loss explains.
        assert!(ExpectedEnd::ChiefWithoutCheckpoint
            .cause_holds(&chief_crashed_in_a_save, false)
            .is_err());
        assert!(ExpectedEnd::RestoreFailed { ps: 0 }
            .cause_holds(&chief_crashed_in_a_save, true)
            .is_ok());
    }

    /// The coordinator's typed errors map onto the expected ends; an error with no expected
    /// end (here a retention overflow, which the simulated job never reaches) is none.
    #[test]
    fn typed_errors_map_onto_expected_ends_and_others_are_violations() {
        let lost = |cause| ClosureFailure::PsLost { ps: 2, cause };
        assert_eq!(
            of_closure_failure(&lost(PsLossCause::NoCheckpoint)).ok(),
            Some(ExpectedEnd::ServerLostBeforeFirstCut { ps: 2 })
        );
        assert_eq!(
            of_closure_failure(&lost(PsLossCause::NotBack {
                wait: std::time::Duration::from_secs(60)
            }))
            .ok(),
            Some(ExpectedEnd::ServerNotBack { ps: 2 })
        );
        assert!(
            of_closure_failure(&lost(PsLossCause::RetentionOverflow { retained_max: 10 })).is_err()
        );
        let trained = StartFailure::TrainedWithoutCheckpoint {
            root: "ckpt".into(),
            ps: 0,
            next_free_closure_id: 5,
            generation: 0,
        };
        assert_eq!(
            of_start_failure(&trained, false).ok(),
            Some(ExpectedEnd::ChiefWithoutCheckpoint)
        );
        // Refused although the start was given a checkpoint that verifies: a bug.
        assert!(of_start_failure(&trained, true).is_err());
    }
}
