//! Fabric URLs as the command lines take them, and the fabric each one names:
//! `tcp://HOST[:PORT][?src=ADDR]` (the software fabric over TCP) and
//! `rdma://HOST[:PORT][?src=ADDR]` (the verbs fabric on the first RDMA device). HOST is
//! an IPv4 address, `[IPv6]` or a name that resolves; the port is 1234 when none is given,
//! as RNBD's default port. `src` is the local address a client path binds (the kernel's
//! `[src@]dst` path form); it is an IP address with an optional port (`127.0.0.2`,
//! `[::1]`, `10.0.0.1:5000`). Any other `?key` is an error naming it.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use crate::fabric::tcp::TcpFabric;
use crate::fabric::Fabric;

/// RNBD's default port.
pub const DEFAULT_PORT: u16 = 1234;

/// What the URL forms look like, for error messages.
const FORMS: &str = "tcp://HOST[:PORT][?src=ADDR] or rdma://HOST[:PORT][?src=ADDR]";

/// The fabric a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `tcp://`: the software fabric over TCP.
    Tcp,
    /// `rdma://`: the verbs fabric (rdma-core) on the first RDMA device.
    Rdma,
}

impl Scheme {
    /// The URL scheme, without `://`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Tcp => "tcp",
            Scheme::Rdma => "rdma",
        }
    }

    /// Opens the fabric: tcp always works; rdma opens every RDMA device (each path and
    /// listener then lives on the device its address belongs to).
    ///
    /// # Errors
    /// For rdma, the fabric's own one-line error ("no RDMA device found: ..."), also when
    /// this build has no verbs fabric.
    pub fn open(self) -> Result<Arc<dyn Fabric>, String> {
        match self {
            Scheme::Tcp => Ok(Arc::new(TcpFabric::new())),
            Scheme::Rdma => open_verbs(),
        }
    }
}

#[cfg(feature = "verbs")]
fn open_verbs() -> Result<Arc<dyn Fabric>, String> {
    use crate::fabric::verbs::VerbsFabric;
    let f = VerbsFabric::open(None).map_err(|e| e.to_string())?;
    Ok(Arc::new(f))
}

#[cfg(not(feature = "verbs"))]
fn open_verbs() -> Result<Arc<dyn Fabric>, String> {
    Err(String::from(
        "no RDMA device found: this build has no verbs fabric (build with the `verbs` feature)",
    ))
}

/// A parsed fabric URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricUrl {
    pub scheme: Scheme,
    /// The destination (for a listener: the address to listen on).
    pub addr: SocketAddr,
    /// `?src=`: the local address to bind (port 0 when none was given).
    pub src: Option<SocketAddr>,
}

impl fmt::Display for FabricUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme.as_str(), self.addr)?;
        match self.src {
            Some(s) if s.port() == 0 => match s.ip() {
                IpAddr::V4(ip) => write!(f, "?src={ip}"),
                IpAddr::V6(ip) => write!(f, "?src=[{ip}]"),
            },
            Some(s) => write!(f, "?src={s}"),
            None => Ok(()),
        }
    }
}

/// Parses `tcp://HOST[:PORT][?src=ADDR]` or `rdma://HOST[:PORT][?src=ADDR]`.
///
/// # Errors
/// A message naming the URL and what is wrong with it: no scheme, an unsupported
/// scheme, an empty host, a bad port, a host that does not resolve, an unknown or
/// repeated query key, or a source address that is not an IP address or whose IP
/// version differs from the destination's.
pub fn parse_url(s: &str) -> Result<FabricUrl, String> {
    let Some((scheme, rest)) = s.split_once("://") else {
        return Err(format!(
            "bad URL {s:?}: expected {FORMS}, e.g. tcp://127.0.0.1:1234"
        ));
    };
    let scheme = match scheme {
        "tcp" => Scheme::Tcp,
        "rdma" => Scheme::Rdma,
        _ => {
            return Err(format!(
                "unsupported scheme {scheme:?} in {s:?}: expected {FORMS}"
            ))
        }
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let addr = parse_host_port(s, rest.strip_suffix('/').unwrap_or(rest))?;
    let mut src = None;
    for item in query.map(|q| q.split('&')).into_iter().flatten() {
        let (key, value) = item.split_once('=').unwrap_or((item, ""));
        match key {
            "src" if src.is_some() => return Err(format!("bad URL {s:?}: src= given twice")),
            "src" => src = Some(parse_src(s, value)?),
            "" => return Err(format!("bad URL {s:?}: empty option after '?'")),
            _ => {
                return Err(format!(
                    "bad URL {s:?}: unknown option {key:?} (the only option is src=ADDR)"
                ))
            }
        }
    }
    if let Some(sa) = src {
        if sa.is_ipv4() != addr.is_ipv4() {
            return Err(format!(
                "bad URL {s:?}: source {} and destination {addr} are not the same IP version",
                sa.ip()
            ));
        }
    }
    Ok(FabricUrl { scheme, addr, src })
}

/// `[v6]:port`, `[v6]`, `v4:port`, `name:port`, `name`, resolved to the first address.
fn parse_host_port(s: &str, rest: &str) -> Result<SocketAddr, String> {
    if rest.is_empty() {
        return Err(format!("bad URL {s:?}: no host"));
    }
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
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("bad URL {s:?}: host {host:?} does not resolve ({e})"))?
        .next()
        .ok_or_else(|| format!("bad URL {s:?}: host {host:?} has no address"))
}

/// `src=`: an IP address (`127.0.0.2`, `::1`, `[::1]`) with an optional port.
fn parse_src(s: &str, v: &str) -> Result<SocketAddr, String> {
    if v.is_empty() {
        return Err(format!(
            "bad URL {s:?}: src= needs an address, e.g. src=127.0.0.2"
        ));
    }
    if let Ok(sa) = v.parse::<SocketAddr>() {
        return Ok(sa);
    }
    let bare = v
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(v);
    bare.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 0))
        .map_err(|_| {
            format!(
                "bad URL {s:?}: src {v:?} is not an IP address (e.g. src=127.0.0.2, \
                 src=[::1], src=10.0.0.1:5000)"
            )
        })
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
        assert_eq!(a("rdma://10.0.0.1:7"), Ok("10.0.0.1:7".into()));
        for (bad, word) in [
            ("127.0.0.1:1234", "expected tcp://"),
            ("verbs://127.0.0.1", "unsupported scheme"),
            ("tcp://", "no host"),
            ("tcp://:1234", "no host"),
            ("tcp://?src=127.0.0.2", "no host"),
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

    #[test]
    fn schemes_and_sources() {
        let u = parse_url("rdma://127.0.0.1:5?src=127.0.0.2").unwrap();
        assert_eq!(u.scheme, Scheme::Rdma);
        assert_eq!(u.src, Some("127.0.0.2:0".parse().unwrap()));
        assert_eq!(u.to_string(), "rdma://127.0.0.1:5?src=127.0.0.2");
        let u = parse_url("tcp://127.0.0.1/?src=127.0.0.2:4000").unwrap();
        assert_eq!((u.scheme, u.addr.port()), (Scheme::Tcp, DEFAULT_PORT));
        assert_eq!(u.src, Some("127.0.0.2:4000".parse().unwrap()));
        assert_eq!(u.to_string(), "tcp://127.0.0.1:1234?src=127.0.0.2:4000");
        for v6 in ["::1", "[::1]"] {
            let u = parse_url(&format!("tcp://[::1]:9?src={v6}")).unwrap();
            assert_eq!(u.src, Some("[::1]:0".parse().unwrap()));
            assert_eq!(u.to_string(), "tcp://[::1]:9?src=[::1]");
        }
        assert_eq!(parse_url("tcp://127.0.0.1").unwrap().src, None);
        for (bad, words) in [
            (
                "tcp://127.0.0.1?dst=1.2.3.4",
                &["unknown option", "\"dst\""][..],
            ),
            (
                "tcp://127.0.0.1?src=127.0.0.2&port=3",
                &["unknown option", "\"port\""],
            ),
            ("tcp://127.0.0.1?", &["empty option"]),
            ("tcp://127.0.0.1?src", &["src=", "needs an address"]),
            ("tcp://127.0.0.1?src=", &["needs an address"]),
            (
                "tcp://127.0.0.1?src=host.example",
                &["host.example", "not an IP"],
            ),
            ("tcp://127.0.0.1?src=1.2.3.4&src=1.2.3.5", &["twice"]),
            ("tcp://127.0.0.1?src=::1", &["::1", "IP version"]),
        ] {
            let e = parse_url(bad).unwrap_err();
            for w in words {
                assert!(e.contains(w), "{bad}: {e} lacks {w}");
            }
        }
    }
}
