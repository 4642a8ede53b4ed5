//! New directories under the system's temporary directory for what a run makes when the user
//! named no place for it (a local cluster's run directory, the demo's checkpoints, a
//! benchmark's scratch): made by `tempfile`, each with an unpredictable name and only its
//! owner's permissions, and kept (removing them is the caller's decision: the demo removes its
//! checkpoints when it succeeds).

use std::path::PathBuf;

/// A new, empty directory `<temp>/<prefix><random>` (mode 0700), kept after this call.
pub fn new_temp_dir(prefix: &str) -> std::io::Result<PathBuf> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o700));
    }
    Ok(builder.tempdir()?.keep())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_directory_is_new_empty_and_private() {
        let (a, b) = (
            new_temp_dir("cohort-test-").unwrap(),
            new_temp_dir("cohort-test-").unwrap(),
        );
        assert_ne!(a, b);
        assert!(a.is_dir() && std::fs::read_dir(&a).unwrap().next().is_none());
        assert!(a
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("cohort-test-"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&a).unwrap().permissions().mode() & 0o777,
                0o700
            );
        }
        let _ = (std::fs::remove_dir(&a), std::fs::remove_dir(&b));
    }
}
