//! The `rbd` backend: a Ceph RBD image.

use std::collections::HashMap;

use std::path::PathBuf;

use toml::Spanned;

use crate::error::ConfError;
use crate::raw::RawRbd;
use crate::validate::cx::Cx;
use crate::validate::hosts::check_owner_only;
use crate::validate::registry::{IdOwner, claim_backend};
use crate::{RBD_OP_TIMEOUT_S, RbdBackend};

/// Where librados looks for its configuration when none is given.
pub(crate) const DEFAULT_CEPH_CONF: &str = "/etc/ceph/ceph.conf";

/// An image, as the registry of images in use keys it: (ceph_conf, pool, rados
/// namespace, image).
pub(in crate::validate) type ImageKey = (PathBuf, String, String, String);

/// A RADOS pool, namespace or image name: what `rbd` itself accepts (no `/` or `@`, which
/// separate the parts of an image spec, no NUL, not empty, at most 255 bytes).
fn name(cx: &Cx<'_>, v: &Spanned<String>, key: &str) -> Result<String, ConfError> {
    let s = v.get_ref();
    let why = if s.is_empty() {
        Some("must not be empty")
    } else if s.len() > 255 {
        Some("is longer than 255 bytes")
    } else if s.contains(['/', '@', '\0']) {
        Some("must not contain '/', '@' or a NUL character (they separate the parts of an image spec)")
    } else if s.chars().any(char::is_control) {
        Some("must not contain control characters")
    } else {
        None
    };
    match why {
        Some(why) => Err(cx.at(v.span(), format!("`{key}` {s:?} {why}"))),
        None => Ok(s.clone()),
    }
}

pub(super) fn rbd_backend(
    cx: &Cx<'_>,
    r: &RawRbd,
    nqn: &str,
    nsid: u32,
    images: &mut HashMap<ImageKey, (IdOwner, usize)>,
) -> Result<RbdBackend, ConfError> {
    let pool = name(cx, &r.pool, "pool")?;
    let image = name(cx, &r.image, "image")?;
    let rados_namespace = r
        .rados_namespace
        .as_ref()
        .map(|v| name(cx, v, "rados_namespace"))
        .transpose()?;
    let ceph_conf = match &r.ceph_conf {
        Some(v) => cx.path(v, "ceph_conf")?,
        None => PathBuf::from(DEFAULT_CEPH_CONF),
    };
    let user = match &r.user {
        None => "admin".to_owned(),
        Some(v) => {
            let u = name(cx, v, "user")?;
            if let Some(bare) = u.strip_prefix("client.") {
                return Err(cx.at(
                    v.span(),
                    format!("`user` is a user name without its type: write {bare:?}, not {u:?}"),
                ));
            }
            u
        }
    };
    // The keyring holds the user's secret: refused unless owner-only, as key files are.
    // librados reads it; pollux only checks it exists and who may read it.
    let keyring = match &r.keyring {
        None => None,
        Some(v) => {
            let path = cx.path(v, "keyring")?;
            check_owner_only(&path).map_err(|why| cx.at(v.span(), format!("`keyring` {}: {why}", path.display())))?;
            Some(path)
        }
    };
    let write_cache = r.write_cache.as_ref().is_some_and(|v| *v.get_ref());
    let op_timeout_s = cx.u32_or(&r.op_timeout_s, "op_timeout_s", 1, 300, RBD_OP_TIMEOUT_S)?;
    let b = RbdBackend {
        pool,
        image,
        rados_namespace,
        ceph_conf,
        user,
        keyring,
        write_cache,
        op_timeout_s,
        // Set from `[gateway]` once the whole conf is read.
        gateway_group: None,
        take_over_group: r.take_over_group.as_ref().is_some_and(|v| *v.get_ref()),
    };
    let key = (
        b.ceph_conf.clone(),
        b.pool.clone(),
        b.rados_namespace.clone().unwrap_or_default(),
        b.image.clone(),
    );
    claim_backend(
        images,
        key,
        nqn,
        nsid,
        cx.line(&r.image.span()),
        &format!("RBD image {}", b.spec()),
        "an image",
    )
    .map_err(|m| cx.at(r.image.span(), m.to_string()))?;
    Ok(b)
}
