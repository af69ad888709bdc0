//! The parsing context [`Cx`]: error positions, and the checks and
//! conversions of single values (integers, sizes, floats, paths) shared by
//! every section.

use std::cell::OnceCell;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use toml::Spanned;

use super::Base;
use crate::error::ConfError;
use crate::raw::RawSize;
use crate::size::parse_size;

/// Parsing context: the text (to turn spans into lines), its origin, and
/// the base of relative paths.
pub(super) struct Cx<'a> {
    pub(super) text: &'a str,
    pub(super) origin: &'a str,
    pub(super) base: Base<'a>,
    /// The byte offset of every line's start, built at the first [`Cx::line`]: a conf
    /// notes the line of every nsid, NQN and backend it has seen (for the messages of a
    /// later duplicate), and counting newlines from the start of the text each time made
    /// validation quadratic (16,384 namespaces: 5.5 s).
    line_starts: OnceCell<Vec<usize>>,
}

impl<'a> Cx<'a> {
    pub(super) fn new(text: &'a str, origin: &'a str, base: Base<'a>) -> Self {
        Self {
            text,
            origin,
            base,
            line_starts: OnceCell::new(),
        }
    }
}

impl Cx<'_> {
    pub(super) fn at(&self, span: Range<usize>, message: String) -> ConfError {
        ConfError::at(self.origin, self.text, span, message)
    }

    pub(super) fn nowhere(&self, message: String) -> ConfError {
        ConfError::nowhere(self.origin, message)
    }

    /// The 1-based line holding byte `span.start`: a binary search of the line starts.
    pub(super) fn line(&self, span: &Range<usize>) -> usize {
        let starts = self.line_starts.get_or_init(|| {
            std::iter::once(0)
                .chain(self.text.match_indices('\n').map(|(i, _)| i + 1))
                .collect()
        });
        // The number of lines starting at or before the offset.
        starts.partition_point(|&s| s <= span.start.min(self.text.len()))
    }

    /// An integer in `lo..=hi`.
    pub(super) fn int(&self, v: &Spanned<i64>, key: &str, lo: i64, hi: i64) -> Result<i64, ConfError> {
        let n = *v.get_ref();
        if (lo..=hi).contains(&n) {
            Ok(n)
        } else {
            Err(self.at(v.span(), format!("`{key}` must be between {lo} and {hi}, got {n}")))
        }
    }

    /// An optional integer in `lo..=hi` that fits `u32`, or `default`.
    pub(super) fn u32_or(
        &self,
        v: &Option<Spanned<i64>>,
        key: &str,
        lo: i64,
        hi: i64,
        default: u32,
    ) -> Result<u32, ConfError> {
        match v {
            None => Ok(default),
            Some(v) => {
                let n = self.int(v, key, lo, hi.min(i64::from(u32::MAX)))?;
                u32::try_from(n).map_err(|_| self.at(v.span(), format!("`{key}` is out of range")))
            }
        }
    }

    /// An optional integer in `lo..=hi` that fits `u32`.
    pub(super) fn u32_opt(
        &self,
        v: &Option<Spanned<i64>>,
        key: &str,
        lo: i64,
        hi: i64,
    ) -> Result<Option<u32>, ConfError> {
        v.as_ref().map(|_| self.u32_or(v, key, lo, hi, 0)).transpose()
    }

    /// A size in bytes.
    pub(super) fn size(&self, v: &Spanned<RawSize>, key: &str) -> Result<u64, ConfError> {
        match v.get_ref() {
            RawSize::Int(n) => {
                u64::try_from(*n).map_err(|_| self.at(v.span(), format!("`{key}` must not be negative, got {n}")))
            }
            RawSize::Text(s) => parse_size(s).map_err(|e| self.at(v.span(), format!("invalid `{key}`: {e}"))),
        }
    }

    /// An optional transport byte count fitting `u32`, checked by `rule`
    /// (which returns the reason it fails), or `default`.
    pub(super) fn transport_bytes(
        &self,
        v: &Option<Spanned<RawSize>>,
        key: &str,
        default: u32,
        rule: impl Fn(u64) -> Option<String>,
    ) -> Result<u32, ConfError> {
        let Some(v) = v else { return Ok(default) };
        let n = self.size(v, key)?;
        if let Some(why) = rule(n) {
            return Err(self.at(v.span(), format!("`{key}` {why}, got {n}")));
        }
        u32::try_from(n).map_err(|_| self.at(v.span(), format!("`{key}` must be at most {}, got {n}", u32::MAX)))
    }

    /// A finite float, checked by `rule` (which returns the reason it
    /// fails).
    pub(super) fn float(
        &self,
        v: &Spanned<f64>,
        key: &str,
        rule: impl Fn(f64) -> Option<&'static str>,
    ) -> Result<f64, ConfError> {
        let x = *v.get_ref();
        if !x.is_finite() {
            return Err(self.at(v.span(), format!("`{key}` must be a finite number, got {x}")));
        }
        match rule(x) {
            Some(why) => Err(self.at(v.span(), format!("`{key}` {why}, got {x}"))),
            None => Ok(x),
        }
    }

    /// An optional finite float checked by `rule`, or `default`.
    pub(super) fn float_or(
        &self,
        v: &Option<Spanned<f64>>,
        key: &str,
        default: f64,
        rule: impl Fn(f64) -> Option<&'static str>,
    ) -> Result<f64, ConfError> {
        match v {
            None => Ok(default),
            Some(v) => self.float(v, key, rule),
        }
    }

    /// A path, made absolute: a relative one is joined to the directory of
    /// the configuration file (or the current directory), and `.`
    /// components are dropped. `..` is kept: it cannot be removed without
    /// following symbolic links.
    pub(super) fn path(&self, v: &Spanned<String>, key: &str) -> Result<PathBuf, ConfError> {
        let s = v.get_ref();
        if s.is_empty() {
            return Err(self.at(v.span(), format!("`{key}` must not be empty")));
        }
        if s.contains('\0') {
            return Err(self.at(v.span(), format!("`{key}` {s:?} must not contain a NUL character")));
        }
        let p = Path::new(s);
        let full = if p.is_absolute() {
            p.to_path_buf()
        } else {
            let dir = match self.base {
                Base::CurrentDir => Path::new(""),
                Base::DirOf(file) | Base::SavedAs(file) => file.parent().unwrap_or(Path::new("")),
            };
            let dir = if dir.is_absolute() {
                dir.to_path_buf()
            } else {
                let cwd = std::env::current_dir().map_err(|e| {
                    self.at(
                        v.span(),
                        format!("cannot resolve the relative `{key}` {s:?}: the current directory is unknown: {e}"),
                    )
                })?;
                cwd.join(dir)
            };
            dir.join(p)
        };
        Ok(full.components().filter(|c| *c != Component::CurDir).collect())
    }
}

/// `rule` for [`Cx::float`]: zero or more.
pub(super) fn non_negative(x: f64) -> Option<&'static str> {
    (x < 0.0).then_some("must not be negative")
}

/// `rule` for [`Cx::float`]: more than zero.
pub(super) fn positive(x: f64) -> Option<&'static str> {
    (x <= 0.0).then_some("must be greater than 0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::line_col;

    #[test]
    fn line_agrees_with_the_error_positions_everywhere() {
        let text = "a = 1\n\n[t]\né = \"x\"\nlast";
        let cx = Cx::new(text, "t.toml", Base::CurrentDir);
        for offset in 0..=text.len() + 3 {
            assert_eq!(cx.line(&(offset..offset)), line_col(text, offset).0, "offset {offset}");
        }
        let empty = Cx::new("", "e.toml", Base::CurrentDir);
        assert_eq!(empty.line(&(5..6)), 1);
    }
}
