//! The running conf as its author's TOML document: run-time changes edit it in place
//! (`toml_edit`), so that comments, order and what was left to defaults survive a `save`;
//! and a refusal of the edited document is put back in the terms of the change's params.

use serde_json::Value;
use toml_edit::{ArrayOfTables, DocumentMut, ImDocument, InlineTable, Item, Table, TableLike};

use super::{CONFIG_ERROR, RpcError};

/// One step of a path from the document's root to an item: a key, or an index into an
/// array (of tables or of values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    Key(String),
    Index(usize),
}

/// The document of the running conf.
pub(super) fn parse(text: &str) -> Result<DocumentMut, RpcError> {
    text.parse::<DocumentMut>()
        .map_err(|e| RpcError::new(CONFIG_ERROR, format!("running conf does not parse: {e}")))
}

/// A JSON param as a TOML value (objects become inline tables).
pub(super) fn value(v: &Value, name: &str) -> Result<toml_edit::Value, RpcError> {
    Ok(match v {
        Value::Null => return Err(RpcError::params(format!("param '{name}' is null"))),
        Value::Bool(b) => (*b).into(),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => i.into(),
            (None, Some(_)) if n.is_u64() => {
                return Err(RpcError::params(format!("param '{name}' = {n} is too large")));
            }
            (None, Some(f)) => f.into(),
            (None, None) => return Err(RpcError::params(format!("param '{name}' = {n} is not a number"))),
        },
        Value::String(s) => s.as_str().into(),
        Value::Array(a) => {
            let mut arr = toml_edit::Array::new();
            for (i, x) in a.iter().enumerate() {
                arr.push(value(x, &format!("{name}[{i}]"))?);
            }
            toml_edit::Value::Array(arr)
        }
        Value::Object(m) => {
            let mut t = InlineTable::new();
            for (k, x) in m {
                t.insert(k, value(x, &format!("{name}.{k}"))?);
            }
            toml_edit::Value::InlineTable(t)
        }
    })
}

/// A JSON object as a table of its own (`[[subsystem]]`), without the keys in `skip`:
/// arrays of objects under `namespace` become `[[...namespace]]` tables, as people write
/// them; other objects stay inline.
pub(super) fn table(obj: &Value, skip: &[&str], what: &str) -> Result<Table, RpcError> {
    let Some(m) = obj.as_object() else {
        return Err(RpcError::params(format!("'{what}' takes named params (a JSON object)")));
    };
    let mut t = Table::new();
    for (k, v) in m.iter().filter(|(k, _)| !skip.contains(&k.as_str())) {
        match (k.as_str(), v) {
            ("namespace", Value::Array(list)) if list.iter().all(Value::is_object) => {
                let mut aot = ArrayOfTables::new();
                for (i, n) in list.iter().enumerate() {
                    aot.push(table(n, &[], &format!("namespace[{i}]"))?);
                }
                t.insert(k, Item::ArrayOfTables(aot));
            }
            (_, Value::Null) => {}
            _ => {
                t.insert(k, Item::Value(value(v, k)?));
            }
        }
    }
    Ok(t)
}

/// The tables of array `key` under `parent` (`[[key]]` or `key = [{...}]`).
pub(super) fn tables_mut<'a>(parent: &'a mut dyn TableLike, key: &str) -> Vec<&'a mut dyn TableLike> {
    match parent.get_mut(key) {
        Some(Item::ArrayOfTables(a)) => a.iter_mut().map(|t| t as &mut dyn TableLike).collect(),
        Some(Item::Value(toml_edit::Value::Array(a))) => a
            .iter_mut()
            .filter_map(toml_edit::Value::as_inline_table_mut)
            .map(|t| t as &mut dyn TableLike)
            .collect(),
        _ => Vec::new(),
    }
}

/// The index and table of the first table of array `key` under `parent` for which `pred`
/// holds.
pub(super) fn find_mut<'a>(
    parent: &'a mut dyn TableLike,
    key: &str,
    pred: impl Fn(&dyn TableLike) -> bool,
) -> Option<(usize, &'a mut dyn TableLike)> {
    tables_mut(parent, key)
        .into_iter()
        .enumerate()
        .find(|(_, t)| pred(&**t))
}

/// Removes the tables of array `key` under `parent` for which `pred` holds (as
/// [`find_mut`] finds them); how many went.
pub(super) fn remove_where(parent: &mut dyn TableLike, key: &str, pred: impl Fn(&dyn TableLike) -> bool) -> usize {
    match parent.get_mut(key) {
        Some(Item::ArrayOfTables(a)) => {
            let before = a.len();
            a.retain(|t| !pred(t));
            before - a.len()
        }
        Some(Item::Value(toml_edit::Value::Array(a))) => {
            let before = a.len();
            a.retain(|v| !v.as_inline_table().is_some_and(|t| pred(t)));
            before - a.len()
        }
        _ => 0,
    }
}

/// Appends `t` to array `key` under `parent` (`[[key]]` unless the array is written inline,
/// or `parent` is itself inline); the new element's index.
pub(super) fn push_table(parent: &mut dyn TableLike, key: &str, t: Table) -> Result<usize, RpcError> {
    match parent.get_mut(key) {
        Some(Item::ArrayOfTables(a)) => {
            a.push(t);
            Ok(a.len() - 1)
        }
        Some(Item::Value(toml_edit::Value::Array(a))) => {
            a.push(t.into_inline_table());
            Ok(a.len() - 1)
        }
        Some(_) => Err(RpcError::new(
            CONFIG_ERROR,
            format!("running conf: '{key}' is not an array of tables"),
        )),
        None => {
            // An inline parent takes the array inline (`Item::into_value` converts it).
            let mut a = ArrayOfTables::new();
            a.push(t);
            parent.insert(key, Item::ArrayOfTables(a));
            Ok(0)
        }
    }
}

/// Appends value `v` to array `key` under `parent`; its index.
pub(super) fn push_value(parent: &mut dyn TableLike, key: &str, v: toml_edit::Value) -> Result<usize, RpcError> {
    match parent.get_mut(key) {
        None => {
            let mut arr = toml_edit::Array::new();
            arr.push(v);
            parent.insert(key, Item::Value(toml_edit::Value::Array(arr)));
            Ok(0)
        }
        Some(Item::Value(toml_edit::Value::Array(a))) => {
            a.push(v);
            Ok(a.len() - 1)
        }
        Some(Item::ArrayOfTables(a)) => match v {
            toml_edit::Value::InlineTable(t) => {
                a.push(t.into_table());
                Ok(a.len() - 1)
            }
            _ => Err(RpcError::new(
                CONFIG_ERROR,
                format!("running conf: '{key}' is an array of tables"),
            )),
        },
        Some(_) => Err(RpcError::new(
            CONFIG_ERROR,
            format!("running conf: '{key}' is not an array"),
        )),
    }
}

/// A string value of a table-like item.
pub(super) fn str_of<'a>(t: &'a dyn TableLike, key: &str) -> Option<&'a str> {
    t.get(key).and_then(Item::as_str)
}

/// An integer value of a table-like item.
pub(super) fn int_of(t: &dyn TableLike, key: &str) -> Option<i64> {
    t.get(key).and_then(Item::as_integer)
}

/// Where in a change's params a refusal of the edited document points: the dotted path of
/// the param under `edited` (the item the change wrote) that holds byte `at` of `text`, and
/// that param's value as written. None: the refusal is about some other part of the conf.
pub(super) fn param_at(text: &str, edited: &[Step], at: usize) -> Option<(String, String)> {
    let doc = ImDocument::parse(text).ok()?;
    let mut path: Vec<String> = Vec::new();
    let mut cur: Item = locate(doc.as_item(), edited)?;
    while let Some(t) = cur.as_table_like() {
        let hit = |r: Option<std::ops::Range<usize>>| r.is_some_and(|r| r.start <= at && at < r.end.max(r.start + 1));
        let next = t.iter().find_map(|(k, v)| {
            let key_span = t.key(k).and_then(toml_edit::Key::span);
            (hit(v.span()) || hit(key_span) || hit(value_span(v))).then(|| (k.to_string(), v.clone()))
        });
        match next {
            Some((k, v)) => {
                path.push(k);
                cur = v;
            }
            None => break,
        }
    }
    if path.is_empty() {
        return None;
    }
    let shown = match &cur {
        Item::Value(v) => v.to_string().trim().to_string(),
        _ => String::new(),
    };
    Some((path.join("."), shown))
}

fn value_span(i: &Item) -> Option<std::ops::Range<usize>> {
    i.as_value().and_then(toml_edit::Value::span)
}

/// The item at `path` under `root`, cloned.
fn locate(root: &Item, path: &[Step]) -> Option<Item> {
    let mut cur = root.clone();
    for s in path {
        cur = match s {
            Step::Key(k) => cur.as_table_like()?.get(k)?.clone(),
            Step::Index(n) => match &cur {
                Item::ArrayOfTables(a) => Item::Table(a.get(*n)?.clone()),
                Item::Value(toml_edit::Value::Array(a)) => Item::Value(a.get(*n)?.clone()),
                _ => return None,
            },
        };
    }
    Some(cur)
}
