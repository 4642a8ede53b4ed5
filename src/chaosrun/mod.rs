//! `cohort chaos run`: a seeded fault plan ([`plan`]) applied to a real local job started by
//! its launch command ([`run`]), then the job's invariants checked and a report written.
//!
//! This module owns the checks and the report: the exit code the plan expects; every fault
//! carried out; every closure committed once, from the newest checkpoint's ledger and from
//! the ledger line the chief prints at the end (committed == scheduled, nothing pending or
//! failed; a closure committed twice would make committed exceed scheduled); the parameter
//! servers' applied pushes consistent with the committed closures ([`servers_check`]: each
//! committed closure's push applied at most once on each server, duplicates refused rather
//! than applied); no panic in any task's output. A MultiWorkerMirrored job (its chief says
//! so as it starts) has no closures and no servers: for it those two are skipped, and its
//! own are checked instead: every member ends with one model ([`one_model_check`]: each
//! task's `final model: step S, digest D` line the same, from as many tasks as the last
//! group generation has workers), and the chief's group generations only go forward
//! ([`membership_check`]). `report.txt` and `report.json` (the plan, the timeline of faults
//! and the chief's step rate, each check with its detail, the verdict) and `timeline.png`
//! (the step rate with each fault marked where it hit) go to the output directory, beside
//! `job.log`.

pub mod disk;
pub mod plan;
pub mod run;

use crate::process::stdout::outln;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::checkpoint::{list_checkpoints, read_manifest};
use plan::Plan;
use run::{Observed, RunSetup};

/// One invariant's outcome.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    /// Its name.
    pub name: &'static str,
    /// `passed`, `failed`, or `skipped` (nothing to check it against).
    pub status: &'static str,
    /// What was found.
    pub detail: String,
}

impl Check {
    fn new(name: &'static str, ok: bool, detail: String) -> Self {
        Self {
            name,
            status: if ok { "passed" } else { "failed" },
            detail,
        }
    }

    fn skipped(name: &'static str, detail: String) -> Self {
        Self {
            name,
            status: "skipped",
            detail,
        }
    }

    /// A check whose figures the job never reported (`detail` says which): failed where the plan
    /// expects the job to succeed, skipped where it expects it to fail.
    fn nothing_reported(name: &'static str, detail: &str, plan: &Plan) -> Self {
        if plan.expect_exit == 0 {
            Self::new(name, false, detail.into())
        } else {
            Self::skipped(name, format!("{detail} (the plan expects the job to fail)"))
        }
    }
}

/// A MultiWorkerMirrored job's members end with one model (DATA-1): every task that reported
/// its final model reported the same step and digest, and as many did as the last generation
/// of the group has workers (none missing, none extra). Skipped where the plan expects the job to
/// fail and no task finished.
pub fn one_model_check(plan: &Plan, group: &run::ReportedGroup) -> Check {
    const NAME: &str = "one model";
    if group.models.is_empty() {
        return Check::nothing_reported(NAME, "no task reported its final model", plan);
    }
    let each: Vec<String> = group
        .models
        .iter()
        .map(|(task, m)| format!("{task}: step {}, digest {}", m.step, m.digest))
        .collect();
    let first = group.models.values().next().expect("not empty");
    if group.models.values().any(|m| m != first) {
        return Check::new(
            NAME,
            false,
            format!(
                "the members ended with different models: {}",
                each.join("; ")
            ),
        );
    }
    let finished = group.models.len() as u64;
    if let Some(last) = group.generations.last() {
        if last.workers != finished {
            return Check::new(
                NAME,
                false,
                format!(
                    "the last group generation ({}) has {} workers, but {finished} reported a \
                     final model: {}",
                    last.generation,
                    last.workers,
                    each.join("; ")
                ),
            );
        }
    }
    Check::new(
        NAME,
        true,
        format!(
            "{finished} worker(s) ended at step {} with one model (digest {})",
            first.step, first.digest
        ),
    )
}

/// The chief's group generations only go forward: each later than the one before, trained
/// from a step no earlier (a re-forming goes on from the last completed step, a joiner is
/// admitted at a step boundary).
pub fn membership_check(plan: &Plan, group: &run::ReportedGroup) -> Check {
    const NAME: &str = "group generations";
    if group.generations.is_empty() {
        // The chief reports them as it ends: one away at the end (preempted, the workers
        // finishing without it) has none to print.
        let chief_finished = group.models.keys().any(|task| task.starts_with("chief/"));
        if !group.models.is_empty() && !chief_finished {
            return Check::skipped(
                NAME,
                format!(
                    "the chief did not finish (the job ended with {} worker(s) finishing \
                     without it), so it reported no group generations",
                    group.models.len()
                ),
            );
        }
        return Check::nothing_reported(NAME, "the chief reported no group generations", plan);
    }
    let listed: Vec<String> = group
        .generations
        .iter()
        .map(|e| {
            format!(
                "{} ({} workers from step {})",
                e.generation, e.workers, e.from_step
            )
        })
        .collect();
    let backwards = group
        .generations
        .windows(2)
        .find(|w| w[1].generation <= w[0].generation || w[1].from_step < w[0].from_step || w[1].workers == 0);
    let detail = format!("generations {}", listed.join(", "));
    match backwards {
        Some(w) => Check::new(
            NAME,
            false,
            format!(
                "generation {} follows generation {} without going forward: {detail}",
                w[1].generation, w[0].generation
            ),
        ),
        None => Check::new(NAME, true, detail),
    }
}

/// Checks the job's invariants against what the run observed.
pub fn check(plan: &Plan, setup: &RunSetup, observed: &Observed) -> Vec<Check> {
    let mut checks = Vec::new();
    checks.push(match (observed.exit_code, &observed.ended_by_runner) {
        (_, Some(why)) => Check::new(
            "exit code",
            false,
            format!("{why}; expected exit {}", plan.expect_exit),
        ),
        (Some(code), None) => Check::new(
            "exit code",
            code == plan.expect_exit,
            format!("the job exited {code}, expected {}", plan.expect_exit),
        ),
        (None, None) => Check::new("exit code", false, "the job's exit is unknown".into()),
    });
    let missed: Vec<String> = observed
        .faults
        .iter()
        .filter(|f| !f.applied)
        .map(|f| {
            format!(
                "{} {} at {:.1}s: {}",
                f.kind, f.target, f.planned_s, f.detail
            )
        })
        .collect();
    checks.push(Check::new(
        "faults applied",
        missed.is_empty(),
        if missed.is_empty() {
            format!("all {} fault(s) carried out", observed.faults.len())
        } else {
            missed.join("; ")
        },
    ));
    let group = &observed.summary.group;
    if group.is_collective() {
        // Synchronous training has no closures and no servers: its invariant is one model.
        let none = "a MultiWorkerMirrored job runs no closures and no parameter servers";
        checks.push(Check::skipped("every closure committed once", none.into()));
        checks.push(Check::skipped("ps applied counts", none.into()));
        checks.push(one_model_check(plan, group));
        checks.push(membership_check(plan, group));
    } else {
        checks.push(ledger_check(setup.checkpoint_dir.as_deref(), observed));
        let counts = setup
            .checkpoint_dir
            .as_deref()
            .and_then(|root| list_checkpoints(root).ok()?.last().cloned())
            .and_then(|newest| {
                let manifest = read_manifest(&newest.dir).ok()?;
                Some(ShardCounts::of(&newest.dir, &manifest))
            });
        // Servers a fault hit (killed, terminated, or paused or cut off past the detection
        // budget, then fenced and restarted): a restarted one counts anew.
        let restarted: Vec<u32> = observed
            .faults
            .iter()
            .filter(|f| f.applied)
            .filter_map(|f| f.task.as_deref()?.strip_prefix("ps/")?.parse().ok())
            .collect();
        checks.push(servers_check(
            &observed.summary,
            counts.as_ref(),
            &restarted,
        ));
    }
    if !observed.summary.unreadable.is_empty() {
        checks.push(Check::new(
            "run reports",
            false,
            format!(
                "report(s) the runner could not read: {}",
                observed.summary.unreadable.join("; ")
            ),
        ));
    }
    checks.push(Check::new(
        "no panic",
        observed.panic_count == 0,
        if observed.panic_count == 0 {
            "no task's output says it panicked".into()
        } else {
            format!(
                "{} panic line(s): {}",
                observed.panic_count,
                observed.panics.join(" | ")
            )
        },
    ));
    checks
}

/// Every closure committed once: the newest checkpoint's ledger and the chief's reported one.
fn ledger_check(checkpoint_dir: Option<&Path>, observed: &Observed) -> Check {
    let mut found = Vec::new();
    let mut ok = true;
    match checkpoint_dir {
        None => found.push("checkpoint: the job's checkpoint directory is not known".into()),
        Some(root) => {
            match list_checkpoints(root).map(|e| e.last().cloned()) {
                Err(e) => {
                    ok = false;
                    found.push(format!("checkpoint: {e}"));
                }
                Ok(None) => {
                    ok = false;
                    found.push(format!("checkpoint: none under {}", root.display()));
                }
                Ok(Some(newest)) => match read_manifest(&newest.dir) {
                    Err(e) => {
                        ok = false;
                        found.push(format!("checkpoint: {e}"));
                    }
                    Ok(manifest) => {
                        // The ids the chief still kept (it forgets old ones, and a chief
                        // that restarted keeps only its own): never more than the count.
                        let ids = manifest.ledger.committed_ids.len() as u64;
                        let seen = observed.samples.last().map_or(0, |s| s.scheduled as u64);
                        let verdict = checkpoint_ledger_verdict(
                            &manifest.ledger.counts,
                            ids,
                            seen,
                            observed.summary.ledger,
                        );
                        ok &= verdict.good;
                        found.extend(verdict.note);
                        let l = &manifest.ledger.counts;
                        found.push(format!(
                            "newest checkpoint {} (step {}): {} scheduled, {} committed ({} \
                             closure ids kept), {} pending, {} failed, {} cancelled, {} \
                             unavailable{}",
                            newest.dir.display(),
                            newest.step,
                            l.scheduled,
                            l.committed,
                            ids,
                            l.pending,
                            l.failed,
                            l.cancelled,
                            l.unavailable,
                            if verdict.good {
                                ""
                            } else {
                                " (not every closure committed once)"
                            }
                        ));
                    }
                },
            }
        }
    }
    match observed.summary.ledger {
        None => found.push("report: the chief reported no ledger".into()),
        Some(l) => {
            let good = l.committed == l.scheduled && l.pending == 0 && l.failed == 0;
            ok &= good;
            found.push(format!(
                "chief's report: {} scheduled, {} committed, {} pending, {} failed{}",
                l.scheduled,
                l.committed,
                l.pending,
                l.failed,
                if good {
                    ""
                } else {
                    " (not every closure committed once)"
                }
            ));
        }
    }
    // With no source at all, nothing says the closures committed.
    if checkpoint_dir.is_none() && observed.summary.ledger.is_none() {
        ok = false;
    }
    Check::new("every closure committed once", ok, found.join("; "))
}

/// What the newest checkpoint's ledger says of the closures ([`checkpoint_ledger_verdict`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct LedgerVerdict {
    /// Every closure it holds committed once, and none scheduled that nothing accounts for.
    good: bool,
    /// Closures scheduled after it, and what accounts for them.
    note: Option<String>,
}

/// Whether the newest checkpoint's ledger `l` (with `ids` committed ids kept) shows every
/// closure committed once: balanced, every scheduled closure committed, none pending, failed,
/// cancelled or unavailable. The closures the chief's metrics last showed scheduled (`seen`)
/// beyond the checkpoint's were scheduled after it (a program that saves before its last steps,
/// as TensorFlow's tutorial schedules its final step): the chief's report at the end
/// (`reported`) accounts for them where it holds them all; without it, nothing says they
/// committed.
fn checkpoint_ledger_verdict(
    l: &crate::ledger::Ledger,
    ids: u64,
    seen: u64,
    reported: Option<crate::run_report::LedgerCounts>,
) -> LedgerVerdict {
    let held = l.balances()
        && l.committed == l.scheduled
        && ids <= l.committed
        && l.pending == 0
        && l.failed + l.cancelled + l.unavailable == 0;
    if seen <= l.scheduled {
        return LedgerVerdict { good: held, note: None };
    }
    let after = seen - l.scheduled;
    match reported.filter(|r| r.scheduled >= seen) {
        Some(_) => LedgerVerdict {
            good: held,
            note: Some(format!(
                "the chief scheduled {after} closure(s) after the newest checkpoint (its \
                 metrics last showed {seen}); its report at the end holds them"
            )),
        },
        None => LedgerVerdict {
            good: false,
            note: Some(format!(
                "the chief's metrics last showed {seen} closures scheduled, more than the newest \
                 checkpoint holds, and no report of the chief's at the end accounts for them"
            )),
        },
    }
}

/// What the parameter-server check reads from the newest checkpoint: the closures its ledger
/// holds committed, and each variable shard's update count (the manifest's `steps/<shard>`,
/// restored with the values after a server is lost, so it counts the pushes in effect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardCounts {
    /// The checkpoint's directory.
    pub source: String,
    /// Closures committed at its cut.
    pub committed: u64,
    /// `(shard, updates applied)`, by shard name.
    pub shards: Vec<(String, u64)>,
}

impl ShardCounts {
    /// The counts of the checkpoint in `dir` whose manifest is `manifest`.
    pub fn of(dir: &Path, manifest: &crate::checkpoint::Manifest) -> Self {
        let shards = manifest
            .extra
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(key, v)| {
                let part = key.strip_prefix(crate::checkpoint::UPDATE_COUNT_PREFIX)?;
                Some((part.to_string(), v.as_u64()?))
            })
            .collect();
        Self {
            source: dir.display().to_string(),
            committed: manifest.ledger.counts.committed,
            shards,
        }
    }
}

/// The parameter servers' applied pushes against the committed closures (PS-1: a closure's
/// update is applied at most once on each server; a retry of it is refused as a duplicate):
///
/// - from the chief's report, each server applied pushes when closures committed, and, in a
///   run with no parameter-server restore, at most one per committed closure (applied ≤
///   committed; equal when every closure pushes to every server, as in the demo). A push
///   applied twice makes a server's count exceed the closures. After a restore, the
///   rolled-back closures apply once more, so the summary's counts are not bounded by the
///   committed ones and the checkpoint's are checked instead. A server in `restarted` (a
///   fault of the plan hit it, which may have restarted it) may have applied nothing: the
///   summary counts its latest process only, which may have started after the last closure;
/// - from the newest checkpoint, no variable shard was updated more often than the closures
///   committed at its cut (a push applied twice there counts twice).
pub fn servers_check(
    summary: &run::ReportedSummary,
    counts: Option<&ShardCounts>,
    restarted: &[u32],
) -> Check {
    const NAME: &str = "ps applied counts";
    let servers = &summary.servers;
    if servers.is_empty() && counts.is_none_or(|c| c.shards.is_empty()) {
        return Check::skipped(
            NAME,
            "the chief reported no per-server counts and no checkpoint holds update counts".into(),
        );
    }
    let committed = summary.ledger.map(|l| l.committed);
    // A chief that resumed from its checkpoint restored the servers there too.
    let restores = summary.ps_restores.unwrap_or(0) + u64::from(summary.resumed);
    let mut problems = Vec::new();
    let mut found = Vec::new();
    if !servers.is_empty() {
        let Some(committed) = committed else {
            return Check::new(
                NAME,
                false,
                "the chief reported per-server counts but no ledger to check them against"
                    .into(),
            );
        };
        if committed == 0 {
            problems.push("no closure committed".to_string());
        }
        for s in servers {
            let relation = match s.applied.cmp(&committed) {
                std::cmp::Ordering::Equal => " (one per committed closure)",
                std::cmp::Ordering::Less => "",
                std::cmp::Ordering::Greater if restores > 0 => " (closures rolled back ran again)",
                std::cmp::Ordering::Greater => " (more than the committed closures)",
            };
            found.push(format!(
                "ps/{}: {} applied{relation}, {} duplicates refused",
                s.ps, s.applied, s.duplicates
            ));
            if s.applied == 0 && committed > 0 && !restarted.contains(&s.ps) {
                problems.push(format!(
                    "ps/{} applied nothing while closures committed",
                    s.ps
                ));
            }
            if s.applied > committed && restores == 0 {
                problems.push(format!(
                    "ps/{} applied {} pushes for {committed} committed closures with no \
                     restore: some closure's push was applied more than once (PS-1)",
                    s.ps, s.applied
                ));
            }
        }
        found.insert(
            0,
            format!(
                "{committed} closures committed{}",
                if restores > 0 {
                    format!(", {restores} parameter-server restore(s)")
                } else {
                    String::new()
                }
            ),
        );
    }
    if let Some(c) = counts.filter(|c| !c.shards.is_empty()) {
        let over: Vec<String> = c
            .shards
            .iter()
            .filter(|(_, n)| *n > c.committed)
            .map(|(shard, n)| format!("{shard} updated {n} times"))
            .collect();
        let most = c.shards.iter().map(|(_, n)| *n).max().unwrap_or(0);
        found.push(format!(
            "newest checkpoint {}: {} shards, at most {most} updates each, {} closures \
             committed at its cut",
            c.source,
            c.shards.len(),
            c.committed
        ));
        if !over.is_empty() {
            problems.push(format!(
                "in {}: {} for {} committed closures: a push was applied more than once (PS-1)",
                c.source,
                over.join(", "),
                c.committed
            ));
        }
    }
    let ok = problems.is_empty();
    let mut detail = found.join("; ");
    if !ok {
        detail.push_str("; VIOLATION: ");
        detail.push_str(&problems.join("; "));
    }
    Check::new(NAME, ok, detail)
}

/// Writes `report.txt` and `report.json` into `setup.out_dir`; returns whether every check
/// passed (skipped ones aside).
///
/// Longer than most functions here on purpose: every field of the run report, in the text and
/// in the JSON alike, side by side so that they stay the same.
pub fn write_report(
    plan: &Plan,
    setup: &RunSetup,
    observed: &Observed,
    checks: &[Check],
) -> Result<bool, ReportError> {
    let passed = checks.iter().all(|c| c.status != "failed");
    let verdict = if passed { "passed" } else { "violation" };
    let faults: Vec<_> = plan
        .faults
        .iter()
        .map(|f| {
            json!({
                "kind": f.kind.as_str(),
                "target": f.target.map(|t| t.to_string()),
                "at": f.at.to_string(),
                "after": f.after.to_string(),
                "peer": f.peer.map(|t| t.to_string()),
                "probability": f.probability,
                "for": f.lasts.map(crate::cluster::format_duration),
                "which": match f.which { plan::Which::All => "all", plan::Which::Newest => "newest" },
                "scale": f.scale.map(|s| s.to_string()),
            })
        })
        .collect();
    let doc = json!({
        "plan": {
            "file": plan.source.display().to_string(),
            "seed": plan.seed,
            "expect_exit": plan.expect_exit,
            "faults": faults,
        },
        "command": setup.command,
        "run_dir": setup.run_dir.display().to_string(),
        "checkpoint_dir": setup.checkpoint_dir.as_ref().map(|d| d.display().to_string()),
        "exit_code": observed.exit_code,
        "ended_by_runner": observed.ended_by_runner,
        "duration_s": observed.duration_s,
        "timeline": {
            "faults": observed.faults,
            "samples": observed.samples,
        },
        "summary": observed.summary,
        "checks": checks,
        "verdict": verdict,
    });
    let mut text = format!(
        "chaos run: plan {} (seed {})\ncommand: {}\njob: {}, {:.1}s\n\ntimeline:\n",
        plan.source.display(),
        plan.seed,
        setup.command.join(" "),
        match (observed.exit_code, &observed.ended_by_runner) {
            (_, Some(why)) => why.clone(),
            (Some(code), None) => format!("exit {code}"),
            (None, None) => "exit unknown".into(),
        },
        observed.duration_s
    );
    for f in &observed.faults {
        text.push_str(&format!(
            "  {:7.2}s  {} {}: {}\n",
            f.t_s,
            f.kind,
            f.task.as_deref().unwrap_or(&f.target),
            f.detail
        ));
    }
    // A parameter-server chief counts committed closures; a MultiWorkerMirrored one, steps.
    let (unit, step_time) = if observed.summary.group.is_collective() {
        ("steps/s", "one step boundary to the next")
    } else {
        ("closures/s", "dispatch to commit")
    };
    if let Some(peak) = observed
        .samples
        .iter()
        .map(|s| s.steps_per_second)
        .reduce(f64::max)
    {
        text.push_str(&format!(
            "  step rate: {} samples of the chief's metrics, peak {peak:.1} {unit}\n",
            observed.samples.len()
        ));
        let times: Vec<f64> = observed
            .samples
            .iter()
            .filter_map(|s| s.step_seconds)
            .collect();
        if let Some(slowest) = times.iter().copied().reduce(f64::max) {
            let mean = times.iter().sum::<f64>() / times.len() as f64;
            text.push_str(&format!(
                "  step time ({step_time}): mean of the samples {:.1} ms, slowest sample \
                 {:.1} ms\n",
                mean * 1e3,
                slowest * 1e3
            ));
        }
    } else {
        text.push_str("  step rate: the chief's metrics were never read\n");
    }
    text.push_str("\nchecks:\n");
    for c in checks {
        text.push_str(&format!("  [{}] {}: {}\n", c.status, c.name, c.detail));
    }
    text.push_str(&format!("\nverdict: {verdict}\n"));
    let write = |name: &str, bytes: &[u8]| {
        let path = setup.out_dir.join(name);
        match std::fs::write(&path, bytes) {
            Ok(()) => Ok(()),
            Err(source) => Err(ReportError::Write { path, source }),
        }
    };
    write("report.txt", text.as_bytes())?;
    let json_text = serde_json::to_vec_pretty(&doc)?;
    write("report.json", &json_text)?;
    // The timeline as a picture: the step rate, each fault a vertical line where it hit. A
    // drawing that fails loses nothing of the report: it is said, and the run goes on.
    let timeline = timeline_chart(plan, observed);
    let png = setup.out_dir.join("timeline.png");
    if let Err(e) = crate::plot::write_png(&timeline, &png, 1200, 500) {
        tracing::warn!("no timeline picture: {e}");
    }
    outln!("\n{}", text.trim_end_matches('\n'));
    Ok(passed)
}

/// Why the report was not written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A report file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// The JSON report could not be encoded.
    #[error("cannot encode report.json: {0}")]
    Json(#[from] serde_json::Error),
}

/// The chaos run's timeline as a chart: the chief's step rate over the run, and each fault
/// carried out as a marker at the time it hit.
pub fn timeline_chart(plan: &Plan, observed: &Observed) -> crate::plot::Chart {
    use crate::plot::{Chart, Marker, Series};
    let rate = observed
        .samples
        .iter()
        .map(|s| (s.t_s, s.steps_per_second))
        .collect();
    let markers = observed
        .faults
        .iter()
        .map(|f| Marker {
            x: f.t_s,
            label: format!("{} {}", f.kind, f.task.as_deref().unwrap_or(&f.target)),
        })
        .collect();
    Chart {
        title: format!(
            "chaos run: {} (seed {})",
            plan.source.file_name().map_or_else(
                || plan.source.display().to_string(),
                |n| n.to_string_lossy().into_owned()
            ),
            plan.seed
        ),
        x_label: "seconds since the job started".into(),
        y_label: "closures committed per second".into(),
        series: vec![Series {
            name: "step rate".into(),
            points: rate,
        }],
        markers,
    }
}

/// The value of `--flag VALUE` or `--flag=VALUE` in a command line.
pub fn flag_value(command: &[String], flag: &str) -> Option<String> {
    let mut args = command.iter();
    while let Some(arg) = args.next() {
        if arg == flag {
            return args.next().cloned();
        }
        if let Some(v) = arg.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            return Some(v.to_string());
        }
    }
    None
}

/// Refuses a plan whose targets the launch command's job does not have, before the job starts:
/// its `--workers`, `--ps` and `--evaluators`, or the launcher's defaults where it does not
/// give them (a MultiWorkerMirrored job, `--strategy`/`--job multi-worker-mirrored`, has no
/// parameter server).
pub fn check_targets(plan: &Plan, command: &[String]) -> Result<(), TargetError> {
    use crate::cluster::TaskType;
    let mirrored = command.iter().any(|arg| arg.ends_with("multi-worker-mirrored"));
    let most = |flag: &str| -> Option<u32> {
        let given = flag_value(command, flag);
        let v = match (given, flag) {
            (Some(v), _) => v,
            (None, "--workers") => crate::bootstrap::DEFAULT_WORKERS.to_string(),
            (None, "--ps") if mirrored => "0".to_string(),
            (None, "--ps") => crate::bootstrap::DEFAULT_PS.to_string(),
            (None, _) => return None,
        };
        let max = v.rsplit(':').next()?;
        max.parse().ok()
    };
    let named = plan.faults.iter().enumerate().flat_map(|(i, f)| {
        [("target", f.target), ("peer", f.peer)]
            .into_iter()
            .filter_map(move |(key, t)| Some((i, key, t?)))
    });
    for (i, key, target) in named {
        let limit = match target.role {
            TaskType::Chief => Some(1),
            TaskType::Worker => most("--workers"),
            TaskType::Ps => most("--ps"),
            TaskType::Evaluator => Some(most("--evaluators").unwrap_or(0)),
        };
        if let Some(limit) = limit {
            let bad = match target.index {
                Some(index) => index >= limit,
                None => limit == 0,
            };
            if bad {
                return Err(TargetError::NotInJob {
                    plan: plan.source.clone(),
                    index: i,
                    key,
                    target,
                    limit,
                });
            }
        }
    }
    Ok(())
}

/// Why a plan does not fit the job its launch command starts ([`check_targets`]).
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// A fault names a task the job does not have.
    #[error(
        "{}: fault[{index}].{key}: {target} is not a task of the job (it has {limit} {} \
         task(s))",
        plan.display(),
        target.role
    )]
    NotInJob {
        /// The plan file.
        plan: PathBuf,
        /// The fault's position in the plan.
        index: usize,
        /// `target` or `peer`.
        key: &'static str,
        /// The task named.
        target: plan::Target,
        /// The tasks of its role the job has.
        limit: u32,
    },
}

/// The run directory and checkpoint directory of a launch command: its `--run-dir` and
/// `--checkpoint-dir` flags, else the checkpoint directory in the environment the job
/// inherits.
pub fn job_dirs(command: &[String]) -> (Option<PathBuf>, Option<PathBuf>) {
    let run_dir = flag_value(command, "--run-dir").map(PathBuf::from);
    let checkpoint_dir = flag_value(command, "--checkpoint-dir")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os(crate::cluster::ConfigKey::CHECKPOINT_DIR.env).map(PathBuf::from)
        });
    (run_dir, checkpoint_dir)
}

#[cfg(test)]
mod tests {
    use super::run::ReportedSummary;
    use crate::run_report::{LedgerCounts, ServerCounts};
    use super::*;

    fn summary(committed: u64, applied: [u64; 2], restores: Option<u64>) -> ReportedSummary {
        ReportedSummary {
            ledger: Some(LedgerCounts {
                scheduled: committed,
                committed,
                ..LedgerCounts::default()
            }),
            servers: (0..2)
                .map(|ps| ServerCounts {
                    ps,
                    applied: applied[ps as usize],
                    duplicates: 3,
                })
                .collect(),
            ps_restores: restores,
            rolled_back: None,
            resumed: false,
            group: Default::default(),
            unreadable: Vec::new(),
        }
    }

    fn counts(committed: u64, updates: &[u64]) -> ShardCounts {
        ShardCounts {
            source: "/ckpt/ckpt-40".into(),
            committed,
            shards: updates
                .iter()
                .enumerate()
                .map(|(i, n)| (format!("layer_{i}/kernel"), *n))
                .collect(),
        }
    }

    #[test]
    fn consistent_counts_pass() {
        let check = servers_check(
            &summary(40, [40, 40], None),
            Some(&counts(40, &[40, 25, 15])),
            &[],
        );
        assert_eq!(check.status, "passed", "{}", check.detail);
        assert!(
            check
                .detail
                .contains("ps/0: 40 applied (one per committed closure), 3 duplicates refused"),
            "{}",
            check.detail
        );
        // After a restore the rolled-back closures apply again: the summary's counts may
        // exceed the committed ones.
        let check = servers_check(
            &summary(40, [52, 47], Some(1)),
            Some(&counts(40, &[40])),
            &[],
        );
        assert_eq!(check.status, "passed", "{}", check.detail);
    }

    #[test]
    fn a_push_applied_twice_fails_the_check() {
        // One server applied one push more than there are closures, with no restore.
        let check = servers_check(&summary(40, [40, 41], None), None, &[]);
        assert_eq!(check.status, "failed", "{}", check.detail);
        // The same counts after the chief resumed from its checkpoint (it restored the
        // servers there): closures after it ran again.
        let mut resumed = summary(40, [40, 41], None);
        resumed.resumed = true;
        assert_eq!(servers_check(&resumed, None, &[]).status, "passed");
        assert!(
            check
                .detail
                .contains("ps/1 applied 41 pushes for 40 committed closures"),
            "{}",
            check.detail
        );
        // A shard of the newest checkpoint updated once more than the closures committed.
        let check = servers_check(
            &summary(40, [52, 47], Some(1)),
            Some(&counts(40, &[40, 41])),
            &[],
        );
        assert_eq!(check.status, "failed", "{}", check.detail);
        assert!(
            check
                .detail
                .contains("layer_1/kernel updated 41 times for 40 committed closures"),
            "{}",
            check.detail
        );
        // A server that applied nothing while closures committed.
        let check = servers_check(&summary(40, [40, 0], None), None, &[]);
        assert_eq!(check.status, "failed", "{}", check.detail);
        // Unless a fault hit it: its restarted process (after the last closure) counts
        // anew.
        let check = servers_check(&summary(40, [40, 0], None), None, &[1]);
        assert_eq!(check.status, "passed", "{}", check.detail);
        let check = servers_check(&summary(40, [40, 0], None), None, &[0]);
        assert_eq!(check.status, "failed", "{}", check.detail);
    }

    /// The newest checkpoint's ledger: `scheduled` closures, all committed.
    fn committed_ledger(scheduled: u64) -> crate::ledger::Ledger {
        crate::ledger::Ledger {
            scheduled,
            committed: scheduled,
            ..Default::default()
        }
    }

    fn reported(scheduled: u64, committed: u64) -> crate::run_report::LedgerCounts {
        crate::run_report::LedgerCounts {
            scheduled,
            committed,
            ..Default::default()
        }
    }

    #[test]
    fn closures_scheduled_after_the_newest_checkpoint_need_the_chiefs_report() {
        let l = committed_ledger(600);
        // Nothing after it: the checkpoint alone says so.
        let alone = checkpoint_ledger_verdict(&l, 600, 600, None);
        assert_eq!(alone, LedgerVerdict { good: true, note: None });
        // A final step after it (TensorFlow's tutorial): the report at the end holds it.
        let tutorial = checkpoint_ledger_verdict(&l, 600, 601, Some(reported(601, 601)));
        assert!(tutorial.good, "{tutorial:?}");
        assert!(tutorial.note.unwrap().contains("1 closure(s) after"));
        // No report, or one that does not hold them: nothing accounts for them.
        for report in [None, Some(reported(600, 600))] {
            let unaccounted = checkpoint_ledger_verdict(&l, 600, 601, report);
            assert!(!unaccounted.good, "{unaccounted:?}");
        }
        // A checkpoint whose own ledger is not whole fails whatever the report says.
        let pending = crate::ledger::Ledger {
            pending: 1,
            committed: 599,
            ..committed_ledger(600)
        };
        assert!(!checkpoint_ledger_verdict(&pending, 599, 600, Some(reported(600, 600))).good);
    }

    #[test]
    fn nothing_to_check_is_skipped() {
        let check = servers_check(&ReportedSummary::default(), None, &[]);
        assert_eq!(check.status, "skipped");
    }

    fn group(models: &[(&str, u64, &str)], workers: &[u64]) -> run::ReportedGroup {
        run::ReportedGroup {
            started: true,
            models: models
                .iter()
                .map(|(task, step, digest)| {
                    let model = crate::run_report::FinalModel {
                        step: *step,
                        digest: digest.to_string(),
                    };
                    (task.to_string(), model)
                })
                .collect(),
            generations: workers
                .iter()
                .enumerate()
                .map(|(i, &workers)| crate::run_report::GroupGeneration {
                    generation: i as u64 + 1,
                    workers,
                    from_step: 10 * i as u64,
                })
                .collect(),
        }
    }

    fn plan_expecting(exit: i32) -> Plan {
        Plan::parse(
            Path::new("p.toml"),
            &format!("seed = 1\nexpect_exit = {exit}\n"),
        )
        .unwrap()
    }

    #[test]
    fn members_with_one_model_pass_and_any_difference_fails() {
        let ok = plan_expecting(0);
        let same = group(
            &[("chief/0", 450, "ab"), ("worker/0", 450, "ab")],
            &[2, 1, 2],
        );
        assert_eq!(one_model_check(&ok, &same).status, "passed");
        let bits = group(&[("chief/0", 450, "ab"), ("worker/0", 450, "ac")], &[2]);
        let check = one_model_check(&ok, &bits);
        assert_eq!(check.status, "failed");
        assert!(
            check.detail.contains("worker/0: step 450, digest ac"),
            "{}",
            check.detail
        );
        let steps = group(&[("chief/0", 450, "ab"), ("worker/0", 449, "ab")], &[2]);
        assert_eq!(one_model_check(&ok, &steps).status, "failed");
        // A member of the last generation that never said how it ended.
        let missing = group(&[("chief/0", 450, "ab"), ("worker/0", 450, "ab")], &[3]);
        let check = one_model_check(&ok, &missing);
        assert_eq!(check.status, "failed");
        assert!(
            check.detail.contains("has 3 workers, but 2"),
            "{}",
            check.detail
        );
        let none = group(&[], &[3]);
        assert_eq!(one_model_check(&ok, &none).status, "failed");
        assert_eq!(one_model_check(&plan_expecting(1), &none).status, "skipped");
    }

    #[test]
    fn group_generations_must_go_forward() {
        let ok = plan_expecting(0);
        assert_eq!(
            membership_check(&ok, &group(&[], &[3, 2, 3])).status,
            "passed"
        );
        let mut back = group(&[], &[3, 2, 3]);
        back.generations[2].generation = 2;
        assert_eq!(membership_check(&ok, &back).status, "failed");
        let mut earlier = group(&[], &[3, 2]);
        earlier.generations[1].from_step = 0;
        earlier.generations[0].from_step = 5;
        assert_eq!(membership_check(&ok, &earlier).status, "failed");
        assert_eq!(membership_check(&ok, &group(&[], &[])).status, "failed");
        // The workers finished while the chief was away: nothing of it to check.
        let without_chief = group(&[("worker/0", 450, "ab"), ("worker/1", 450, "ab")], &[]);
        assert_eq!(membership_check(&ok, &without_chief).status, "skipped");
        let chief_silent = group(&[("chief/0", 450, "ab")], &[]);
        assert_eq!(membership_check(&ok, &chief_silent).status, "failed");
    }
}
