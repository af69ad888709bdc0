//! A control-socket client: what `pollux ctl` and `pollux top` use.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::ControlError;

/// A connection to a control socket.
#[derive(Debug)]
pub struct Client {
    r: BufReader<UnixStream>,
    w: UnixStream,
    next_id: u64,
}

impl Client {
    /// Connect to the socket at `path`.
    pub fn connect(path: &Path) -> Result<Self, ControlError> {
        let s = UnixStream::connect(path).map_err(|source| ControlError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.set_write_timeout(Some(Duration::from_secs(10)))?;
        let w = s.try_clone()?;
        Ok(Self {
            r: BufReader::new(s),
            w,
            next_id: 1,
        })
    }

    /// Wait up to `d` for each answer (an upgrade may take longer than the 10 s default).
    pub fn set_timeout(&mut self, d: Duration) -> Result<(), ControlError> {
        self.w.set_read_timeout(Some(d))?;
        Ok(())
    }

    /// Call `method` with `params` (an object, an array or null); its result.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, ControlError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut req = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if !params.is_null() {
            req["params"] = params;
        }
        let mut line = req.to_string();
        line.push('\n');
        self.w.write_all(line.as_bytes())?;
        let mut resp = String::new();
        if self.r.read_line(&mut resp)? == 0 {
            return Err(ControlError::Protocol(
                "the server closed the connection without answering".into(),
            ));
        }
        let v: Value =
            serde_json::from_str(&resp).map_err(|e| ControlError::Protocol(format!("response is not JSON: {e}")))?;
        if v.get("id") != Some(&json!(id)) {
            return Err(ControlError::Protocol(format!("response to another request: {resp}")));
        }
        if let Some(e) = v.get("error") {
            return Err(ControlError::Rpc {
                code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: e.get("message").and_then(Value::as_str).unwrap_or("").to_string(),
            });
        }
        v.get("result")
            .cloned()
            .ok_or_else(|| ControlError::Protocol("response has neither result nor error".into()))
    }

    /// Call `method` and decode its result as `T`.
    pub fn call_as<T: serde::de::DeserializeOwned>(&mut self, method: &str, params: Value) -> Result<T, ControlError> {
        let v = self.call(method, params)?;
        serde_json::from_value(v).map_err(|e| ControlError::Protocol(format!("unexpected {method} result: {e}")))
    }
}
