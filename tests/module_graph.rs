//! The top-level modules of the crate (`src/<module>.rs` or `src/<module>/`) form a graph
//! without cycles: shared vocabulary sits in leaf modules (`distribute`, `ledger`), process
//! concerns in `process`, and each module only uses the ones below it. A cycle (say `variable`
//! using `strategy` while `strategy` uses `variable`) makes both halves one unit that cannot be
//! read, tested or changed apart.
//!
//! The graph is read from the sources: every path that starts at the crate root (`crate::x`,
//! `crate::{x, y}`, `$crate::x`, or a `super::` chain that climbs to the root) in any
//! `src/**/*.rs`, comments and string literals left out, test code included. On a cycle the
//! test prints it, with the file and line of each import that closes it.
//!
//! One level down, the modules inside each folder form no cycle beyond a known list that is
//! to shrink. The pure machines (`machine.rs`, `machine/`) also name no async or actor
//! runtime, no network and no clock in their production code: time is passed in. And no
//! production function of the workspace spans more than 100 lines unless its doc comment says
//! why it reads best whole.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One source file: its path under `src/` (with `/` separators) and its text.
struct Source {
    path: String,
    text: String,
}

/// Where module `from` uses module `to` first: `(from, to) -> "src/<file>:<line>"`.
type Edges = BTreeMap<(String, String), String>;

#[test]
fn the_top_level_modules_form_no_cycle() {
    let sources = read_sources();
    let edges = module_edges(&sources);
    assert!(
        edges.len() > 20,
        "only {} edges found among the modules: the scan is broken",
        edges.len()
    );
    let cycles = cycles(&edges);
    assert!(cycles.is_empty(), "{}", describe(&cycles, &edges));
}

/// The knots of modules inside a folder that import each other round a cycle, known and still
/// to be broken: every module of each knot (a strongly connected component of the imports), in
/// order. None is left; a new knot, or a module joining one, fails the test below.
const KNOWN_INNER_KNOTS: [&[&str]; 0] = [];

/// Inside each folder, the modules (`roles::worker`, `roles::coordinator`, ...) form no knot
/// of import cycles beyond the known ones: the same reading as above, one level down
/// (`crate::roles::x` and `super::` chains that reach the folder; a folder's `mod.rs` is left
/// out, as it re-exports its children). Whole knots are compared, not one cycle of each, so
/// that a module drawn into a known knot is seen.
#[test]
fn the_modules_inside_each_folder_form_no_new_cycle() {
    let sources = read_sources();
    let edges = inner_edges(&sources);
    assert!(
        edges.len() > 50,
        "only {} edges found inside the folders: the scan is broken",
        edges.len()
    );
    let knots = knots(&edges);
    let known: Vec<Vec<String>> = KNOWN_INNER_KNOTS
        .iter()
        .map(|knot| knot.iter().map(|m| m.to_string()).collect())
        .collect();
    assert!(
        knots == known,
        "the knots inside folders changed (known: {known:?}, now: {knots:?}):\n{}",
        describe(&cycles(&edges), &edges)
    );
}

/// A worker's module importing the coordinator's while the coordinator imports the worker's
/// is found, through a `super::` chain.
#[test]
fn a_cycle_between_two_modules_of_a_folder_is_found() {
    let sources = vec![
        source("roles/worker/mod.rs", "use super::coordinator::Client;\n"),
        source(
            "roles/coordinator/client.rs",
            "use crate::roles::{worker::Step, ps};\n",
        ),
        source("roles/ps.rs", "use super::super::ledger;\n"),
        source("roles/mod.rs", "pub use self::worker::Step;\n"),
    ];
    let edges = inner_edges(&sources);
    let found = cycles(&edges);
    assert_eq!(
        found,
        vec![vec![
            "roles::coordinator".to_string(),
            "roles::worker".to_string()
        ]],
        "{edges:?}"
    );
    assert!(edges.contains_key(&("roles::coordinator".into(), "roles::ps".into())));
    let report = describe(&found, &edges);
    assert!(
        report.contains("roles::worker -> roles::coordinator (src/roles/worker/mod.rs:1)"),
        "{report}"
    );
}

/// The test above fails when someone brings back the import that made `variable` and
/// `strategy` one knot.
#[test]
fn an_import_of_strategy_in_variable_is_reported_as_a_cycle() {
    let mut sources = read_sources();
    sources.push(Source {
        path: "variable/extra.rs".into(),
        text: "use crate::strategy::ReduceOp;\n".into(),
    });
    let edges = module_edges(&sources);
    let cycles = cycles(&edges);
    assert!(
        cycles
            .iter()
            .any(|c| c.contains(&"variable".to_string()) && c.contains(&"strategy".to_string())),
        "no cycle through variable and strategy found in {cycles:?}"
    );
    let report = describe(&cycles, &edges);
    assert!(
        report.contains("variable -> strategy (src/variable/extra.rs:1)"),
        "{report}"
    );
}

#[test]
fn the_scan_reads_paths_not_comments_or_strings() {
    let sources = vec![
        source("a.rs", ""),
        source("b.rs", ""),
        source("c.rs", ""),
        source("d.rs", ""),
        source("e/mod.rs", ""),
        source(
            "f.rs",
            r##"
            // use crate::a::X;
            /* crate::b::Y /* nested crate::b */ still a comment crate::b */
            /// [`crate::c`]
            const S: &str = "crate::d::Z";
            const R: &str = r#"crate::d::"Z""#;
            const Q: char = '"';
            fn f<'a>(x: &'a str) -> &'a str { x }
            pub(crate) fn g() {}
            "##,
        ),
        source("g.rs", "use crate::{a::X, e::{Y, Z}};\nuse crate::b as _;"),
        source(
            "e/inner/deep.rs",
            "use super::super::super::c::W;\nuse super::super::Local;",
        ),
        source("h.rs", "macro_rules! m { () => { $crate::d::f() }; }"),
    ];
    let edges = module_edges(&sources);
    let pairs: Vec<(&str, &str)> = edges
        .keys()
        .map(|(from, to)| (from.as_str(), to.as_str()))
        .collect();
    assert_eq!(
        pairs,
        vec![("e", "c"), ("g", "a"), ("g", "b"), ("g", "e"), ("h", "d")]
    );
    assert_eq!(edges[&("g".into(), "b".into())], "src/g.rs:2");
}

#[test]
fn cycles_are_found_and_printed_with_their_imports() {
    let edges: Edges = [
        (("a", "b"), "src/a.rs:1"),
        (("b", "c"), "src/b.rs:2"),
        (("c", "a"), "src/c/mod.rs:3"),
        (("c", "d"), "src/c/mod.rs:4"),
        (("d", "e"), "src/d.rs:5"),
    ]
    .into_iter()
    .map(|((from, to), at)| ((from.to_string(), to.to_string()), at.to_string()))
    .collect();
    let found = cycles(&edges);
    assert_eq!(found, vec![vec!["a", "b", "c"]]);
    let report = describe(&found, &edges);
    assert!(
        report.contains("a -> b (src/a.rs:1)\n  b -> c (src/b.rs:2)\n  c -> a (src/c/mod.rs:3)"),
        "{report}"
    );
    let acyclic: Edges = edges
        .into_iter()
        .filter(|((from, _), _)| from != "c")
        .collect();
    assert!(cycles(&acyclic).is_empty());
}

// ---- reading the sources ----

/// The pure machines (the coordinator's `Scheduler`, the parameter server's and the worker's
/// state machines): their production code takes time as an argument and does no I/O, so that
/// the simulator and the tests drive them exactly as the actors do. What they must not name,
/// with why.
const MACHINE_FORBIDDEN: [(&str, &str); 7] = [
    ("tokio", "an async runtime"),
    ("actix", "an actor runtime"),
    ("quinn", "the network"),
    ("Instant::now", "a clock (time is passed in)"),
    ("SystemTime::now", "a clock (time is passed in)"),
    ("thread::sleep", "a wait"),
    ("std::net", "the network"),
];

/// Whether `path` (under `src/`) is a machine's production source.
fn is_machine(path: &str) -> bool {
    (path.ends_with("/machine.rs") || path.contains("/machine/")) && !path.ends_with("_tests.rs")
}

/// What the machine sources name that they must not: `file:line: name (why)`, test modules
/// (`#[cfg(test)]` and what follows it) left out.
fn machine_violations(sources: &[Source]) -> Vec<String> {
    let mut found = Vec::new();
    for source in sources.iter().filter(|s| is_machine(&s.path)) {
        let code = strip_comments_and_literals(&source.text);
        let production = code.split("#[cfg(test)]").next().unwrap_or_default();
        for (number, line) in production.lines().enumerate() {
            for (name, why) in MACHINE_FORBIDDEN {
                if line.contains(name) {
                    found.push(format!(
                        "src/{}:{}: {name} ({why})",
                        source.path,
                        number + 1
                    ));
                }
            }
        }
    }
    found
}

#[test]
fn the_machines_name_no_runtime_network_or_clock() {
    let sources = read_sources();
    let machines = sources.iter().filter(|s| is_machine(&s.path)).count();
    assert!(
        machines >= 5,
        "only {machines} machine sources found: the scan is broken"
    );
    let found = machine_violations(&sources);
    assert!(
        found.is_empty(),
        "machines must stay pure:\n{}",
        found.join("\n")
    );
}

#[test]
fn a_clock_read_in_a_machine_is_reported_and_one_in_its_tests_is_not() {
    let sources = vec![
        source(
            "roles/ps/machine.rs",
            "fn f() { let t = std::time::Instant::now(); }\n// Instant::now in a comment\n\
             #[cfg(test)]\nmod tests { fn g() { std::time::Instant::now(); } }\n",
        ),
        source(
            "roles/coordinator/machine/save_tests.rs",
            "fn h() { tokio::spawn(x); }\n",
        ),
        source("roles/worker/actor.rs", "fn a() { tokio::spawn(x); }\n"),
    ];
    assert_eq!(
        machine_violations(&sources),
        ["src/roles/ps/machine.rs:1: Instant::now (a clock (time is passed in))"]
    );
}

// ---- long functions ----

/// The most lines a production function spans (its `fn` line to its closing brace) without
/// a reason written beside it.
const FUNCTION_LINES_MAX: usize = 100;

/// Long functions written before the rule, to be split: `path: name`. The list only shrinks:
/// a function on it that is no longer long must leave it, and no other may join it.
const KNOWN_LONG: &[&str] = &[];

/// What a longer function's doc comment says, with why (a flat table with one arm per
/// message, say, reads best whole).
const LONG_ON_PURPOSE: &str = "on purpose";

/// The production functions of `sources` longer than [`FUNCTION_LINES_MAX`] whose doc comment
/// gives no reason ([`LONG_ON_PURPOSE`]): `file:line: name (n lines)`. Test code (`*tests.rs`,
/// and a file's `#[cfg(test)]` and what follows it) is left out.
fn long_function_violations(sources: &[Source], prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    for source in sources.iter().filter(|s| !s.path.ends_with("tests.rs")) {
        let code = strip_comments_and_literals(&source.text);
        let production = code.split("#[cfg(test)]").next().unwrap_or_default();
        let original: Vec<&str> = source.text.lines().collect();
        for (name, first, last) in function_spans(production) {
            let lines = last - first + 1;
            if lines > FUNCTION_LINES_MAX && !doc_above(&original, first).contains(LONG_ON_PURPOSE)
            {
                found.push(format!(
                    "{prefix}{}:{}: {name} ({lines} lines)",
                    source.path,
                    first + 1
                ));
            }
        }
    }
    found
}

/// Every function with a body in `code` (comments and literals blanked): its name and the
/// lines (from 0) of its `fn` and of its closing brace.
fn function_spans(code: &str) -> Vec<(String, usize, usize)> {
    let chars: Vec<char> = code.chars().collect();
    let line_at = |i: usize| chars[..i].iter().filter(|c| **c == '\n').count();
    let mut spans = Vec::new();
    let mut i = 0;
    while i + 2 < chars.len() {
        let is_fn = chars[i] == 'f'
            && chars[i + 1] == 'n'
            && chars[i + 2].is_whitespace()
            && (i == 0 || !is_ident(chars[i - 1]));
        if !is_fn {
            i += 1;
            continue;
        }
        let (name, after) = read_ident(&chars, skip_whitespace(&chars, i + 2));
        // `fn(u32) -> u32`, a pointer type, has no name; a declaration ends at `;`.
        let body = (after..chars.len()).find(|&j| chars[j] == '{' || chars[j] == ';');
        let Some(open) = body.filter(|&j| !name.is_empty() && chars[j] == '{') else {
            i += 2;
            continue;
        };
        let mut depth = 0usize;
        let mut close = open;
        for (j, c) in chars.iter().enumerate().skip(open) {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = j;
                        break;
                    }
                }
                _ => {}
            }
        }
        spans.push((name, line_at(i), line_at(close)));
        // Functions nested in this one are counted within it.
        i = close.max(i + 2);
    }
    spans
}

/// The doc comment (and attributes) right above line `first` of `lines`.
fn doc_above(lines: &[&str], first: usize) -> String {
    let mut doc = Vec::new();
    for line in lines[..first].iter().rev() {
        let line = line.trim();
        if line.starts_with("///") || line.starts_with("#[") || line.starts_with("//") {
            doc.push(line);
        } else {
            break;
        }
    }
    doc.join(" ")
}

/// Every `.rs` file under the workspace's crates (`src/`, `actors/src/`, `transport/src/`,
/// `chaos/src/`, `python/src/`), by crate prefix.
fn read_workspace_sources() -> Vec<(&'static str, Vec<Source>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut crates = vec![("src/", read_sources())];
    for dir in ["actors/src", "transport/src", "chaos/src", "python/src"] {
        let base = root.join(dir);
        let mut files = Vec::new();
        collect_rs(&base, &mut files);
        let sources = files
            .into_iter()
            .map(|file| Source {
                text: std::fs::read_to_string(&file)
                    .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display())),
                path: file
                    .strip_prefix(&base)
                    .expect("under the crate")
                    .to_string_lossy()
                    .replace('\\', "/"),
            })
            .collect();
        crates.push((dir, sources));
    }
    crates
}

#[test]
fn no_production_function_is_longer_than_100_lines_without_a_reason() {
    let mut found = Vec::new();
    for (prefix, sources) in read_workspace_sources() {
        let prefix = if prefix.ends_with('/') {
            prefix.to_string()
        } else {
            format!("{prefix}/")
        };
        found.extend(long_function_violations(&sources, &prefix));
    }
    let key = |found: &str| -> String {
        // "path:line: name (n lines)" -> "path: name"
        let (path, rest) = found.split_once(':').expect("path:line");
        let name = rest.split_once(": ").map_or("", |(_, r)| r);
        format!("{path}: {}", name.split(' ').next().unwrap_or(""))
    };
    let new: Vec<&String> = found
        .iter()
        .filter(|f| !KNOWN_LONG.contains(&key(f).as_str()))
        .collect();
    let keys: Vec<String> = found.iter().map(|f| key(f)).collect();
    let shortened: Vec<&&str> = KNOWN_LONG
        .iter()
        .filter(|k| !keys.contains(&k.to_string()))
        .collect();
    assert!(
        new.is_empty(),
        "production functions longer than {FUNCTION_LINES_MAX} lines: split them, or say in \
         the doc comment why one reads best whole (\"Longer than most functions here {LONG_ON_PURPOSE}: \
         ...\"):\n{}",
        new.iter().map(|f| f.as_str()).collect::<Vec<_>>().join("\n")
    );
    assert!(
        shortened.is_empty(),
        "no longer long (or gone): remove them from KNOWN_LONG:\n{}",
        shortened
            .iter()
            .map(|k| k.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn a_long_function_is_reported_unless_its_doc_says_why() {
    let body = "    let x = 1;\n".repeat(FUNCTION_LINES_MAX);
    let text = format!(
        "/// Short.\nfn short() {{ let s = \"{{\"; }}\n/// Plain.\npub fn long() {{\n{body}}}\n\
         /// Longer than most functions here on purpose: one arm per case.\n#[inline]\n\
         fn table() {{\n{body}}}\ntrait T {{ fn declared(&self); }}\n\
         #[cfg(test)]\nmod tests {{ fn in_tests() {{\n{body}}} }}\n"
    );
    let sources = vec![
        source("a/mod.rs", &text),
        source("a/b_tests.rs", &format!("fn t() {{\n{body}}}\n")),
    ];
    assert_eq!(
        long_function_violations(&sources, "src/"),
        [format!(
            "src/a/mod.rs:4: long ({} lines)",
            FUNCTION_LINES_MAX + 2
        )]
    );
}

fn source(path: &str, text: &str) -> Source {
    Source {
        path: path.into(),
        text: text.into(),
    }
}

/// Every `.rs` file under `src/`.
fn read_sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect_rs(&root, &mut files);
    assert!(!files.is_empty(), "no sources under {}", root.display());
    files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
            let path = file
                .strip_prefix(&root)
                .expect("under src")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            Source { path, text }
        })
        .collect()
}

fn collect_rs(dir: &Path, files: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            collect_rs(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

// ---- the graph ----

/// The top-level module a file belongs to (`None` for the crate root files), and the depth
/// of its module below the root (`roles/node.rs` is 2, `roles/mod.rs` and `ledger.rs` 1).
fn module_of(path: &str) -> Option<(String, usize)> {
    let parts: Vec<&str> = path.split('/').collect();
    let top = parts[0].trim_end_matches(".rs");
    if parts.len() == 1 && (top == "lib" || top == "main") {
        return None;
    }
    let last = parts[parts.len() - 1];
    let depth = if last == "mod.rs" {
        parts.len() - 1
    } else {
        parts.len()
    };
    Some((top.to_string(), depth))
}

/// The edges among top-level modules, each with where it is first seen.
fn module_edges(sources: &[Source]) -> Edges {
    let modules: BTreeSet<String> = sources
        .iter()
        .filter_map(|s| module_of(&s.path).map(|(top, _)| top))
        .collect();
    let mut edges = Edges::new();
    let mut sorted: Vec<&Source> = sources.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    for source in sorted {
        let Some((from, depth)) = module_of(&source.path) else {
            continue;
        };
        let code = strip_comments_and_literals(&source.text);
        for (line, target) in root_paths(&code, depth) {
            if target != from && modules.contains(&target) {
                edges
                    .entry((from.clone(), target))
                    .or_insert_with(|| format!("src/{}:{line}", source.path));
            }
        }
    }
    edges
}

/// `text` with comments, string literals and char literals blanked out (newlines kept, so
/// that line numbers stay right).
fn strip_comments_and_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // Block comments nest in Rust.
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"...", r#"..."#, ...
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.extend(chars[i..j.min(chars.len())].iter().map(|&c| blank(c)));
            i = j;
        } else if c == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(chars.len());
            out.extend(chars[i..end].iter().map(|&c| blank(c)));
            i = end;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}'), or else a lifetime, kept as it is.
            let end = if next == Some('\\') {
                (i + 2..chars.len())
                    .find(|&j| chars[j] == '\'')
                    .map(|j| j + 1)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(end) => {
                    out.extend(chars[i..end].iter().map(|&c| blank(c)));
                    i = end;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && is_ident(chars[i - 1])
}

/// Where paths begin in `code`: each `crate` (or `$crate`) and each first `super` of a path,
/// as its line, whether it is `crate`, and the position after the word; with the characters.
fn path_heads(code: &str) -> (Vec<char>, Vec<(usize, bool, usize)>) {
    let chars: Vec<char> = code.chars().collect();
    let mut heads = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !is_ident(chars[i]) || ident_before(&chars, i) {
            i += 1;
            continue;
        }
        let (word, after) = read_ident(&chars, i);
        let preceded_by_path = i >= 2 && chars[i - 1] == ':' && chars[i - 2] == ':';
        let is_crate = match word.as_str() {
            "crate" => !preceded_by_path || (i >= 3 && chars[i - 3] == '$'),
            "super" => false,
            _ => {
                i = after;
                continue;
            }
        };
        if is_crate || !preceded_by_path {
            let line = 1 + chars[..i].iter().filter(|&&c| c == '\n').count();
            heads.push((line, is_crate, after));
        }
        i = after;
    }
    (chars, heads)
}

/// The top-level modules named by paths from the crate root in `code` (a file whose module
/// is `depth` below the root), with their line numbers.
fn root_paths(code: &str, depth: usize) -> Vec<(usize, String)> {
    let (chars, heads) = path_heads(code);
    let mut found = Vec::new();
    for (line, is_crate, after) in heads {
        let at_root = if is_crate {
            Some(after)
        } else {
            climb_supers(&chars, after, depth)
        };
        if let Some(rest) = at_root.and_then(|at| skip_path_sep(&chars, at)) {
            for target in first_segments(&chars, rest) {
                found.push((line, target));
            }
        }
    }
    found
}

/// After a first `super` ending at `at`: where the path continues once it has reached the
/// crate root, if it does (`depth` supers in all, counting the first).
fn climb_supers(chars: &[char], mut at: usize, depth: usize) -> Option<usize> {
    let mut supers = 1;
    while supers < depth {
        let rest = skip_path_sep(chars, at)?;
        let (word, after) = read_ident(chars, rest);
        if word != "super" {
            return None;
        }
        supers += 1;
        at = after;
    }
    (supers == depth).then_some(at)
}

fn read_ident(chars: &[char], start: usize) -> (String, usize) {
    let mut end = start;
    while end < chars.len() && is_ident(chars[end]) {
        end += 1;
    }
    (chars[start..end].iter().collect(), end)
}

fn skip_whitespace(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() && chars[i].is_whitespace() {
        i += 1;
    }
    i
}

/// The position after `::` (whitespace allowed around it), if `::` comes next.
fn skip_path_sep(chars: &[char], i: usize) -> Option<usize> {
    let i = skip_whitespace(chars, i);
    (chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':'))
        .then(|| skip_whitespace(chars, i + 2))
}

/// The first segment of the path at `i`: one identifier, or the first identifier of each
/// item of a `{...}` group.
fn first_segments(chars: &[char], i: usize) -> Vec<String> {
    if chars.get(i) != Some(&'{') {
        let (word, _) = read_ident(chars, i);
        return if word.is_empty() {
            Vec::new()
        } else {
            vec![word]
        };
    }
    let mut segments = Vec::new();
    let mut depth = 0;
    let mut expect_item = true;
    let mut j = i;
    while j < chars.len() {
        match chars[j] {
            '{' => {
                depth += 1;
                expect_item = depth == 1;
                j += 1;
            }
            '}' => {
                depth -= 1;
                j += 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => {
                expect_item = true;
                j += 1;
            }
            c if is_ident(c) && expect_item && depth == 1 => {
                let (word, after) = read_ident(chars, j);
                segments.push(word);
                expect_item = false;
                j = after;
            }
            _ => j += 1,
        }
    }
    segments
}

// ---- modules inside a folder ----

/// The second-level module a file of a folder belongs to (`roles/worker/machine.rs` is
/// `(roles, worker)`), with its module's depth below the root; `None` for top-level files and
/// a folder's own `mod.rs` (which re-exports its children, so edges through it say nothing).
fn inner_module_of(path: &str) -> Option<(String, String, usize)> {
    let parts: Vec<&str> = path.split('/').collect();
    if parts.len() < 2 || (parts.len() == 2 && parts[1] == "mod.rs") {
        return None;
    }
    let (_, depth) = module_of(path)?;
    Some((
        parts[0].to_string(),
        parts[1].trim_end_matches(".rs").to_string(),
        depth,
    ))
}

/// The sibling modules of folder `top` that `code` (a file of `top`, `depth` below the root)
/// names: `crate::top::x` and a `super::` chain that climbs to `top` then names `x`.
fn folder_paths(code: &str, top: &str, depth: usize) -> Vec<(usize, String)> {
    let (chars, heads) = path_heads(code);
    let mut found = Vec::new();
    for (line, is_crate, after) in heads {
        let in_folder = if is_crate {
            skip_path_sep(&chars, after).and_then(|rest| {
                let (first, end) = read_ident(&chars, rest);
                (first == top).then(|| skip_path_sep(&chars, end)).flatten()
            })
        } else if depth >= 2 {
            // `depth - 1` supers reach the folder from a file `depth` below the root.
            climb_supers(&chars, after, depth - 1).and_then(|at| skip_path_sep(&chars, at))
        } else {
            None
        };
        if let Some(rest) = in_folder {
            for target in first_segments(&chars, rest) {
                found.push((line, target));
            }
        }
    }
    found
}

/// The edges among the second-level modules of each folder (`roles::worker` ->
/// `roles::coordinator`), each with where it is first seen.
fn inner_edges(sources: &[Source]) -> Edges {
    let modules: BTreeSet<(String, String)> = sources
        .iter()
        .filter_map(|s| inner_module_of(&s.path).map(|(top, inner, _)| (top, inner)))
        .collect();
    let mut edges = Edges::new();
    let mut sorted: Vec<&Source> = sources.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    for source in sorted {
        let Some((top, from, depth)) = inner_module_of(&source.path) else {
            continue;
        };
        let code = strip_comments_and_literals(&source.text);
        for (line, target) in folder_paths(&code, &top, depth) {
            if target != from && modules.contains(&(top.clone(), target.clone())) {
                edges
                    .entry((format!("{top}::{from}"), format!("{top}::{target}")))
                    .or_insert_with(|| format!("src/{}:{line}", source.path));
            }
        }
    }
    edges
}

// ---- cycles ----

/// The strongly connected components with more than one module (Tarjan): every module of
/// each, sorted.
fn knots(edges: &Edges) -> Vec<Vec<String>> {
    let graph = graph_of(edges);
    let mut found: Vec<Vec<String>> = components(&graph)
        .into_iter()
        .map(|c| c.into_iter().map(str::to_string).collect())
        .collect();
    found.sort();
    found
}

/// The imports as a graph: each module with the modules it imports.
fn graph_of(edges: &Edges) -> BTreeMap<&str, Vec<&str>> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        graph.entry(from).or_default().push(to);
        graph.entry(to).or_default();
    }
    graph
}

/// The strongly connected components of `graph` with more than one module (Tarjan).
fn components<'a>(graph: &'a BTreeMap<&'a str, Vec<&'a str>>) -> Vec<BTreeSet<&'a str>> {
    let mut tarjan = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        components: Vec::new(),
    };
    for node in graph.keys() {
        if !tarjan.index.contains_key(node) {
            tarjan.visit(node);
        }
    }
    tarjan
        .components
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect()
}

/// The strongly connected components with more than one module (Tarjan), each as one cycle
/// through its smallest module's imports (a shortest one, which may leave other modules of
/// the component out: [`knots`] lists them all).
fn cycles(edges: &Edges) -> Vec<Vec<String>> {
    let graph = graph_of(edges);
    let mut found: Vec<Vec<String>> = components(&graph)
        .iter()
        .map(|component| cycle_within(&graph, component))
        .collect();
    found.sort();
    found
}

struct Tarjan<'a> {
    graph: &'a BTreeMap<&'a str, Vec<&'a str>>,
    index: BTreeMap<&'a str, usize>,
    low: BTreeMap<&'a str, usize>,
    stack: Vec<&'a str>,
    on_stack: BTreeSet<&'a str>,
    next: usize,
    components: Vec<BTreeSet<&'a str>>,
}

impl<'a> Tarjan<'a> {
    fn visit(&mut self, node: &'a str) {
        self.index.insert(node, self.next);
        self.low.insert(node, self.next);
        self.next += 1;
        self.stack.push(node);
        self.on_stack.insert(node);
        for &to in &self.graph[node] {
            if !self.index.contains_key(to) {
                self.visit(to);
                let low = self.low[node].min(self.low[to]);
                self.low.insert(node, low);
            } else if self.on_stack.contains(to) {
                let low = self.low[node].min(self.index[to]);
                self.low.insert(node, low);
            }
        }
        if self.low[node] == self.index[node] {
            let mut component = BTreeSet::new();
            while let Some(top) = self.stack.pop() {
                self.on_stack.remove(top);
                component.insert(top);
                if top == node {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}

/// A shortest cycle from the smallest module of `component` back to itself, within it.
fn cycle_within(graph: &BTreeMap<&str, Vec<&str>>, component: &BTreeSet<&str>) -> Vec<String> {
    let start = *component.iter().next().expect("a non-empty component");
    let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for &to in &graph[node] {
            if !component.contains(to) {
                continue;
            }
            if to == start {
                let mut path = vec![node];
                while let Some(&p) = parent.get(path[path.len() - 1]) {
                    path.push(p);
                }
                path.reverse();
                return path.into_iter().map(String::from).collect();
            }
            if !parent.contains_key(to) {
                parent.insert(to, node);
                queue.push_back(to);
            }
        }
    }
    unreachable!("a strongly connected component has a cycle through each of its modules")
}

/// The cycles, each with the import that makes every step of it.
fn describe(cycles: &[Vec<String>], edges: &Edges) -> String {
    let mut text = format!("{} import cycle(s) among the modules:\n", cycles.len());
    for cycle in cycles {
        let _ = writeln!(text, "- {} -> {}", cycle.join(" -> "), cycle[0]);
        for (k, from) in cycle.iter().enumerate() {
            let to = &cycle[(k + 1) % cycle.len()];
            let at = &edges[&(from.clone(), to.clone())];
            let _ = writeln!(text, "  {from} -> {to} ({at})");
        }
    }
    text.push_str(
        "Move the shared items into a module below both (e.g. `distribute`, `process`), \
         or import the other way round.",
    );
    text
}
