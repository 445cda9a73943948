//! Parameters of the `bdev_rtrs_*` RPCs, decoded from JSON with errors that name the
//! field, and turned back into JSON for `config_json` (so `save_config` replays
//! `bdev_rtrs_create`). The kernel's counterpart is the `map_device` sysfs string that
//! `rnbd-clt` parses (`sessname=`, `path=`, `device_path=`, `access_mode=`, ...).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use rtrs_spdk::client::{check_sessname, ClientConfig, HbConfig, MpPolicy, PathAddr};
use rtrs_spdk::fabric::Psk;
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::client::{check_dev_name, WriteZeroesMode};
use serde_json::{json, Map, Value};

use crate::rpc::RpcParams;
use crate::rpc::Transport;

/// RNBD's default port.
pub const DEFAULT_PORT: u16 = 1234;

/// A string field of `v`, if present (`null` counts as absent).
///
/// # Errors
/// When present but not a string.
pub fn opt_str<'v>(method: &str, v: &'v Value, name: &str) -> Result<Option<&'v str>, String> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(x) => Err(format!("{method}: '{name}' must be a string, got {x}")),
    }
}

/// A required string field of `v`.
///
/// # Errors
/// Missing or not a string.
pub fn req_str<'v>(method: &str, v: &'v Value, name: &str) -> Result<&'v str, String> {
    opt_str(method, v, name)?
        .ok_or_else(|| format!("{method}: missing required parameter '{name}'"))
}

/// One path as the RPC gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathParam {
    pub transport: Transport,
    pub addr: PathAddr,
    /// The name of the keyring key that authenticates the path (tcp), if any.
    pub psk: Option<String>,
}

impl PathParam {
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if let Some(src) = self.addr.src {
            m.insert("src_addr".into(), json!(src.ip().to_string()));
        }
        m.insert("dst_addr".into(), json!(self.addr.dst.ip().to_string()));
        m.insert("port".into(), json!(self.addr.dst.port()));
        m.insert("transport".into(), json!(self.transport.as_str()));
        // The key's name only: the key stays in the keyring (saved by its module).
        if let Some(k) = &self.psk {
            m.insert("psk".into(), json!(k));
        }
        Value::Object(m)
    }
}

/// `bdev_rtrs_create`'s parameters with their defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct CreateParams {
    pub name: String,
    pub sessname: String,
    pub paths: Vec<PathParam>,
    pub device: String,
    pub access_mode: AccessMode,
    pub mp_policy: MpPolicy,
    pub max_reconnect_attempts: i32,
    pub reconnect_delay_sec: u64,
    pub hb_interval_ms: u64,
    pub hb_missed_max: u32,
    /// How long IO waits for an unreachable device (the session's `io_wait_timeout`,
    /// which the library's RNBD client applies), and a reset for the IO to drain.
    pub io_timeout_sec: u64,
    /// How write-zeroes go to the target (`native` only for Linux 6.8+ or rtrs targets).
    pub write_zeroes: WriteZeroesMode,
    /// Seconds the session may have no path before its bdevs fail their IO and are
    /// unregistered (bdev_nvme's `ctrlr_loss_timeout_sec`); −1: never.
    pub loss_timeout_sec: i64,
}

/// `loss_timeout_sec` when not given: never (see plugin/README.md, "Losing a target").
pub const LOSS_TIMEOUT_DEFAULT: i64 = -1;
/// The largest `loss_timeout_sec` (a day, as `io_timeout_sec`).
pub const LOSS_TIMEOUT_MAX: i64 = 86_400;

/// The session settings that change at run time (`bdev_rtrs_set_session_options`), as
/// they are now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveSettings {
    pub max_reconnect_attempts: i32,
    pub reconnect_delay_sec: u64,
    pub loss_timeout_sec: i64,
}

impl LiveSettings {
    /// The loss timeout as the admin takes it.
    pub fn loss_timeout(&self) -> Option<Duration> {
        u64::try_from(self.loss_timeout_sec)
            .ok()
            .map(Duration::from_secs)
    }
}

/// `loss_timeout_sec`: −1 (never) or 0..=86400 seconds.
///
/// # Errors
/// A message naming the field.
pub fn parse_loss_timeout(method: &str, v: Option<&Value>) -> Result<Option<i64>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => match x.as_i64() {
            Some(n) if n == -1 || (0..=LOSS_TIMEOUT_MAX).contains(&n) => Ok(Some(n)),
            _ => Err(format!(
                "{method}: 'loss_timeout_sec' must be -1 (never) or 0..={LOSS_TIMEOUT_MAX} seconds, got {x}"
            )),
        },
    }
}

/// `max_reconnect_attempts`: −1 (for ever), 0 (never) or N.
///
/// # Errors
/// A message naming the field.
pub fn parse_reconnect_attempts(method: &str, v: Option<&Value>) -> Result<Option<i32>, String> {
    opt_i32(method, v, "max_reconnect_attempts")
}

const CREATE_FIELDS: &[&str] = &[
    "name",
    "sessname",
    "paths",
    "device",
    "access_mode",
    "mp_policy",
    "max_reconnect_attempts",
    "reconnect_delay_sec",
    "hb_interval_ms",
    "hb_missed_max",
    "io_timeout_sec",
    "write_zeroes",
    "loss_timeout_sec",
];

/// The RNBD name of an access mode, as the kernel's sysfs spells it.
pub fn access_name(m: AccessMode) -> &'static str {
    match m {
        AccessMode::ReadOnly => "ro",
        AccessMode::ReadWrite => "rw",
        AccessMode::Migration => "migration",
    }
}

fn parse_access(method: &str, field: &str, s: &str) -> Result<AccessMode, String> {
    match s {
        "ro" => Ok(AccessMode::ReadOnly),
        "rw" => Ok(AccessMode::ReadWrite),
        "migration" => Ok(AccessMode::Migration),
        _ => Err(format!(
            "{method}: '{field}' = {s:?} is not one of ro, rw, migration"
        )),
    }
}

/// A multipath policy by name (`round-robin`, `min-inflight`, `min-latency`).
///
/// # Errors
/// A message naming `field` and the accepted names.
pub fn parse_policy(method: &str, field: &str, s: &str) -> Result<MpPolicy, String> {
    s.parse::<MpPolicy>().map_err(|_| {
        format!("{method}: '{field}' = {s:?} is not one of round-robin, min-inflight, min-latency")
    })
}

fn parse_transport(method: &str, field: &str, s: &str) -> Result<Transport, String> {
    Transport::parse(s)
        .ok_or_else(|| format!("{method}: '{field}' = {s:?} is not one of tcp, rdma"))
}

fn parse_ip(method: &str, field: &str, s: &str) -> Result<IpAddr, String> {
    s.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .map_err(|_| format!("{method}: '{field}' = {s:?} is not an IPv4 or IPv6 address"))
}

fn parse_port(method: &str, field: &str, p: &RpcParams<'_>) -> Result<u16, String> {
    match p.opt_uint("port", u64::from(u16::MAX)) {
        Ok(Some(0)) => Err(format!("{method}: '{field}' must be 1..=65535, got 0")),
        Ok(Some(n)) => Ok(n as u16),
        Ok(None) => Ok(DEFAULT_PORT),
        Err(e) => Err(e.replace("'port'", &format!("'{field}'"))),
    }
}

/// One path object `{transport, dst_addr, port?, src_addr?, psk?}`; `prefix` names its
/// place (`paths[1].`) in error messages.
///
/// # Errors
/// A message naming the field.
pub fn parse_path(method: &'static str, prefix: &str, v: &Value) -> Result<PathParam, String> {
    if !v.is_object() {
        return Err(format!(
            "{method}: '{}' must be an object {{transport, dst_addr, port?, src_addr?, psk?}}, got {v}",
            prefix.trim_end_matches('.')
        ));
    }
    let p = RpcParams::new(method, v)?;
    p.only(&["transport", "dst_addr", "port", "src_addr", "psk"])
        .map_err(|e| format!("{e} (in '{}')", prefix.trim_end_matches('.')))?;
    let f = |name: &str| format!("{prefix}{name}");
    let transport = match opt_str(method, v, "transport")
        .map_err(|e| e.replace("'transport'", &format!("'{}'", f("transport"))))?
    {
        Some(t) => parse_transport(method, &f("transport"), t)?,
        None => Transport::Tcp,
    };
    let dst = req_str(method, v, "dst_addr")
        .map_err(|e| e.replace("'dst_addr'", &format!("'{}'", f("dst_addr"))))?;
    let dst = parse_ip(method, &f("dst_addr"), dst)?;
    let port = parse_port(method, &f("port"), &p)?;
    let src = match opt_str(method, v, "src_addr")
        .map_err(|e| e.replace("'src_addr'", &format!("'{}'", f("src_addr"))))?
    {
        Some(s) => Some(SocketAddr::new(parse_ip(method, &f("src_addr"), s)?, 0)),
        None => None,
    };
    let psk = match opt_str(method, v, "psk")
        .map_err(|e| e.replace("'psk'", &format!("'{}'", f("psk"))))?
    {
        Some("") => return Err(format!("{method}: '{}' must name a key, got \"\"", f("psk"))),
        Some(_) if transport != Transport::Tcp => {
            return Err(format!(
                "{method}: '{}' is supported on the tcp transport only (rdma paths cannot be authenticated)",
                f("psk")
            ))
        }
        Some(k) => Some(k.to_string()),
        None => None,
    };
    Ok(PathParam {
        transport,
        addr: PathAddr {
            src,
            dst: SocketAddr::new(dst, port),
        },
        psk,
    })
}

fn opt_i32(method: &str, v: Option<&Value>, field: &str) -> Result<Option<i32>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => match x.as_i64() {
            Some(n) if (-1..=i64::from(i32::MAX)).contains(&n) => Ok(Some(n as i32)),
            _ => Err(format!(
                "{method}: '{field}' must be an integer -1 (for ever), 0 (never) or N, got {x}"
            )),
        },
    }
}

fn positive(method: &str, field: &str, v: Option<u64>, default: u64) -> Result<u64, String> {
    match v {
        Some(0) => Err(format!("{method}: '{field}' must be at least 1, got 0")),
        Some(n) => Ok(n),
        None => Ok(default),
    }
}

impl CreateParams {
    /// Decodes `bdev_rtrs_create`'s parameters.
    ///
    /// # Errors
    /// A message naming the missing, unknown or bad field.
    pub fn decode(v: &Value) -> Result<CreateParams, String> {
        const M: &str = "bdev_rtrs_create";
        let p = RpcParams::new(M, v)?;
        p.only(CREATE_FIELDS)?;
        let name = req_str(M, v, "name")?.to_string();
        if name.is_empty() {
            return Err(format!("{M}: 'name' must not be empty"));
        }
        if name.contains('\0') {
            return Err(format!("{M}: 'name' = {name:?} contains a NUL byte"));
        }
        let sessname = req_str(M, v, "sessname")?.to_string();
        check_sessname(&sessname).map_err(|e| format!("{M}: 'sessname': {e}"))?;
        let device = req_str(M, v, "device")?.to_string();
        check_dev_name(&device).map_err(|e| format!("{M}: 'device': {e}"))?;
        let raw_paths = match v.get("paths") {
            None | Some(Value::Null) => {
                return Err(format!("{M}: missing required parameter 'paths'"))
            }
            Some(Value::Array(a)) if a.is_empty() => {
                return Err(format!("{M}: 'paths' must hold at least one path"))
            }
            Some(Value::Array(a)) => a,
            Some(x) => {
                return Err(format!(
                    "{M}: 'paths' must be an array of {{transport, dst_addr, port?, src_addr?, psk?}}, got {x}"
                ))
            }
        };
        let mut paths = Vec::with_capacity(raw_paths.len());
        for (i, rp) in raw_paths.iter().enumerate() {
            let path = parse_path(M, &format!("paths[{i}]."), rp)?;
            if paths.iter().any(|q: &PathParam| q.addr == path.addr) {
                return Err(format!("{M}: 'paths[{i}]' repeats path {}", path.addr));
            }
            if let Some(first) = paths.first() {
                if first.transport != path.transport {
                    return Err(format!(
                        "{M}: 'paths[{i}].transport' = {} differs from paths[0]'s {}: one session uses one transport",
                        path.transport.as_str(),
                        first.transport.as_str()
                    ));
                }
            }
            paths.push(path);
        }
        let access_mode = match opt_str(M, v, "access_mode")? {
            Some(s) => parse_access(M, "access_mode", s)?,
            None => AccessMode::ReadWrite,
        };
        let mp_policy = match opt_str(M, v, "mp_policy")? {
            Some(s) => parse_policy(M, "mp_policy", s)?,
            None => MpPolicy::MinInflight,
        };
        let max_reconnect_attempts =
            opt_i32(M, v.get("max_reconnect_attempts"), "max_reconnect_attempts")?.unwrap_or(-1);
        let reconnect_delay_sec = p.opt_uint("reconnect_delay_sec", 3600)?.unwrap_or(30);
        let hb_interval_ms = positive(
            M,
            "hb_interval_ms",
            p.opt_uint("hb_interval_ms", 3_600_000)?,
            5000,
        )?;
        let hb_missed_max =
            positive(M, "hb_missed_max", p.opt_uint("hb_missed_max", 1000)?, 5)? as u32;
        let io_timeout_sec = p.opt_uint("io_timeout_sec", 86_400)?.unwrap_or(30);
        let write_zeroes = match opt_str(M, v, "write_zeroes")? {
            Some(s) => s.parse::<WriteZeroesMode>().map_err(|_| {
                format!("{M}: 'write_zeroes' = {s:?} is not one of native, emulate")
            })?,
            None => WriteZeroesMode::Emulate,
        };
        let loss_timeout_sec =
            parse_loss_timeout(M, v.get("loss_timeout_sec"))?.unwrap_or(LOSS_TIMEOUT_DEFAULT);
        Ok(CreateParams {
            name,
            sessname,
            paths,
            device,
            access_mode,
            mp_policy,
            max_reconnect_attempts,
            reconnect_delay_sec,
            hb_interval_ms,
            hb_missed_max,
            io_timeout_sec,
            write_zeroes,
            loss_timeout_sec,
        })
    }

    /// The settings that may change at run time, as created.
    pub fn live(&self) -> LiveSettings {
        LiveSettings {
            max_reconnect_attempts: self.max_reconnect_attempts,
            reconnect_delay_sec: self.reconnect_delay_sec,
            loss_timeout_sec: self.loss_timeout_sec,
        }
    }

    /// The RTRS client configuration these parameters describe, with the paths' keys
    /// (read from the keyring by the caller).
    pub fn client_config(&self, psks: Vec<(PathAddr, Psk)>) -> ClientConfig {
        let mut c = ClientConfig::new(
            self.sessname.clone(),
            self.paths.iter().map(|p| p.addr).collect(),
        );
        c.psks = psks;
        c.mp_policy = self.mp_policy;
        c.max_reconnect_attempts = self.max_reconnect_attempts;
        c.reconnect_delay = Duration::from_secs(self.reconnect_delay_sec);
        c.hb = HbConfig {
            interval: Duration::from_millis(self.hb_interval_ms),
            missed_max: self.hb_missed_max,
        };
        c.io_wait_timeout = Duration::from_secs(self.io_timeout_sec);
        c
    }

    /// The parameters as `bdev_rtrs_create` takes them (for `config_json`), with the
    /// current policy, paths and run-time settings.
    pub fn to_json(&self, mp_policy: MpPolicy, paths: &[PathParam], live: &LiveSettings) -> Value {
        json!({
            "name": self.name,
            "sessname": self.sessname,
            "paths": paths.iter().map(|p| p.to_json()).collect::<Vec<_>>(),
            "device": self.device,
            "access_mode": access_name(self.access_mode),
            "mp_policy": mp_policy.name(),
            "max_reconnect_attempts": live.max_reconnect_attempts,
            "reconnect_delay_sec": live.reconnect_delay_sec,
            "hb_interval_ms": self.hb_interval_ms,
            "hb_missed_max": self.hb_missed_max,
            "io_timeout_sec": self.io_timeout_sec,
            "write_zeroes": self.write_zeroes.as_str(),
            "loss_timeout_sec": live.loss_timeout_sec,
        })
    }
}

/// The keys of `paths` that name one, read from SPDK's keyring; `prefix(i)` names path
/// `i`'s place in error messages (`paths[1].`).
///
/// # Errors
/// A message naming the path's `psk` field and why its key cannot be used.
pub fn path_keys(
    paths: &[PathParam],
    prefix: impl Fn(usize) -> String,
) -> Result<Vec<(PathAddr, Psk)>, String> {
    let mut keys = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        if let Some(name) = &p.psk {
            let k = rtrs_spdk::spdk::keyring::psk(name)
                .map_err(|e| format!("'{}psk': {e}", prefix(i)))?;
            keys.push((p.addr, k));
        }
    }
    Ok(keys)
}

/// `bdev_rtrs_add_path` (`{name, transport, dst_addr, port?, src_addr?, psk?}`) /
/// `bdev_rtrs_remove_path` (the same without `psk`).
///
/// # Errors
/// A message naming the field.
pub fn decode_path_rpc(
    method: &'static str,
    v: &Value,
    with_psk: bool,
) -> Result<(String, PathParam), String> {
    let p = RpcParams::new(method, v)?;
    let mut known = vec!["name", "transport", "dst_addr", "port", "src_addr"];
    if with_psk {
        known.push("psk");
    }
    p.only(&known)?;
    let name = req_str(method, v, "name")?.to_string();
    let mut rest = v.as_object().cloned().unwrap_or_default();
    rest.remove("name");
    let path = parse_path(method, "", &Value::Object(rest))?;
    Ok((name, path))
}
