//! `pollux setup hugepages N`: reserving 2 MiB hugepages.

use std::path::PathBuf;

use super::{Hugepages, SetupError, Sysfs};

impl Sysfs {
    /// Reserve `n` 2 MiB hugepages; how many the kernel reserved.
    pub fn hugepages(&self, n: u64) -> Result<Hugepages, SetupError> {
        let dir = self.hugepages_dir();
        let io = |what: String| {
            move |source| SetupError::Io {
                bdf: "hugepages".into(),
                what,
                source,
            }
        };
        let nr_path = dir.join("nr_hugepages");
        self.write("hugepages", &nr_path, &n.to_string())?;
        let read = |p: PathBuf| -> Result<u64, SetupError> {
            let s = std::fs::read_to_string(&p).map_err(io(format!("read {}", p.display())))?;
            s.trim().parse().map_err(|_| SetupError::Io {
                bdf: "hugepages".into(),
                what: format!("read {}", p.display()),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not a number: {s:?}")),
            })
        };
        let nr = read(nr_path)?;
        let free = read(dir.join("free_hugepages")).unwrap_or(0);
        Ok(Hugepages { nr, free })
    }
}
