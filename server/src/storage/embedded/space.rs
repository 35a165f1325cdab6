//! Free space on the data directory's filesystem, and the words a client sees when there is too
//! little of it.

use std::path::Path;

/// Bytes an unprivileged process may still write on the filesystem holding `dir` (`statvfs`:
/// available blocks × fragment size).
///
/// # Errors
/// The `statvfs` error.
pub(crate) fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let st = rustix::fs::statvfs(dir)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Whether `e` (a commit error) says the filesystem is full (`ENOSPC`) or over quota
/// (`EDQUOT`), at any depth of its source chain.
pub(crate) fn is_no_space(e: &fjall::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            let code = io.raw_os_error();
            if matches!(
                io.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ) || code == Some(rustix::io::Errno::NOSPC.raw_os_error())
                || code == Some(rustix::io::Errno::DQUOT.raw_os_error())
            {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// The refusal of a write for lack of space: names the directory, says "no space left", the
/// free bytes and the mark, and that writes resume on their own.
pub(crate) fn no_space_message(dir: &Path, free: Option<u64>, min_free: u64) -> String {
    let free = free.map_or_else(|| "unknown".to_string(), |b| b.to_string());
    format!(
        "no space left for storage in {}: {free} bytes free, writes need storage.min_free_bytes \
         = {min_free}; they resume on their own once space is freed",
        dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_bytes_of_a_real_directory_is_positive_and_enospc_is_no_space() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert!(free_bytes(dir.path()).expect("statvfs") > 0);
        let full = fjall::Error::Io(std::io::Error::from_raw_os_error(
            rustix::io::Errno::NOSPC.raw_os_error(),
        ));
        assert!(is_no_space(&full));
        let eio = fjall::Error::Io(std::io::Error::from_raw_os_error(
            rustix::io::Errno::IO.raw_os_error(),
        ));
        assert!(!is_no_space(&eio));
        assert!(!is_no_space(&fjall::Error::Poisoned));
        let m = no_space_message(dir.path(), Some(5), 10);
        assert!(m.contains("no space left") && m.contains(&dir.path().display().to_string()));
    }
}
