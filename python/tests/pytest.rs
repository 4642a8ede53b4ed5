//! The Python package's tests (`python/tests/test_*.py`, pytest), run against the native module
//! this very build made, so that `cargo nextest run --workspace` (what CI runs) checks the
//! Python package too.
//!
//! Each test here lays out the package in a temporary directory (the Python sources of
//! `python/cohort/` and this build's `lib_native.so` as `cohort/_native.abi3.so`, as
//! `maturin develop` would), puts it first on `PYTHONPATH` and runs one pytest file. Without
//! python3, pytest or numpy the test says SKIPPED (part `python`); a pytest test that skips for
//! want of PyTorch is recorded as a skip of part `torch`.

#[path = "../../tests/skip_support/mod.rs"]
mod skip_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use skip_support::{skip, Part};

/// The Python interpreter the tests run (`COHORT_TEST_PYTHON` names another).
fn python() -> String {
    std::env::var("COHORT_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// `python/`.
fn package_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The native module this build made: `lib_native.so` beside this test's executable (in
/// `deps/`) or one folder up.
fn native_module() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its executable");
    let deps = exe.parent().expect("the executable is in a folder");
    [deps.to_path_buf(), deps.join("..")]
        .iter()
        .map(|dir| dir.join("lib_native.so"))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("no lib_native.so beside {} or above", exe.display()))
}

/// This build's `cohort` binary, beside the native module's folder (`cargo build` and the
/// workspace's tests build it), if it is there.
fn cohort_binary() -> Option<PathBuf> {
    let module = native_module();
    let folder = module.parent()?;
    [folder.join("cohort"), folder.join("../cohort")]
        .into_iter()
        .find(|path| path.is_file())
}

/// The package laid out in a new temporary directory; returns the directory to put on
/// `PYTHONPATH` (kept until the guard drops).
fn lay_out_package() -> tempfile::TempDir {
    let root = tempfile::Builder::new()
        .prefix("cohort-python-")
        .tempdir()
        .expect("a temporary directory");
    let package = root.path().join("cohort");
    std::fs::create_dir(&package).expect("the package folder");
    for entry in std::fs::read_dir(package_root().join("cohort")).expect("python/cohort") {
        let path = entry.expect("a directory entry").path();
        let keep = path
            .extension()
            .is_some_and(|ext| ext == "py" || ext == "pyi" || ext == "typed");
        if keep {
            let name = path.file_name().expect("a file name");
            std::fs::copy(&path, package.join(name)).expect("copied");
        }
    }
    std::os::unix::fs::symlink(native_module(), package.join("_native.abi3.so"))
        .expect("the native module linked in");
    root
}

/// Whether python3 can run the tests; `None` when it can, else why not.
fn missing_python() -> Option<String> {
    match Command::new(python())
        .args(["-c", "import pytest, numpy"])
        .output()
    {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "python3 lacks pytest or numpy (pip install pytest numpy): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Some(format!("no python3: {e}")),
    }
}

/// Runs pytest on `file` (in `python/tests`) against this build's package and fails with its
/// output unless every test passed; each pytest skip is recorded as a skip.
fn run_pytest(file: &str) {
    if let Some(why) = missing_python() {
        skip(Part::Python, &why);
        return;
    }
    let package = lay_out_package();
    let tests = package_root().join("tests");
    let mut python_path = package.path().as_os_str().to_owned();
    if let Some(existing) = std::env::var_os("PYTHONPATH") {
        python_path.push(":");
        python_path.push(existing);
    }
    let mut pytest = Command::new(python());
    pytest
        .args(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", file])
        .current_dir(&tests)
        .env("PYTHONPATH", python_path);
    // The chaos runner's test drives the `cohort` binary of this build, where it was built.
    if let Some(cohort) = cohort_binary() {
        pytest.env("COHORT_BIN", cohort);
    }
    let out = pytest
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("pytest started");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "pytest {file} failed ({}):\n{text}",
        out.status
    );
    record_skips(&text);
}

/// pytest's `-rs` summary lines (`SKIPPED [1] test_x.py:12: why`), each recorded.
fn record_skips(pytest_output: &str) {
    for line in pytest_output.lines().filter(|l| l.starts_with("SKIPPED")) {
        let part = if line.contains("torch") {
            Part::Torch
        } else {
            Part::Python
        };
        skip(part, line);
    }
}

#[test]
fn the_package_api_checks_pass() {
    run_pytest("test_api.py");
}

#[test]
fn python_jobs_train_to_their_targets() {
    run_pytest("test_training.py");
}

#[test]
fn python_jobs_survive_kills_and_stop_requests() {
    run_pytest("test_faults.py");
}

#[test]
fn multi_worker_mirrored_from_python_keeps_one_model_through_kills_and_preemption() {
    run_pytest("test_mirrored.py");
}

#[test]
fn multi_worker_mirrored_from_python_resumes_from_its_checkpoints() {
    run_pytest("test_mirrored_checkpoints.py");
}

#[test]
fn bad_input_from_python_is_named_and_loses_nothing() {
    run_pytest("test_bad_input.py");
}

#[test]
fn a_sidecar_evaluator_from_python_evaluates_each_checkpoint_with_the_scripts_function() {
    run_pytest("test_evaluator.py");
}

/// The layout helper itself: the package it lays out holds the sources and the module.
#[test]
fn the_laid_out_package_has_every_source_and_the_native_module() {
    let package = lay_out_package();
    let dir: &Path = &package.path().join("cohort");
    for name in ["__init__.py", "_steps.py", "_native.pyi", "_native.abi3.so"] {
        assert!(
            dir.join(name).exists(),
            "{name} missing from {}",
            dir.display()
        );
    }
}
