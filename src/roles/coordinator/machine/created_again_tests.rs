//! A server lost before the chief's start gets the program's variables again, and the start
//! goes on with no chief restart (`created_again.rs`).

use super::control_tests::{drain, setup};
use super::recovery::{CallFault, RestoreCall};
use super::save_tests::two_shards;
use super::*;
use crate::roles::protocol::InitSpec;

/// A server's answer to a probe: holding variables (`serving`) or not, having applied nothing.
fn probe(ps: u32, incarnation: u64, serving: bool) -> ServerProbe {
    ServerProbe {
        ps,
        incarnation,
        generation: 0,
        next_free_closure_id: 0,
        serving,
        restoring: false,
    }
}

/// The shards asked to be created: (ticket, server, shard, name).
fn creates(actions: &[SchedulerAction]) -> Vec<(CreateTicket, u32, usize, String)> {
    actions
        .iter()
        .filter_map(|a| match a {
            SchedulerAction::CreateShard {
                ticket,
                ps,
                shard,
                msg,
            } => Some((*ticket, *ps, *shard, msg.name.clone())),
            _ => None,
        })
        .collect()
}

fn probed(actions: &[SchedulerAction]) -> Vec<(RestoreTicket, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            SchedulerAction::ProbeServer { ticket, ps } => Some((*ticket, *ps)),
            _ => None,
        })
        .collect()
}

fn start_finished(actions: &[SchedulerAction]) -> Option<Result<Option<u64>, StartFailure>> {
    actions.iter().find_map(|a| match a {
        SchedulerAction::RestoreFinished { result, .. } => Some(result.clone()),
        _ => None,
    })
}

fn fence_begun(actions: &[SchedulerAction]) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, SchedulerAction::Restore(RestoreCall::Begin { .. })))
}

/// A coordinator over 2 servers (incarnation 1 each, seen alive) whose program created `w`
/// (each server answered its shard) and configured the workers with it, as a chief program
/// does before its start.
fn created(t: Instant) -> Scheduler {
    let mut s = Scheduler::new(SchedulerConfig::default()).with_servers(2);
    s.handle_ps_up(t, 0, 1);
    s.handle_ps_up(t, 1, 1);
    let ticket = s
        .handle_create_variable(t, &two_shards(), vec![InitSpec::Zeros; 2])
        .unwrap();
    let asked = creates(&drain(&mut s));
    assert_eq!(asked.len(), 2);
    for (_, ps, shard, _) in asked {
        s.handle_shard_created(t, ticket, ps, shard, Ok(()));
    }
    let ended = drain(&mut s);
    assert!(
        matches!(
            ended.as_slice(),
            [SchedulerAction::VariableCreated { result: Ok(()), .. }]
        ),
        "{ended:?}"
    );
    let mut configured = setup(&[("ids", 0)]);
    configured.layouts = vec![two_shards()];
    s.handle_configure(configured);
    s
}

/// A server that restarted unnoticed between the creation and the start (its probe: a new
/// incarnation holding nothing, beside one that holds the variables) is given its shards again
/// and every server probed again: the start goes on (afresh, its fence first) with no chief
/// restart.
#[test]
fn a_server_emptied_between_the_creation_and_the_start_gets_its_shards_again() {
    let t = Instant::now();
    let mut s = created(t);
    let ticket = s.handle_start(t, None, PathBuf::from("ckpts")).unwrap();
    drain(&mut s);
    s.handle_server_probed(t, ticket, 0, Ok(probe(0, 1, true)));
    s.handle_server_probed(t, ticket, 1, Ok(probe(1, 2, false)));
    let actions = drain(&mut s);
    assert_eq!(start_finished(&actions), None, "{actions:?}");
    let again = creates(&actions);
    assert_eq!(
        again
            .iter()
            .map(|(_, ps, _, name)| (*ps, name.as_str()))
            .collect::<Vec<_>>(),
        vec![(1, "w/part_1")],
        "only ps/1's shard is created again: {actions:?}"
    );
    assert!(probed(&actions).is_empty(), "the start waits: {actions:?}");
    let (create, ps, shard, _) = again[0].clone();
    s.handle_shard_created(t, create, ps, shard, Ok(()));
    let actions = drain(&mut s);
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, SchedulerAction::VariableCreated { .. })),
        "the program hears nothing of it: {actions:?}"
    );
    let probes = probed(&actions);
    assert_eq!(probes, vec![(ticket, 0), (ticket, 1)], "{actions:?}");
    s.handle_server_probed(t, ticket, 0, Ok(probe(0, 1, true)));
    s.handle_server_probed(t, ticket, 1, Ok(probe(1, 2, true)));
    let actions = drain(&mut s);
    assert!(
        fence_begun(&actions),
        "the start afresh goes on: {actions:?}"
    );
    assert_eq!(start_finished(&actions), None);
}

/// A server lost (declared dead, back as a new process) after the program created the
/// variables and before its start: where the recovery used to fail for want of a checkpoint
/// (a chief restart), it creates the server's shards again once it is back, and a start asked
/// for meanwhile waits for it, then probes every server.
#[test]
fn a_server_lost_before_the_start_is_given_its_shards_again_and_the_start_waits() {
    let t = Instant::now();
    let mut s = created(t);
    s.handle_ps_lost(t, 1, 1);
    assert!(s.is_holding());
    assert!(creates(&drain(&mut s)).is_empty(), "not back yet");
    // The program's start comes while the server is down: held, not refused.
    let ticket = s.handle_start(t, None, PathBuf::from("ckpts")).unwrap();
    let actions = drain(&mut s);
    assert_eq!(start_finished(&actions), None, "{actions:?}");
    s.handle_server_probed(t, ticket, 0, Ok(probe(0, 1, true)));
    assert!(start_finished(&drain(&mut s)).is_none());
    // The new process comes up: its shard is created again.
    s.handle_ps_up(t, 1, 2);
    let actions = drain(&mut s);
    let again = creates(&actions);
    assert_eq!(again.len(), 1, "{actions:?}");
    assert_eq!((again[0].1, again[0].3.as_str()), (1, "w/part_1"));
    let (create, ps, shard, _) = again[0].clone();
    s.handle_shard_created(t, create, ps, shard, Ok(()));
    assert!(!s.is_holding(), "the recovery ended");
    let actions = drain(&mut s);
    let probes = probed(&actions);
    assert!(
        probes.contains(&(ticket, 0)) && probes.contains(&(ticket, 1)),
        "{actions:?}"
    );
    s.handle_server_probed(t, ticket, 0, Ok(probe(0, 1, true)));
    s.handle_server_probed(t, ticket, 1, Ok(probe(1, 2, true)));
    assert!(fence_begun(&drain(&mut s)));
    // Nothing failed: the program's first `join` raises nothing.
    assert!(s.take_error().is_none());
}

/// A server that could not be given its shards again (not back within `ps_restart_wait`)
/// fails the recovery as a loss, as before; and a server that keeps coming back empty fails
/// the start as a server lost once it was given them again `START_CREATE_AGAIN_MAX` times.
#[test]
fn creating_again_is_bounded() {
    let t = Instant::now();
    let wait = SchedulerConfig::default().ps_restart_wait_max;
    let mut s = created(t);
    s.handle_ps_lost(t, 1, 1);
    s.handle_ps_up(t, 1, 2);
    let again = creates(&drain(&mut s));
    let (create, ps, shard, _) = again[0].clone();
    let later = t + wait + Duration::from_secs(1);
    s.handle_shard_created(
        later,
        create,
        ps,
        shard,
        Err(CallFault::Unreachable("gone again".into())),
    );
    assert!(!s.is_holding());
    let error = s.take_error().expect("the loss is the program's error");
    assert!(
        error.to_string().contains("creating its variables again"),
        "{error}"
    );

    let mut s = created(t);
    let ticket = s.handle_start(t, None, PathBuf::from("ckpts")).unwrap();
    drain(&mut s);
    let mut incarnation = 1;
    let mut ended = None;
    for _ in 0..10 {
        incarnation += 1;
        s.handle_server_probed(t, ticket, 0, Ok(probe(0, 1, true)));
        s.handle_server_probed(t, ticket, 1, Ok(probe(1, incarnation, false)));
        let actions = drain(&mut s);
        if let Some(result) = start_finished(&actions) {
            ended = Some(result);
            break;
        }
        for (create, ps, shard, _) in creates(&actions) {
            s.handle_shard_created(t, create, ps, shard, Ok(()));
        }
        drain(&mut s);
    }
    match ended {
        Some(Err(StartFailure::ServerLost { ps: 1, .. })) => {}
        other => panic!("{other:?}"),
    }
}
