//! The crate's single error type.

use std::ops::Range;
use std::sync::Arc;

/// An error loading, parsing or validating a configuration.
///
/// Every error names the configuration's origin (a file name, or
/// `"<embedded>"`). When the error can be tied to a place in the text (a
/// syntax error, an unknown key, a wrong type, or a value that fails a
/// semantic check) it also carries the 1-based line and column of that place,
/// and `Display` renders `FILE:LINE:COL: message`; otherwise it renders
/// `FILE: message`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{origin}{}: {message}", fmt_pos(.pos))]
pub struct ConfError {
    origin: String,
    pos: Option<(usize, usize)>,
    span: Option<Range<usize>>,
    message: String,
    #[source]
    source: Option<Arc<std::io::Error>>,
}

fn fmt_pos(pos: &Option<(usize, usize)>) -> String {
    match pos {
        Some((line, col)) => format!(":{line}:{col}"),
        None => String::new(),
    }
}

impl ConfError {
    /// An error tied to the byte range `span` of `text`.
    pub(crate) fn at(origin: &str, text: &str, span: Range<usize>, message: String) -> Self {
        let (line, col) = line_col(text, span.start);
        ConfError {
            origin: origin.to_owned(),
            pos: Some((line, col)),
            span: Some(span),
            message,
            source: None,
        }
    }

    /// An error with no position in the text.
    pub(crate) fn nowhere(origin: &str, message: String) -> Self {
        ConfError {
            origin: origin.to_owned(),
            pos: None,
            span: None,
            message,
            source: None,
        }
    }

    /// An I/O error reading `origin`.
    pub(crate) fn io(origin: &str, err: std::io::Error) -> Self {
        ConfError {
            origin: origin.to_owned(),
            pos: None,
            span: None,
            message: format!("cannot read configuration: {err}"),
            source: Some(Arc::new(err)),
        }
    }

    /// The file name the configuration came from, or `"<embedded>"`.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The 1-based line of the offending text, when known.
    pub fn line(&self) -> Option<usize> {
        self.pos.map(|(line, _)| line)
    }

    /// The 1-based column (counted in characters) of the offending text, when
    /// known.
    pub fn column(&self) -> Option<usize> {
        self.pos.map(|(_, col)| col)
    }

    /// The byte range of the offending text, when known.
    pub fn span(&self) -> Option<Range<usize>> {
        self.span.clone()
    }

    /// The message alone, without the origin and position prefix.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The kind of the underlying I/O error, when reading the file failed.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        self.source.as_ref().map(|e| e.kind())
    }
}

/// The 1-based (line, column) of byte `offset` in `text`. Columns count
/// characters, not bytes, so they match what an editor shows for non-ASCII
/// text. Offsets past the end or inside a character are clamped, never
/// panicking.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_basics() {
        let t = "ab\ncd\né=x";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 1), (1, 2));
        assert_eq!(line_col(t, 3), (2, 1));
        assert_eq!(line_col(t, 8), (3, 2)); // after the two-byte 'é'
        assert_eq!(line_col(t, 7), (3, 1)); // inside 'é': clamped back
        assert_eq!(line_col(t, 1000), (3, 4));
        assert_eq!(line_col("", 5), (1, 1));
    }

    #[test]
    fn display_forms() {
        let e = ConfError::at("x.toml", "a\nbc", 3..4, "bad".into());
        assert_eq!(e.to_string(), "x.toml:2:2: bad");
        assert_eq!((e.line(), e.column()), (Some(2), Some(2)));
        let e = ConfError::nowhere("x.toml", "worse".into());
        assert_eq!(e.to_string(), "x.toml: worse");
        assert_eq!(e.line(), None);
    }
}
