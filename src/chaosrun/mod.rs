//! `cohort chaos run`: a seeded fault plan ([`plan`]) applied to a real local job started by
//! its launch command ([`run`]), then the job's invariants checked and a report written.
//!
//! This module owns the checks and the report: the exit code the plan expects; every fault
//! carried out; every closure committed once, from the newest checkpoint's ledger and from
//! the ledger line the chief prints at the end (committed == scheduled, nothing pending or
//! failed; a closure committed twice would make committed exceed scheduled); every parameter
//! server applying pushes (the per-server counts the chief prints); no panic in any task's
//! output. `report.txt` and `report.json` (the plan, the timeline of faults and the chief's
//! step rate, each check with its detail, the verdict) and `timeline.png` (the step rate with
//! each fault marked where it hit) go to the output directory, beside
//! `job.log`.

pub mod plan;
pub mod run;

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
    checks.push(ledger_check(setup.checkpoint_dir.as_deref(), observed));
    checks.push(servers_check(observed));
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

/// Every closure committed once: the newest checkpoint's ledger and the chief's printed one.
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
                        let l = &manifest.ledger.counts;
                        let ids = manifest.ledger.committed_ids.len() as u64;
                        // Each committed closure's id once: a closure committed twice would
                        // count twice but hold one id.
                        // A checkpoint older than the job's end does not hold the closures
                        // the chief scheduled after it (as its metrics last said).
                        let seen = observed.samples.last().map_or(0, |s| s.scheduled as u64);
                        let good = l.balances()
                            && l.committed == l.scheduled
                            && ids == l.committed
                            && l.pending == 0
                            && l.failed + l.cancelled + l.unavailable == 0
                            && seen <= l.scheduled;
                        ok &= good;
                        if seen > l.scheduled {
                            found.push(format!(
                                "the chief's metrics last showed {seen} closures scheduled, more \
                                 than the newest checkpoint holds"
                            ));
                        }
                        found.push(format!(
                            "newest checkpoint {} (step {}): {} scheduled, {} committed ({} \
                             distinct closure ids), {} pending, {} failed, {} cancelled, {} \
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
                            if good {
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
        None => found.push("summary: the chief printed no ledger line".into()),
        Some(l) => {
            let good = l.committed == l.scheduled && l.pending == 0 && l.failed == 0;
            ok &= good;
            found.push(format!(
                "chief's summary: {} scheduled, {} committed, {} pending, {} failed{}",
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

/// Every server the chief reports applied pushes, and the job committed closures.
fn servers_check(observed: &Observed) -> Check {
    let servers = &observed.summary.servers;
    if servers.is_empty() {
        return Check {
            name: "ps applied counts",
            status: "skipped",
            detail: "the chief printed no per-server counts".into(),
        };
    }
    let committed = observed.summary.ledger.map_or(0, |l| l.committed);
    let idle: Vec<String> = servers
        .iter()
        .filter(|s| s.applied == 0)
        .map(|s| format!("ps/{}", s.ps))
        .collect();
    let ok = committed > 0 && idle.is_empty();
    let counts: Vec<String> = servers
        .iter()
        .map(|s| {
            format!(
                "ps/{}: {} applied, {} duplicates refused",
                s.ps, s.applied, s.duplicates
            )
        })
        .collect();
    let mut detail = format!("{committed} closures committed; {}", counts.join(", "));
    if !idle.is_empty() {
        detail.push_str(&format!(
            "; {} applied nothing while closures committed",
            idle.join(", ")
        ));
    }
    Check::new("ps applied counts", ok, detail)
}

/// Writes `report.txt` and `report.json` into `setup.out_dir`; returns whether every check
/// passed (skipped ones aside).
pub fn write_report(
    plan: &Plan,
    setup: &RunSetup,
    observed: &Observed,
    checks: &[Check],
) -> Result<bool, String> {
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
                "after": f.after.as_str(),
                "for": f.pause_for.map(crate::cluster::format_duration),
                "which": match f.which { plan::Which::All => "all", plan::Which::Newest => "newest" },
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
    if let Some(peak) = observed
        .samples
        .iter()
        .map(|s| s.steps_per_second)
        .reduce(f64::max)
    {
        text.push_str(&format!(
            "  step rate: {} samples of the chief's metrics, peak {peak:.1} closures/s\n",
            observed.samples.len()
        ));
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
        std::fs::write(&path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    write("report.txt", text.as_bytes())?;
    let json_text = serde_json::to_vec_pretty(&doc).map_err(|e| e.to_string())?;
    write("report.json", &json_text)?;
    // The timeline as a picture: the step rate, each fault a vertical line where it hit. A
    // drawing that fails loses nothing of the report: it is said, and the run goes on.
    let timeline = timeline_chart(plan, observed);
    let png = setup.out_dir.join("timeline.png");
    if let Err(e) = crate::plot::write_png(&timeline, &png, 1200, 500) {
        tracing::warn!("no timeline picture: {e}");
    }
    print!("\n{text}");
    Ok(passed)
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

/// Refuses a plan whose targets the launch command's `--workers`, `--ps` and `--evaluators`
/// (where it gives them) do not have, before the job starts.
pub fn check_targets(plan: &Plan, command: &[String]) -> Result<(), String> {
    use crate::cluster::TaskType;
    let most = |flag: &str| -> Option<u32> {
        let v = flag_value(command, flag)?;
        let max = v.rsplit(':').next()?;
        max.parse().ok()
    };
    for (i, f) in plan.faults.iter().enumerate() {
        let Some(target) = f.target else { continue };
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
                return Err(format!(
                    "{}: fault[{i}].target: {target} is not a task of the job (it has {limit} {} \
                     task(s))",
                    plan.source.display(),
                    target.role
                ));
            }
        }
    }
    Ok(())
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
