//! Fabric URLs as the command lines take them: `tcp://HOST[:PORT]` (HOST an IPv4
//! address, `[IPv6]` or a name that resolves), port 1234 when none is given, as RNBD's
//! default port.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

/// RNBD's default port.
pub const DEFAULT_PORT: u16 = 1234;

/// A parsed fabric URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricUrl {
    pub addr: SocketAddr,
}

impl fmt::Display for FabricUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tcp://{}", self.addr)
    }
}

/// Parses `tcp://HOST[:PORT]`.
///
/// # Errors
/// A message naming the URL and what is wrong with it: no scheme, an unsupported
/// scheme, an empty host, a bad port, or a host that does not resolve.
pub fn parse_url(s: &str) -> Result<FabricUrl, String> {
    let Some((scheme, rest)) = s.split_once("://") else {
        return Err(format!(
            "bad URL {s:?}: expected tcp://HOST[:PORT], e.g. tcp://127.0.0.1:1234"
        ));
    };
    if scheme != "tcp" {
        return Err(format!(
            "unsupported scheme {scheme:?} in {s:?}: only tcp:// is supported by this build"
        ));
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Err(format!("bad URL {s:?}: no host"));
    }
    // Split off the port: `[v6]:port`, `[v6]`, `v4:port`, `name:port`, `name`.
    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        let (h, tail) = inner
            .split_once(']')
            .ok_or_else(|| format!("bad URL {s:?}: '[' without ']'"))?;
        match tail {
            "" => (h, None),
            t => match t.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None => return Err(format!("bad URL {s:?}: junk {t:?} after ']'")),
            },
        }
    } else {
        match rest.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => {
                return Err(format!(
                    "bad URL {s:?}: write IPv6 addresses in brackets, e.g. tcp://[::1]:1234"
                ))
            }
            None => (rest, None),
        }
    };
    if host.is_empty() {
        return Err(format!("bad URL {s:?}: no host"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| format!("bad URL {s:?}: port {p:?} is not a number 0..65535"))?,
    };
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("bad URL {s:?}: host {host:?} does not resolve ({e})"))?
        .next()
        .ok_or_else(|| format!("bad URL {s:?}: host {host:?} has no address"))?;
    Ok(FabricUrl { addr })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let a = |s| parse_url(s).map(|u| u.addr.to_string());
        assert_eq!(a("tcp://127.0.0.1"), Ok("127.0.0.1:1234".into()));
        assert_eq!(a("tcp://127.0.0.1:0"), Ok("127.0.0.1:0".into()));
        assert_eq!(a("tcp://[::1]:99/"), Ok("[::1]:99".into()));
        assert_eq!(a("tcp://[::1]"), Ok("[::1]:1234".into()));
        for (bad, word) in [
            ("127.0.0.1:1234", "expected tcp://"),
            ("rdma://127.0.0.1", "unsupported scheme"),
            ("tcp://", "no host"),
            ("tcp://:1234", "no host"),
            ("tcp://127.0.0.1:x", "port"),
            ("tcp://127.0.0.1:65536", "port"),
            ("tcp://::1", "brackets"),
            ("tcp://[::1", "']'"),
            ("tcp://[::1]x", "junk"),
        ] {
            let e = parse_url(bad).unwrap_err();
            assert!(e.contains(word), "{bad}: {e}");
        }
    }
}
