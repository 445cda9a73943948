//! JSON between SPDK and Rust: RPC parameters (`struct spdk_json_val`, SPDK's parsed
//! token array) become a [`serde_json::Value`]; answers and `config_json` entries are
//! written with `spdk_json_write_val_raw`. [`RpcRequest`] is a pending
//! `spdk_jsonrpc_request` that must be answered exactly once, from any thread (the
//! answer is posted to the thread that received the request). [`RpcParams`] decodes an
//! RPC's parameter object with errors that name the method and the field.

use std::ffi::{c_char, CString};
use std::ptr::NonNull;

use serde_json::{Map, Number, Value};

use super::sys;
use super::thread::SpdkThread;

/// JSON-RPC "invalid params" (SPDK's `SPDK_JSONRPC_ERROR_INVALID_PARAMS`).
pub const INVALID_PARAMS: i32 = -32602;
/// JSON-RPC "internal error" (`SPDK_JSONRPC_ERROR_INTERNAL_ERROR`).
pub const INTERNAL_ERROR: i32 = -32603;

/// Converts SPDK's parsed parameters to a JSON value (`Value::Null` for no params).
///
/// # Safety
/// `params` must be NULL or point to a parsed value as SPDK hands it to an RPC handler
/// (for objects and arrays, followed by their `len` contained values and the end token),
/// valid for the duration of the call.
pub unsafe fn params_to_value(params: *const sys::spdk_json_val) -> Value {
    if params.is_null() {
        return Value::Null;
    }
    // SAFETY: per the contract the whole token run is readable.
    unsafe { convert(params).0 }
}

/// Converts the value at `v`; returns it and the number of tokens it used.
///
/// # Safety
/// As [`params_to_value`].
unsafe fn convert(v: *const sys::spdk_json_val) -> (Value, usize) {
    // SAFETY: the caller guarantees `v` is a readable token.
    let tok = unsafe { &*v };
    let text = || -> &[u8] {
        if tok.start.is_null() {
            &[]
        } else {
            // SAFETY: string, name and number tokens point at `len` bytes of the input.
            unsafe { std::slice::from_raw_parts(tok.start.cast::<u8>(), tok.len as usize) }
        }
    };
    match tok.type_ {
        sys::spdk_json_val_type_SPDK_JSON_VAL_NULL => (Value::Null, 1),
        sys::spdk_json_val_type_SPDK_JSON_VAL_TRUE => (Value::Bool(true), 1),
        sys::spdk_json_val_type_SPDK_JSON_VAL_FALSE => (Value::Bool(false), 1),
        sys::spdk_json_val_type_SPDK_JSON_VAL_NUMBER => {
            let n = std::str::from_utf8(text())
                .ok()
                .and_then(|s| serde_json::from_str::<Number>(s).ok());
            (n.map_or(Value::Null, Value::Number), 1)
        }
        sys::spdk_json_val_type_SPDK_JSON_VAL_STRING
        | sys::spdk_json_val_type_SPDK_JSON_VAL_NAME => (
            Value::String(String::from_utf8_lossy(text()).into_owned()),
            1,
        ),
        sys::spdk_json_val_type_SPDK_JSON_VAL_ARRAY_BEGIN => {
            let inner = tok.len as usize;
            let mut out = Vec::new();
            let mut i = 1;
            while i <= inner {
                // SAFETY: `i` stays within the `len` contained tokens.
                let (val, used) = unsafe { convert(v.add(i)) };
                out.push(val);
                i += used;
            }
            (Value::Array(out), inner + 2)
        }
        sys::spdk_json_val_type_SPDK_JSON_VAL_OBJECT_BEGIN => {
            let inner = tok.len as usize;
            let mut out = Map::new();
            let mut i = 1;
            while i < inner {
                // SAFETY: a name token followed by its value, inside the object.
                let (name, _) = unsafe { convert(v.add(i)) };
                // SAFETY: as above.
                let (val, used) = unsafe { convert(v.add(i + 1)) };
                if let Value::String(k) = name {
                    out.insert(k, val);
                }
                i += 1 + used;
            }
            (Value::Object(out), inner + 2)
        }
        _ => (Value::Null, 1),
    }
}

/// Writes `value` into an SPDK JSON write context (as one value: in an array, after a
/// name, or at the top).
///
/// # Safety
/// `w` must be a live write context owned by the caller's current callback.
pub unsafe fn write_value(w: *mut sys::spdk_json_write_ctx, value: &Value) {
    let s = value.to_string();
    // SAFETY: `w` is live per the contract; the bytes are valid JSON and are copied.
    unsafe {
        sys::spdk_json_write_val_raw(w, s.as_ptr().cast(), s.len());
    }
}

/// A JSON-RPC request waiting for its answer. Answer it exactly once with
/// [`ok`](Self::ok) or [`error`](Self::error); the answer is written on the thread that
/// received the request.
#[derive(Debug)]
pub struct RpcRequest {
    req: NonNull<sys::spdk_jsonrpc_request>,
    thread: Option<SpdkThread>,
}

// SAFETY: the request is only touched on `thread` (answers are posted there).
unsafe impl Send for RpcRequest {}

impl RpcRequest {
    /// Wraps the request handed to an RPC handler, on the handler's thread.
    ///
    /// # Safety
    /// `req` must be the live request of the running handler, answered only through the
    /// returned value.
    pub unsafe fn from_raw(req: *mut sys::spdk_jsonrpc_request) -> Option<RpcRequest> {
        Some(RpcRequest {
            req: NonNull::new(req)?,
            thread: SpdkThread::current(),
        })
    }

    /// Answers with `result`.
    pub fn ok(self, result: Value) {
        self.answer(move |req| {
            // SAFETY: the live, unanswered request, on its own thread.
            let w = unsafe { sys::spdk_jsonrpc_begin_result(req) };
            if !w.is_null() {
                // SAFETY: `w` is the result context just begun; ended right after.
                unsafe {
                    write_value(w, &result);
                    sys::spdk_jsonrpc_end_result(req, w);
                }
            }
        });
    }

    /// Answers with a JSON-RPC error.
    pub fn error(self, code: i32, message: &str) {
        let msg = CString::new(message.replace('\0', " ")).unwrap_or_default();
        self.answer(move |req| {
            // SAFETY: the live, unanswered request; SPDK copies the message.
            unsafe {
                sys::spdk_jsonrpc_send_error_response(req, code, msg.as_ptr().cast::<c_char>())
            };
        });
    }

    /// Answers "invalid params" with `message` (which names the field).
    pub fn invalid(self, message: &str) {
        self.error(INVALID_PARAMS, message);
    }

    fn answer<F: FnOnce(*mut sys::spdk_jsonrpc_request) + Send + 'static>(self, f: F) {
        let req = self.req.as_ptr() as usize;
        match self.thread {
            Some(t) if !t.is_current() => {
                if let Err(e) = t.send(move || f(req as *mut sys::spdk_jsonrpc_request)) {
                    tracing::error!("rtrs rpc: could not post the answer to the RPC thread: {e}");
                }
            }
            _ => f(req as *mut sys::spdk_jsonrpc_request),
        }
    }
}

/// Typed access to an RPC's parameter object; every error names the field.
pub struct RpcParams<'a> {
    method: &'static str,
    obj: Option<&'a serde_json::Map<String, Value>>,
}

impl<'a> RpcParams<'a> {
    /// The parameters of `method`; `null` counts as an empty object.
    ///
    /// # Errors
    /// A message saying the params must be an object.
    pub fn new(method: &'static str, v: &'a Value) -> Result<RpcParams<'a>, String> {
        match v {
            Value::Null => Ok(RpcParams { method, obj: None }),
            Value::Object(m) => Ok(RpcParams {
                method,
                obj: Some(m),
            }),
            _ => Err(format!("{method}: params must be a JSON object")),
        }
    }

    /// Refuses names outside `known`.
    ///
    /// # Errors
    /// A message naming the unknown field.
    pub fn only(&self, known: &[&str]) -> Result<(), String> {
        if let Some(m) = self.obj {
            if let Some(k) = m.keys().find(|k| !known.contains(&k.as_str())) {
                return Err(format!(
                    "{}: unknown parameter '{k}' (known: {})",
                    self.method,
                    known.join(", ")
                ));
            }
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        self.obj.and_then(|m| m.get(name)).filter(|v| !v.is_null())
    }

    /// A string field, if present.
    ///
    /// # Errors
    /// When present but not a string.
    pub fn opt_str(&self, name: &str) -> Result<Option<&'a str>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(format!(
                "{}: '{name}' must be a string, got {v}",
                self.method
            )),
        }
    }

    /// A required string field.
    ///
    /// # Errors
    /// Missing or not a string.
    pub fn str(&self, name: &str) -> Result<&'a str, String> {
        self.opt_str(name)?
            .ok_or_else(|| format!("{}: missing required parameter '{name}'", self.method))
    }

    /// An unsigned integer field within `0..=max`, if present.
    ///
    /// # Errors
    /// Not a non-negative integer, or above `max`.
    pub fn opt_uint(&self, name: &str, max: u64) -> Result<Option<u64>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= max => Ok(Some(n)),
                Some(n) => Err(format!("{}: '{name}' = {n} is above {max}", self.method)),
                None => Err(format!(
                    "{}: '{name}' must be a non-negative integer, got {v}",
                    self.method
                )),
            },
        }
    }

    /// A boolean field, if present.
    ///
    /// # Errors
    /// When present but not a boolean.
    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(format!(
                "{}: '{name}' must be true or false, got {v}",
                self.method
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tok(kind: sys::spdk_json_val_type, text: &'static str, len: u32) -> sys::spdk_json_val {
        sys::spdk_json_val {
            start: text.as_ptr().cast_mut().cast(),
            len: if text.is_empty() {
                len
            } else {
                text.len() as u32
            },
            type_: kind,
        }
    }

    #[test]
    fn parsed_tokens_to_value() {
        use sys::*;
        // {"a": 12, "b": [true, "x"], "c": null, "d": {}}
        let toks = [
            tok(spdk_json_val_type_SPDK_JSON_VAL_OBJECT_BEGIN, "", 11),
            tok(spdk_json_val_type_SPDK_JSON_VAL_NAME, "a", 0),
            tok(spdk_json_val_type_SPDK_JSON_VAL_NUMBER, "12", 0),
            tok(spdk_json_val_type_SPDK_JSON_VAL_NAME, "b", 0),
            tok(spdk_json_val_type_SPDK_JSON_VAL_ARRAY_BEGIN, "", 2),
            tok(spdk_json_val_type_SPDK_JSON_VAL_TRUE, "", 0),
            tok(spdk_json_val_type_SPDK_JSON_VAL_STRING, "x", 0),
            tok(spdk_json_val_type_SPDK_JSON_VAL_ARRAY_END, "", 0),
            tok(spdk_json_val_type_SPDK_JSON_VAL_NAME, "c", 0),
            tok(spdk_json_val_type_SPDK_JSON_VAL_NULL, "", 0),
            tok(spdk_json_val_type_SPDK_JSON_VAL_NAME, "d", 0),
            tok(spdk_json_val_type_SPDK_JSON_VAL_OBJECT_BEGIN, "", 0),
            tok(spdk_json_val_type_SPDK_JSON_VAL_OBJECT_END, "", 0),
            tok(spdk_json_val_type_SPDK_JSON_VAL_OBJECT_END, "", 0),
        ];
        // SAFETY: a well-formed token run, as SPDK's parser produces.
        let v = unsafe { params_to_value(toks.as_ptr()) };
        assert_eq!(v, json!({"a": 12, "b": [true, "x"], "c": null, "d": {}}));
        // SAFETY: NULL means no params.
        assert_eq!(unsafe { params_to_value(std::ptr::null()) }, Value::Null);
    }

    #[test]
    fn params_name_the_field() {
        let v = json!({"name": "x", "n": 70000, "b": 1, "s": 3});
        let p = RpcParams::new("m", &v).unwrap();
        assert_eq!(p.str("name").unwrap(), "x");
        assert_eq!(p.opt_str("none").unwrap(), None);
        assert_eq!(
            p.str("none").unwrap_err(),
            "m: missing required parameter 'none'"
        );
        assert_eq!(
            p.opt_str("s").unwrap_err(),
            "m: 's' must be a string, got 3"
        );
        assert_eq!(
            p.opt_uint("n", 65535).unwrap_err(),
            "m: 'n' = 70000 is above 65535"
        );
        assert_eq!(p.opt_uint("n", 100_000).unwrap(), Some(70000));
        assert_eq!(
            p.opt_uint("name", 9).unwrap_err(),
            "m: 'name' must be a non-negative integer, got \"x\""
        );
        assert_eq!(
            p.opt_bool("b").unwrap_err(),
            "m: 'b' must be true or false, got 1"
        );
        assert_eq!(
            p.only(&["name", "n", "b"]).unwrap_err(),
            "m: unknown parameter 's' (known: name, n, b)"
        );
        assert!(RpcParams::new("m", &json!(null)).unwrap().only(&[]).is_ok());
        assert_eq!(
            RpcParams::new("m", &json!([1])).err().unwrap(),
            "m: params must be a JSON object"
        );
    }
}
