//! Reading a config file's text, bounded: only a regular file, and at most
//! [`MAX_CONFIG_BYTES`] of it. A device (`/dev/full`, `/dev/zero`) would
//! otherwise be read until memory runs out, and a FIFO with no writer would
//! block the command for ever.

use std::io::Read as _;
use std::path::Path;

/// The largest config file read, in bytes (4 MiB: a config with thousands
/// of agents is well under a megabyte).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Why a config file's text cannot be read (the caller names the file).
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadError {
    /// Opening or reading it failed.
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    /// It is not a regular file (what it is, in words).
    #[error("is {0}, not a regular file: give the path of a config file")]
    NotAFile(&'static str),
    /// It is over [`MAX_CONFIG_BYTES`].
    #[error("is larger than {} MiB, the most a config file may be", MAX_CONFIG_BYTES >> 20)]
    TooLarge,
    /// It is not UTF-8.
    #[error("is not UTF-8 text: {0}")]
    NotUtf8(#[from] std::string::FromUtf8Error),
}

/// The text of the config file at `path`, or why it cannot be read (the
/// caller names the file).
pub(super) fn read_text(path: &Path) -> Result<String, ReadError> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        // A FIFO opens at once instead of waiting for a writer (and is then
        // refused below); a regular file reads as it would without the flag.
        options.custom_flags(nix::libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    // The opened file's own type (not the path's, which may change meanwhile).
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(ReadError::NotAFile(kind(&meta.file_type())));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(ReadError::TooLarge);
    }
    // Read at most one byte past the cap: a file that grows meanwhile (or
    // a size the file system misreports) is bounded too.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ReadError::TooLarge);
    }
    Ok(String::from_utf8(bytes)?)
}

/// What a file that is not a regular one is, in words.
fn kind(file_type: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if file_type.is_fifo() {
            return "a FIFO";
        }
        if file_type.is_char_device() {
            return "a character device";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
        if file_type.is_socket() {
            return "a socket";
        }
    }
    if file_type.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_a_directory_and_a_file_over_the_cap_are_refused_naming_why() {
        let error = read_text(Path::new("/dev/full")).unwrap_err().to_string();
        assert_eq!(
            error,
            "is a character device, not a regular file: give the path of a config file"
        );
        let dir = tempfile::tempdir().unwrap();
        let error = read_text(dir.path()).unwrap_err().to_string();
        assert!(error.starts_with("is a directory"), "{error}");
        let big = dir.path().join("big.toml");
        let file = std::fs::File::create(&big).unwrap();
        file.set_len(MAX_CONFIG_BYTES + 1).unwrap();
        assert_eq!(
            read_text(&big).unwrap_err().to_string(),
            "is larger than 4 MiB, the most a config file may be"
        );
        let small = dir.path().join("small.toml");
        std::fs::write(&small, "[run]\n").unwrap();
        assert_eq!(read_text(&small).unwrap(), "[run]\n");
    }
}
