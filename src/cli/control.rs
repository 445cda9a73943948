//! `rtrs-target`'s control socket: the target-side controls the kernel's server has in
//! sysfs (`rnbd-server/devices/<dev>/sessions/`, `force_close`, `rtrs-server/.../
//! disconnect`) and the SPDK target has as RPCs, for a target that has neither. A Unix
//! socket made by the target (`--control-socket PATH`, mode 0600: the file's owner is
//! who may steer the target), one JSON request per connection, one JSON answer:
//!
//! ```text
//! -> {"method": "force_close", "params": {"export_name": "vol", "sessname": "host1"}}
//! <- {"result": [{"export": "vol", "sessname": "host1", ...}]}   or   {"error": "..."}
//! ```
//!
//! Methods: `get_openers {export_name?}`, `force_close {export_name, sessname}`,
//! `disconnect {sessname, path?}`, `get_sessions {}` (the servers' statistics). The
//! answers are [`TargetControl`]'s, the same the SPDK target's RPCs give.
//! `rtrs-target ctl` ([`request`]) is the client. A thread of its own serves the socket:
//! nothing here runs on a reactor.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};

use crate::rnbd::server::TargetControl;
use crate::server::Server;

/// Longest request accepted (bytes).
const MAX_REQUEST: u64 = 64 * 1024;
/// How long a connection may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the serving thread looks at its stop flag while idle.
const IDLE_POLL: Duration = Duration::from_millis(20);

/// A serving control socket; dropping it stops the thread and removes the socket file.
pub struct ControlSocket {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlSocket {
    /// Binds `path` (mode 0600) and serves it from a thread of its own. `servers` are the
    /// target's servers with their fabric names, for `get_sessions`.
    ///
    /// # Errors
    /// A path where another target answers, or one that is not a socket; the failing
    /// bind or chmod.
    pub fn serve(
        path: &Path,
        control: TargetControl,
        servers: Vec<(&'static str, Server)>,
    ) -> Result<ControlSocket, String> {
        let shown = path.display();
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(format!(
                    "--control-socket {shown}: exists and is not a socket"
                ));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(format!(
                    "--control-socket {shown}: another process serves it (a running target?)"
                ));
            }
            // A socket nobody serves: left behind by a target that died.
            std::fs::remove_file(path)
                .map_err(|e| format!("--control-socket {shown}: removing the stale socket: {e}"))?;
        }
        let listener =
            UnixListener::bind(path).map_err(|e| format!("--control-socket {shown}: bind: {e}"))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("--control-socket {shown}: chmod 0600: {e}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("--control-socket {shown}: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("rtrs-target-ctl".into())
            .spawn(move || run(&listener, &control, &servers, &flag))
            .map_err(|e| format!("--control-socket {shown}: starting its thread: {e}"))?;
        Ok(ControlSocket {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn run(
    listener: &UnixListener,
    control: &TargetControl,
    servers: &[(&'static str, Server)],
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = serve_one(stream, control, servers) {
                    tracing::warn!("control socket: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(IDLE_POLL),
            Err(e) => {
                tracing::warn!("control socket: accept: {e}");
                std::thread::sleep(IDLE_POLL);
            }
        }
    }
}

fn serve_one(
    stream: UnixStream,
    control: &TargetControl,
    servers: &[(&'static str, Server)],
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST)).read_line(&mut line)?;
    let answer = match serde_json::from_str::<Value>(&line) {
        Ok(req) => match handle(control, servers, &req) {
            Ok(v) => json!({ "result": v }),
            Err(e) => json!({ "error": e }),
        },
        Err(e) => json!({ "error": format!("the request is not JSON: {e}") }),
    };
    let mut out = serde_json::to_string(&answer).unwrap_or_else(|_| "{}".into());
    out.push('\n');
    (&stream).write_all(out.as_bytes())
}

/// One request's answer; an error names the field.
fn handle(
    control: &TargetControl,
    servers: &[(&'static str, Server)],
    req: &Value,
) -> Result<Value, String> {
    let method = req
        .get("method")
        .and_then(Value::as_str)
        .ok_or("missing 'method'")?;
    let empty = json!({});
    let params = req.get("params").unwrap_or(&empty);
    let known: &[&str] = match method {
        "get_openers" => &["export_name"],
        "force_close" => &["export_name", "sessname"],
        "disconnect" => &["sessname", "path"],
        "get_sessions" => &[],
        other => {
            return Err(format!(
                "unknown method {other:?} (get_openers, force_close, disconnect, get_sessions)"
            ))
        }
    };
    let obj = params
        .as_object()
        .ok_or_else(|| format!("{method}: 'params' must be an object"))?;
    if let Some(k) = obj.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(format!("{method}: unknown parameter '{k}'"));
    }
    let opt = |k: &str| -> Result<Option<&str>, String> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(x) => Err(format!("{method}: '{k}' must be a string, got {x}")),
        }
    };
    let req_str = |k: &str| -> Result<&str, String> {
        opt(k)?.ok_or_else(|| format!("{method}: missing required parameter '{k}'"))
    };
    let err = |e: crate::rnbd::server::ControlError| format!("{method}: {e}");
    let v = match method {
        "get_openers" => json!(control.openers(opt("export_name")?).map_err(err)?),
        "force_close" => json!(control
            .force_close(req_str("export_name")?, req_str("sessname")?)
            .map_err(err)?),
        "disconnect" => json!(control
            .disconnect(req_str("sessname")?, opt("path")?)
            .map_err(err)?),
        _ => Value::Array(
            servers
                .iter()
                .map(|(t, s)| json!({ "transport": t, "sessions": s.stats().sessions }))
                .collect(),
        ),
    };
    Ok(v)
}

/// Sends one request to the control socket at `path` and returns its result.
///
/// # Errors
/// The socket cannot be reached, or the target's error message.
pub fn request(path: &Path, method: &str, params: Value) -> Result<Value, String> {
    let mut s =
        UnixStream::connect(path).map_err(|e| format!("control socket {}: {e}", path.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let mut req = json!({ "method": method, "params": params }).to_string();
    req.push('\n');
    s.write_all(req.as_bytes())
        .map_err(|e| format!("control socket {}: {e}", path.display()))?;
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .map_err(|e| format!("control socket {}: {e}", path.display()))?;
    let answer: Value = serde_json::from_str(&line)
        .map_err(|e| format!("control socket {}: bad answer: {e}", path.display()))?;
    match (answer.get("result"), answer.get("error")) {
        (_, Some(e)) => Err(e.as_str().unwrap_or("error").to_string()),
        (Some(r), None) => Ok(r.clone()),
        (None, None) => Err(format!(
            "control socket {}: an answer without result",
            path.display()
        )),
    }
}
