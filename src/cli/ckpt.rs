//! `cohort ckpt`: look into checkpoints and take them out of cohort — `ls` a checkpoint root,
//! `show` one checkpoint's manifest, `verify` every byte against it, `export` whole variables
//! to one safetensors file. The work is [`crate::checkpoint`]'s; this module finds the
//! checkpoint a path names and prints (text by default, `--json` for machines).
//!
//! A path is either one checkpoint (`DIR/ckpt-200`, or any directory with a manifest) or a
//! checkpoint root. Given a root, `show` takes the newest checkpoint whose manifest reads,
//! `export` the newest that verifies (what a restore would take), and `verify` checks every
//! checkpoint in it.
//!
//! Exit codes: 0 success; 1 a checkpoint that does not verify or cannot be read (the message
//! names the file); 2 bad usage (no such directory, no checkpoint in it).

use crate::process::stdout::outln;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use serde_json::json;

use super::CliError;
use crate::checkpoint::{
    export_safetensors, is_checkpoint_dir, list_checkpoints, read_checkpoint, read_manifest,
    summarize_root, CheckpointSummary, LoadError, LoadedCheckpoint, Manifest,
};

/// What `cohort ckpt` does.
#[derive(Debug, Subcommand)]
pub enum CkptCommand {
    /// The checkpoints in a checkpoint directory: step, time saved, size, and whether each is
    /// complete (its manifest verifies and every shard it lists is there with its size).
    Ls(LsArgs),
    /// One checkpoint's manifest: variables with dtypes, shapes, shards and optimizer slots;
    /// shard files with sizes and SHA-256; the ledger and dataset positions it records.
    Show(PathArgs),
    /// Check a checkpoint (or every checkpoint under a checkpoint directory) byte for byte:
    /// every shard present, sizes and SHA-256 as the manifest records, valid safetensors,
    /// tensors as the layout says. Exit 1 naming the file at fault otherwise.
    Verify(PathArgs),
    /// Write a checkpoint as one safetensors file of whole variables (partitioned variables'
    /// parts joined in row order), the step in its metadata; optimizer slots with
    /// --with-slots (as `<variable>/slot/<slot>`).
    Export(ExportArgs),
}

/// Flags of `cohort ckpt ls`.
#[derive(Debug, clap::Args)]
pub struct LsArgs {
    /// The checkpoint directory (the job's checkpoint_dir).
    dir: PathBuf,
    /// One JSON document instead of text.
    #[arg(long)]
    json: bool,
}

/// Flags of `cohort ckpt show` and `verify`.
#[derive(Debug, clap::Args)]
pub struct PathArgs {
    /// A checkpoint (DIR/ckpt-N) or a checkpoint directory.
    path: PathBuf,
    /// One JSON document instead of text.
    #[arg(long)]
    json: bool,
}

/// Flags of `cohort ckpt export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// A checkpoint (DIR/ckpt-N) or a checkpoint directory (its newest valid checkpoint).
    path: PathBuf,
    /// The safetensors file to write (replaced if it exists).
    #[arg(long)]
    out: PathBuf,
    /// Also export the optimizer slots.
    #[arg(long)]
    with_slots: bool,
}

/// Runs a `cohort ckpt` command.
pub fn run(command: CkptCommand) -> Result<(), CliError> {
    match command {
        CkptCommand::Ls(args) => ls(&args),
        CkptCommand::Show(args) => show(&args),
        CkptCommand::Verify(args) => verify(&args),
        CkptCommand::Export(args) => export(&args),
    }
}

fn ls(args: &LsArgs) -> Result<(), CliError> {
    existing_dir(&args.dir)?;
    if is_checkpoint_dir(&args.dir) {
        return Err(CliError::Usage(format!(
            "{} is one checkpoint, not a checkpoint directory: `cohort ckpt ls {}` lists it \
             with the others, `cohort ckpt show {}` shows it",
            args.dir.display(),
            args.dir.parent().unwrap_or(Path::new(".")).display(),
            args.dir.display()
        )));
    }
    let summaries = summarize_root(&args.dir).map_err(|e| CliError::Failed(e.to_string()))?;
    if args.json {
        let list: Vec<_> = summaries.iter().map(summary_json).collect();
        print_json(&json!({ "dir": args.dir, "checkpoints": list }));
        return Ok(());
    }
    outln!("checkpoints in {}", args.dir.display());
    if summaries.is_empty() {
        outln!("  none (no ckpt-<step> directory)");
        return Ok(());
    }
    let rows: Vec<[String; 5]> = summaries
        .iter()
        .map(|s| {
            [
                s.step.map_or_else(|| "-".into(), |n| n.to_string()),
                name_of(&s.dir),
                s.created_unix_ms.map_or_else(|| "-".into(), utc),
                human_bytes(s.bytes),
                match &s.incomplete {
                    None => "complete".into(),
                    Some(why) => format!("INCOMPLETE: {why}"),
                },
            ]
        })
        .collect();
    print_table(
        &["STEP", "DIRECTORY", "SAVED (UTC)", "SIZE", "STATUS"],
        &rows,
    );
    Ok(())
}

fn show(args: &PathArgs) -> Result<(), CliError> {
    let dir = match target(&args.path)? {
        Target::One(dir) => dir,
        Target::Root(dirs) => newest(&args.path, &dirs, |dir| read_manifest(dir).map(|_| ()))?,
    };
    let manifest = read_manifest(&dir).map_err(|e| unreadable(&dir, &e))?;
    if args.json {
        print_json(&json!({ "dir": dir, "manifest": manifest }));
        return Ok(());
    }
    print_manifest(&dir, &manifest);
    Ok(())
}

fn verify(args: &PathArgs) -> Result<(), CliError> {
    let dirs = match target(&args.path)? {
        Target::One(dir) => vec![dir],
        Target::Root(dirs) => dirs,
    };
    let results: Vec<(PathBuf, Result<LoadedCheckpoint, LoadError>)> = dirs
        .into_iter()
        .map(|dir| {
            let result = read_checkpoint(&dir);
            (dir, result)
        })
        .collect();
    let failed: Vec<&(PathBuf, Result<LoadedCheckpoint, LoadError>)> =
        results.iter().filter(|(_, r)| r.is_err()).collect();
    if args.json {
        let list: Vec<_> = results
            .iter()
            .map(|(dir, result)| match result {
                Ok(loaded) => json!({
                    "dir": dir,
                    "step": loaded.manifest.step,
                    "ok": true,
                    "files": loaded.manifest.files.iter().map(|f| json!({
                        "name": f.name, "bytes": f.bytes, "sha256": f.sha256,
                    })).collect::<Vec<_>>(),
                }),
                Err(e) => json!({
                    "dir": dir,
                    "ok": false,
                    "file": dir.parent().map(|p| p.join(e.file())),
                    "error": e.to_string(),
                }),
            })
            .collect();
        print_json(&json!({ "ok": failed.is_empty(), "checkpoints": list }));
    } else {
        for (dir, result) in &results {
            match result {
                Ok(loaded) => {
                    let bytes: u64 = loaded.manifest.files.iter().map(|f| f.bytes).sum();
                    let tensors: usize =
                        loaded.manifest.files.iter().map(|f| f.tensors.len()).sum();
                    outln!(
                        "OK {} (step {}): manifest checksum, {} shard file(s) of {} with the \
                         sizes and SHA-256 it records, {tensors} tensors as the layout says",
                        dir.display(),
                        loaded.manifest.step,
                        loaded.manifest.files.len(),
                        human_bytes(bytes),
                    );
                }
                Err(e) => outln!("FAILED {}: {e}", dir.display()),
            }
        }
    }
    match failed.first() {
        None => Ok(()),
        Some((dir, Err(e))) => Err(CliError::Failed(format!(
            "{} of {} checkpoint(s) do not verify; first: {}: {e}",
            failed.len(),
            results.len(),
            parent_of(dir).join(e.file()).display(),
        ))),
        Some(_) => Ok(()),
    }
}

fn export(args: &ExportArgs) -> Result<(), CliError> {
    let loaded = match target(&args.path)? {
        Target::One(dir) => read_checkpoint(&dir).map_err(|e| unreadable(&dir, &e))?,
        Target::Root(dirs) => {
            let dir = newest(&args.path, &dirs, |dir| read_checkpoint(dir).map(|_| ()))?;
            read_checkpoint(&dir).map_err(|e| unreadable(&dir, &e))?
        }
    };
    let source = name_of(&loaded.dir);
    let bytes = export_safetensors(&loaded.checkpoint, args.with_slots, &source)
        .map_err(|e| CliError::Failed(format!("{}: {e}", loaded.dir.display())))?;
    write_replacing(&args.out, &bytes)?;
    let slots: usize = loaded.manifest.slots.values().map(Vec::len).sum();
    outln!(
        "exported {} (step {}) to {}: {} variable(s){}, {}",
        loaded.dir.display(),
        loaded.manifest.step,
        args.out.display(),
        loaded.manifest.layout.len(),
        if args.with_slots {
            format!(" and {slots} optimizer slot(s)")
        } else {
            String::new()
        },
        human_bytes(bytes.len() as u64)
    );
    Ok(())
}

/// What a path names: one checkpoint, or a root with its checkpoints (oldest first).
enum Target {
    One(PathBuf),
    Root(Vec<PathBuf>),
}

fn target(path: &Path) -> Result<Target, CliError> {
    existing_dir(path)?;
    if is_checkpoint_dir(path) {
        return Ok(Target::One(path.to_path_buf()));
    }
    let dirs: Vec<PathBuf> = list_checkpoints(path)
        .map_err(|e| CliError::Failed(e.to_string()))?
        .into_iter()
        .map(|e| e.dir)
        .collect();
    if dirs.is_empty() {
        return Err(CliError::Usage(format!(
            "{}: no checkpoint here (neither a manifest.json nor a ckpt-<step> directory)",
            path.display()
        )));
    }
    Ok(Target::Root(dirs))
}

/// The newest of `dirs` that `usable` accepts; the ones passed over are said on stderr.
fn newest(
    root: &Path,
    dirs: &[PathBuf],
    usable: impl Fn(&Path) -> Result<(), LoadError>,
) -> Result<PathBuf, CliError> {
    let mut skipped: Vec<(PathBuf, LoadError)> = Vec::new();
    for dir in dirs.iter().rev() {
        match usable(dir) {
            Ok(()) => {
                for (dir, e) in &skipped {
                    eprintln!("skipped {}: {e}", dir.display());
                }
                return Ok(dir.clone());
            }
            Err(e) => skipped.push((dir.clone(), e)),
        }
    }
    let reasons: Vec<String> = skipped
        .iter()
        .map(|(dir, e)| format!("{}: {e}", dir.display()))
        .collect();
    Err(CliError::Failed(format!(
        "no usable checkpoint in {}: {}",
        root.display(),
        reasons.join("; ")
    )))
}

fn existing_dir(path: &Path) -> Result<(), CliError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(CliError::Usage(format!(
            "{}: not a directory (give a checkpoint directory or one of its ckpt-<step>)",
            path.display()
        ))),
        Err(e) => Err(CliError::Usage(format!("{}: {e}", path.display()))),
    }
}

fn unreadable(dir: &Path, e: &LoadError) -> CliError {
    CliError::Failed(format!(
        "checkpoint {} cannot be read: {}: {e}",
        dir.display(),
        parent_of(dir).join(e.file()).display()
    ))
}

/// Writes `bytes` to `path` through a temporary file beside it, so that a failed export never
/// leaves half a file under the name asked for.
fn write_replacing(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let name = path
        .file_name()
        .ok_or_else(|| CliError::Usage(format!("--out {}: not a file name", path.display())))?;
    let tmp = parent_of(path).join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let failed = |op: &str, e: std::io::Error| {
        let _ = std::fs::remove_file(&tmp);
        CliError::Failed(format!("--out {}: cannot {op}: {e}", path.display()))
    };
    std::fs::write(&tmp, bytes).map_err(|e| failed("write", e))?;
    std::fs::rename(&tmp, path).map_err(|e| failed("rename into place", e))
}

fn parent_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

fn name_of(dir: &Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn print_manifest(dir: &Path, m: &Manifest) {
    outln!("checkpoint {}", dir.display());
    outln!(
        "  step {}, saved {} UTC, format {} version {}, {} parameter server(s)",
        m.step,
        utc(m.created_unix_ms),
        m.format,
        m.format_version,
        m.num_ps
    );
    outln!("\nvariables ({}):", m.layout.len());
    let rows: Vec<[String; 5]> = m
        .layout
        .iter()
        .map(|l| {
            let shards = l
                .shards
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let stored = l.shard_name(i);
                    format!(
                        "{stored} on ps/{} rows {}..{}",
                        s.ps, s.rows.start, s.rows.end
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            let slots = m
                .slots
                .get(&l.name)
                .map_or_else(|| "-".into(), |s| s.join(", "));
            [
                l.name.clone(),
                l.dtype.to_string(),
                format!("{:?}", l.shape),
                slots,
                shards,
            ]
        })
        .collect();
    print_table(
        &["  NAME", "DTYPE", "SHAPE", "OPTIMIZER SLOTS", "SHARDS"],
        &indent(rows),
    );
    outln!("\nshard files ({}):", m.files.len());
    let rows: Vec<[String; 5]> = m
        .files
        .iter()
        .map(|f| {
            [
                f.name.clone(),
                format!("ps/{}", f.ps),
                format!("{} bytes", f.bytes),
                format!("{} tensors", f.tensors.len()),
                format!("sha256 {}", f.sha256),
            ]
        })
        .collect();
    print_table(
        &["  FILE", "PS", "SIZE", "TENSORS", "CHECKSUM"],
        &indent(rows),
    );
    outln!("\nledger at the cut:");
    if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(&m.ledger) {
        let mut counts = Vec::new();
        for (key, value) in &fields {
            match value {
                serde_json::Value::Array(ranges) => outln!(
                    "  {key}: {} id(s) {}",
                    count_ids(ranges),
                    serde_json::to_string(ranges).unwrap_or_default()
                ),
                other => counts.push(format!("{key} {other}")),
            }
        }
        outln!("  {}", counts.join(", "));
    }
    let positions = m
        .dataset_positions
        .iter()
        .map(|(worker, n)| format!("worker {worker}: {n}"))
        .collect::<Vec<_>>();
    outln!(
        "\ndataset positions (elements consumed): {}",
        if positions.is_empty() {
            "none".into()
        } else {
            positions.join(", ")
        }
    );
}

/// Ids in a JSON list of inclusive `[first, last]` ranges.
fn count_ids(ranges: &[serde_json::Value]) -> u64 {
    ranges
        .iter()
        .filter_map(|r| {
            let first = r.get(0)?.as_u64()?;
            let last = r.get(1)?.as_u64()?;
            Some(last.saturating_sub(first).saturating_add(1))
        })
        .fold(0u64, u64::saturating_add)
}

fn indent(rows: Vec<[String; 5]>) -> Vec<[String; 5]> {
    rows.into_iter()
        .map(|mut r| {
            r[0] = format!("  {}", r[0]);
            r
        })
        .collect()
}

fn summary_json(s: &CheckpointSummary) -> serde_json::Value {
    json!({
        "step": s.step,
        "dir": s.dir,
        "created_unix_ms": s.created_unix_ms,
        "bytes": s.bytes,
        "complete": s.incomplete.is_none(),
        "incomplete": s.incomplete,
    })
}

fn print_json(value: &serde_json::Value) {
    outln!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// Prints rows under headers, columns padded to their widest cell (the last one is not).
fn print_table<const N: usize>(headers: &[&str; N], rows: &[[String; N]]) {
    let mut widths = [0usize; N];
    for (i, h) in headers.iter().enumerate() {
        widths[i] = h.chars().count();
    }
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        outln!("{}", out.trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = "B";
    for u in UNITS {
        if value < 1000.0 {
            break;
        }
        value /= 1000.0;
        unit = u;
    }
    format!("{value:.1} {unit}")
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix time in milliseconds.
fn utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::summarize;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14 22:13:20");
    }

    #[test]
    fn sizes() {
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(1_500), "1.5 KB");
        assert_eq!(human_bytes(128_000_000), "128.0 MB");
    }

    #[test]
    fn a_checkpoint_that_is_not_there_is_incomplete() {
        let s = summarize(Path::new("/nonexistent/ckpt-1"), Some(1));
        assert!(s.incomplete.is_some());
        assert_eq!(summary_json(&s)["complete"], false);
    }
}
