use super::*;

fn quick() -> SimConfig {
    SimConfig {
        closures: 60,
        ..SimConfig::default()
    }
}

/// SIM-1: with no fault the job finishes and every invariant holds, end to end.
#[test]
fn a_fault_free_job_finishes_with_every_invariant_holding() {
    let report = run_scenario(&quick(), &Scenario::fault_free(1));
    assert!(report.violation.is_none(), "{:?}", report.violation);
    assert!(report.finished, "{:?}", report.failure);
    assert_eq!(report.ledger.committed, 60);
}

/// SIM-1: the same seed replays the identical event trace; another seed gives another.
#[test]
fn sim_1_a_seed_replays_the_identical_trace() {
    let config = SimConfig {
        record_trace: true,
        ..quick()
    };
    let a = run_seed(&config, 7);
    let b = run_seed(&config, 7);
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.trace, b.trace);
    assert!(a.events > 100);
    let c = run_seed(&config, 8);
    assert_ne!(a.trace_hash, c.trace_hash);
}
