//! Client configuration with the kernel's defaults (`rtrs_clt_open` arguments as RNBD
//! passes them, the module constants of docs/PROTOCOL.md §1) and path addresses.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use super::policy::MpPolicy;
use super::reconnect::ReconnectPolicy;
use crate::common::HbConfig;
use crate::fabric::Psk;
use crate::proto::constants::CONNECT_TIMEOUT_MS;

/// One path: an optional source address and the destination (the kernel's
/// `rtrs_addr`). Text form `[src,]dst` or `src@dst`, e.g. `127.0.0.1:1234` or
/// `127.0.0.2,127.0.0.1:1234`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PathAddr {
    pub src: Option<SocketAddr>,
    pub dst: SocketAddr,
}

impl PathAddr {
    pub fn new(dst: SocketAddr) -> PathAddr {
        PathAddr { src: None, dst }
    }
}

impl fmt::Display for PathAddr {
    /// `src@dst` as the kernel names paths in sysfs, or `dst` alone.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.src {
            Some(s) => write!(f, "{s}@{}", self.dst),
            None => write!(f, "{}", self.dst),
        }
    }
}

/// A path string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad path {text:?}: {reason} (expected [src,]dst or src@dst, dst as ip:port)")]
pub struct PathParseError {
    pub text: String,
    pub reason: &'static str,
}

impl FromStr for PathAddr {
    type Err = PathParseError;

    fn from_str(s: &str) -> Result<PathAddr, PathParseError> {
        let err = |reason| PathParseError {
            text: s.to_string(),
            reason,
        };
        let (src, dst) = match s.split_once([',', '@']) {
            Some((a, b)) => (Some(a.trim()), b.trim()),
            None => (None, s.trim()),
        };
        let dst: SocketAddr = dst
            .parse()
            .map_err(|_| err("destination is not an ip:port"))?;
        let src = match src {
            None => None,
            Some(a) => Some(match a.parse::<SocketAddr>() {
                Ok(sa) => sa,
                Err(_) => SocketAddr::new(
                    a.parse::<IpAddr>()
                        .map_err(|_| err("source is not an ip or ip:port"))?,
                    0,
                ),
            }),
        };
        Ok(PathAddr { src, dst })
    }
}

/// Everything a client session is opened with. `ClientConfig::new` gives the kernel's
/// defaults; fields are public for adjustment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// Session name sent in INFO_REQ (< 255 bytes, no `/` or `.`).
    pub sessname: String,
    /// Paths to open (1..=128).
    pub paths: Vec<PathAddr>,
    /// Default min-inflight.
    pub mp_policy: MpPolicy,
    /// −1 for ever (RNBD's default), 0 never, N attempts.
    pub max_reconnect_attempts: i32,
    /// Wait before a reconnect attempt (RNBD: 30 s).
    pub reconnect_delay: Duration,
    /// Upper bound of the random extra wait before a reconnect (500 ms; the kernel adds
    /// only 0–7 ms, which does not spread clients out).
    pub reconnect_jitter: Duration,
    /// Heartbeat: 5 s interval, dead after more than 5 missed.
    pub hb: HbConfig,
    /// While no path is connected, IO waits this long for one before failing with
    /// −ENOTCONN (beyond the kernel, like NVMe-oF's fast-io-fail timeout; 0 fails at once).
    /// The RNBD client uses the same bound, counted from submission, for block IO whose
    /// device is unreachable (no path, or not re-opened yet after a reconnect). 30 s.
    pub io_wait_timeout: Duration,
    /// Bound on each connection's establishment and on the INFO exchange (30 s).
    pub connect_timeout: Duration,
    /// Pre-shared keys that authenticate paths over the tcp fabric
    /// (`docs/tcp-fabric.md`, "Authentication"); a path not listed connects without a
    /// key. A path whose authentication fails is closed without a reconnect. Default
    /// none.
    pub psks: Vec<(PathAddr, Psk)>,
}

impl ClientConfig {
    /// The kernel's defaults for `sessname` over `paths`.
    pub fn new(sessname: impl Into<String>, paths: Vec<PathAddr>) -> ClientConfig {
        ClientConfig {
            sessname: sessname.into(),
            paths,
            mp_policy: MpPolicy::MinInflight,
            max_reconnect_attempts: -1,
            reconnect_delay: Duration::from_secs(30),
            reconnect_jitter: Duration::from_millis(500),
            hb: HbConfig::default(),
            io_wait_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_millis(CONNECT_TIMEOUT_MS),
            psks: Vec::new(),
        }
    }

    /// Authenticates every path of [`ClientConfig::paths`] with `psk`.
    pub fn set_psk(&mut self, psk: &Psk) {
        self.psks = self.paths.iter().map(|&p| (p, psk.clone())).collect();
    }

    /// The key of path `addr`, if it has one.
    pub fn psk_for(&self, addr: &PathAddr) -> Option<&Psk> {
        self.psks.iter().find(|(p, _)| p == addr).map(|(_, k)| k)
    }

    /// The reconnect part of the configuration.
    pub fn reconnect_policy(&self) -> ReconnectPolicy {
        ReconnectPolicy {
            delay: self.reconnect_delay,
            jitter: self.reconnect_jitter,
            max_attempts: self.max_reconnect_attempts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::check_sessname;

    #[test]
    fn config_defaults_and_paths() {
        let p: PathAddr = "127.0.0.1:1234".parse().unwrap();
        let c = ClientConfig::new("sess", vec![p]);
        assert_eq!(c.mp_policy, MpPolicy::MinInflight);
        assert_eq!(c.max_reconnect_attempts, -1);
        assert_eq!(c.reconnect_delay, Duration::from_secs(30));
        assert_eq!(c.hb.interval, Duration::from_secs(5));
        assert_eq!(c.hb.missed_max, 5);
        assert_eq!(c.connect_timeout, Duration::from_secs(30));
        let q: PathAddr = "127.0.0.2,127.0.0.1:1234".parse().unwrap();
        assert_eq!(q.src.unwrap().ip().to_string(), "127.0.0.2");
        assert_eq!(q.to_string(), "127.0.0.2:0@127.0.0.1:1234");
        let r: PathAddr = "[::1]:5@[::1]:1234".parse().unwrap();
        assert_eq!(r.dst.port(), 1234);
        let e = "nohost".parse::<PathAddr>().unwrap_err();
        assert!(e.to_string().contains("nohost"), "{e}");
        assert!(check_sessname("ok-name").is_ok());
        assert!(check_sessname("a/b").is_err());
        assert!(check_sessname("a.b").is_err());
        assert!(check_sessname("").is_err());
        assert!(check_sessname(&"x".repeat(255)).is_err());
    }
}
