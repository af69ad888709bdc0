//! The `file` backend.

use std::collections::HashMap;

use std::path::PathBuf;

use super::capacity;
use crate::FileBackend;
use crate::error::ConfError;
use crate::raw::RawFile;
use crate::validate::cx::Cx;
use crate::validate::registry::{IdOwner, claim_backend};

pub(super) fn file_backend(
    cx: &Cx<'_>,
    f: &RawFile,
    nqn: &str,
    nsid: u32,
    block_size: u32,
    files: &mut HashMap<PathBuf, (IdOwner, usize)>,
) -> Result<FileBackend, ConfError> {
    let path = cx.path(&f.path, "path")?;
    let size = match &f.size {
        None => None,
        Some(v) => Some(capacity(cx, v, "file", block_size)?),
    };
    let direct = f.direct.as_ref().is_none_or(|d| *d.get_ref());
    let shared = f.shared.as_ref().is_some_and(|s| *s.get_ref());
    claim_backend(
        files,
        path.clone(),
        nqn,
        nsid,
        cx.line(&f.path.span()),
        &format!("file {}", path.display()),
        "a file",
    )
    .map_err(|m| cx.at(f.path.span(), m.to_string()))?;
    Ok(FileBackend {
        path,
        size,
        direct,
        shared,
    })
}
