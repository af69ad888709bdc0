//! Writing a conf file: atomically (a temporary file beside it, fsync, rename, fsync of
//! the directory), keeping the previous version as `FILE.bak`, and owner-only when the
//! text holds a key.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A conf file that could not be written; nothing was replaced.
#[derive(Debug, thiserror::Error)]
#[error("cannot save the conf to {path}: {what}: {source}")]
pub struct SaveError {
    /// The file.
    pub path: PathBuf,
    /// The step that failed.
    pub what: &'static str,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

/// What [`save`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// The previous version, kept (None: there was none).
    pub backup: Option<PathBuf>,
    /// The mode the file was written with.
    pub mode: u32,
}

/// Write `text` to `path` atomically, the previous version kept as `path.bak`. `secret`:
/// the text holds a key, so the file is owner-only (0600) whatever the old file's mode;
/// otherwise it keeps the old file's mode (0644 for a new one, less the umask).
pub fn save(path: &Path, text: &str, secret: bool) -> Result<Saved, SaveError> {
    let err = |what: &'static str| {
        move |source| SaveError {
            path: path.to_path_buf(),
            what,
            source,
        }
    };
    // A symlinked conf stays a symlink: the file it names is replaced.
    let path = &std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let old = std::fs::metadata(path).ok().filter(std::fs::Metadata::is_file);
    let mode = match (&old, secret) {
        (_, true) => 0o600,
        (Some(m), false) => m.permissions().mode() & 0o7777,
        (None, false) => 0o644,
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let write = || -> Result<(), SaveError> {
        // Created with the final mode: a secret is never readable by others, not even for
        // the moment between create and chmod.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(err("create a temporary file"))?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(err("set the mode"))?;
        f.write_all(text.as_bytes()).map_err(err("write"))?;
        f.sync_all().map_err(err("fsync"))
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let backup = match old {
        Some(_) => {
            let bak = dir.join(format!("{name}.bak"));
            let _ = std::fs::remove_file(&bak);
            // A hard link keeps the old file whole, with its mode, at no copy.
            if let Err(e) = std::fs::hard_link(path, &bak).or_else(|_| std::fs::copy(path, &bak).map(|_| ())) {
                let _ = std::fs::remove_file(&tmp);
                return Err(err("keep the previous version")(e));
            }
            Some(bak)
        }
        None => None,
    };
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(err("rename the temporary file")(e));
    }
    // The rename is durable once the directory is.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(Saved { backup, mode })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_old_version_and_writes_secrets_owner_only() {
        let d = std::env::temp_dir().join(format!("pollux-save-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("dir");
        let p = d.join("c.toml");
        let s = save(&p, "a = 1\n", false).expect("new file");
        assert_eq!((s.backup, s.mode), (None, 0o644));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        let s = save(&p, "a = 2\n", false).expect("second");
        assert_eq!(s.mode, 0o640, "the old file's mode is kept");
        assert_eq!(std::fs::read_to_string(d.join("c.toml.bak")).expect("bak"), "a = 1\n");
        let s = save(&p, "a = 3 # key\n", true).expect("third");
        assert_eq!(s.mode, 0o600);
        let m = std::fs::metadata(&p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(m, 0o600, "a conf holding a key is owner-only");
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "a = 3 # key\n");
        assert_eq!(std::fs::read_to_string(d.join("c.toml.bak")).expect("bak"), "a = 2\n");
        let leftovers = std::fs::read_dir(&d)
            .expect("ls")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
            .count();
        assert_eq!(leftovers, 0);
        let _ = std::fs::remove_dir_all(&d);
    }
}
