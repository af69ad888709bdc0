//! `pollux --check FILE`: everything that can be known about a conf file before starting
//! it: the conf crate's rules, and what depends on this machine (the reactors' cores).
//! Errors read `FILE:LINE:COL: message`, from the start of the line, as compilers print
//! them (editors and CI parse that).

use std::path::Path;

use pollux_conf::{ConfError, Config};

/// Why a conf file would not start.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The conf crate refused it.
    #[error("{0}")]
    Conf(#[from] ConfError),
    /// A reactor's core is not one this process may run on.
    #[error("{origin}{at}: reactor {reactor}'s core {core} is not one this process may run on (allowed: {allowed})")]
    Core {
        /// The file.
        origin: String,
        /// `:LINE:COL` of `cores`, when found.
        at: String,
        /// The reactor's index.
        reactor: usize,
        /// The core.
        core: usize,
        /// The cores allowed (sched_getaffinity), as a list.
        allowed: String,
    },
}

/// Check conf file `path` as `pollux --config` would load and start it.
pub fn check(path: &Path) -> Result<Config, CheckError> {
    let cfg = Config::from_path(path)?;
    let allowed = pollux_reactor::sys::allowed_cores().unwrap_or_default();
    let outside = cfg
        .reactors
        .cores
        .iter()
        .enumerate()
        .find(|(_, c)| !allowed.contains(c));
    if let (false, Some((reactor, &core))) = (allowed.is_empty(), outside) {
        return Err(CheckError::Core {
            origin: cfg.origin.clone(),
            at: position_of_cores(cfg.document.text()),
            reactor,
            core,
            allowed: ranges(&allowed),
        });
    }
    Ok(cfg)
}

/// `:LINE:COL` of `[reactors] cores` in `text`, or "".
fn position_of_cores(text: &str) -> String {
    let Ok(doc) = toml_edit::ImDocument::parse(text) else {
        return String::new();
    };
    let span = doc
        .get("reactors")
        .and_then(|r| r.as_table_like())
        .and_then(|r| r.get("cores"))
        .and_then(toml_edit::Item::span);
    match span {
        Some(s) => {
            let before = &text[..s.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!(":{line}:{col}")
        }
        None => String::new(),
    }
}

/// `0-3,6` for [0, 1, 2, 3, 6].
fn ranges(cores: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let mut j = i;
        while j + 1 < cores.len() && cores[j + 1] == cores[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cores[i].to_string()
        } else {
            format!("{}-{}", cores[i], cores[j])
        });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_lists_and_positions() {
        assert_eq!(ranges(&[0, 1, 2, 3, 6]), "0-3,6");
        assert_eq!(ranges(&[5]), "5");
        assert_eq!(position_of_cores("# c\n[reactors]\ncores = [5]\n"), ":3:9");
    }
}
