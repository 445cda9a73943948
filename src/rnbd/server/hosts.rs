//! Which hosts may OPEN an export: its host list, modelled on an NVMe-oF subsystem's
//! (`nvmf_subsystem_add_host`; the kernel's `rnbd-srv` has none and lets every session open
//! every device). A [`HostPattern`] is an address (`127.0.0.2`, `[fd00::1]`), a network
//! (`10.0.0.0/24`, `[fd00::]/64`), both matched against the source address of the path that
//! carries the OPEN, or `sess:NAME`, matched against the RTRS session name, which the
//! client chooses: it identifies, it does not authenticate (a pre-shared key does;
//! docs/ARCHITECTURE.md, "Who may open an export"). An export with no list
//! ([`HostList::any`]) is open to every host; one with a list (even an empty one) only to
//! the hosts it matches.
//!
//! The list is checked at OPEN — for the path carrying it and for every other path of
//! the session, since each can carry the device's IO — and when a path joins a session
//! that has the export open ([`HostList::admits_path`]: by address, or by `sess:` only on
//! an authenticated connection, a session's name being no secret). Removing a host
//! leaves the devices it has open working (as NVMe-oF leaves connected controllers)
//! until it closes them, the export is removed, or its session ends; its next OPEN (a
//! re-open after a reconnect included) is refused with −EACCES.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::sync::RwLock;

use crate::sync::{read, write};

/// Longest session name (`rtrs_msg_info_req.pathname`, as the kernel checks it).
const MAX_SESSNAME: usize = 254;

/// One entry of a host list.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Exactly this source address.
    Addr(IpAddr),
    /// Source addresses in this network (the host bits of the address are zero).
    Net { addr: IpAddr, prefix: u8 },
    /// This RTRS session name.
    Sess(String),
}

/// Who is opening: the session's name and the source address of the path the OPEN came
/// on (`None` when the transport does not know it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Host<'a> {
    pub addr: Option<IpAddr>,
    pub sessname: &'a str,
}

/// An IPv4 address as IPv6 (`::ffff:a.b.c.d`, what a dual-stack socket reports) is
/// the IPv4 address.
fn plain(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

fn bits(ip: IpAddr) -> (u128, u8) {
    match ip {
        IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
        IpAddr::V6(v6) => (u128::from(v6), 128),
    }
}

/// The mask of a `prefix`-bit network in a `width`-bit address.
fn mask(prefix: u8, width: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        (u128::MAX << (128 - u32::from(prefix))) >> (128 - u32::from(width))
    }
}

impl HostPattern {
    /// Whether `host` is one this pattern names.
    pub fn matches(&self, host: &Host<'_>) -> bool {
        match self {
            HostPattern::Sess(name) => name == host.sessname,
            HostPattern::Addr(a) => host.addr.is_some_and(|ip| plain(ip) == *a),
            HostPattern::Net { addr, prefix } => host.addr.is_some_and(|ip| {
                let (want, width) = bits(*addr);
                let (got, got_width) = bits(plain(ip));
                let m = mask(*prefix, width);
                width == got_width && got & m == want & m
            }),
        }
    }
}

/// Why a host pattern does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad host pattern {pattern:?}: {why} (expected an address such as 127.0.0.2 or [fd00::1], a network such as 10.0.0.0/24 or [fd00::]/64, or sess:NAME)")]
pub struct HostPatternError {
    pub pattern: String,
    pub why: String,
}

fn parse_ip(s: &str) -> Option<IpAddr> {
    if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    s.parse::<IpAddr>().ok()
}

impl FromStr for HostPattern {
    type Err = HostPatternError;

    fn from_str(s: &str) -> Result<HostPattern, HostPatternError> {
        let err = |why: String| HostPatternError {
            pattern: s.to_string(),
            why,
        };
        if let Some(name) = s.strip_prefix("sess:") {
            if name.is_empty() || name.len() > MAX_SESSNAME {
                return Err(err(format!("a session name has 1 to {MAX_SESSNAME} bytes")));
            }
            if name.contains(['/', '.', '\0']) {
                return Err(err("a session name has no '/', '.' or NUL".into()));
            }
            return Ok(HostPattern::Sess(name.to_string()));
        }
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let ip = parse_ip(addr)
            .ok_or_else(|| err(format!("{addr:?} is not an IPv4 or IPv6 address")))?;
        let ip = plain(ip);
        let Some(prefix) = prefix else {
            return Ok(HostPattern::Addr(ip));
        };
        let (value, width) = bits(ip);
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|&p| p <= width)
            .ok_or_else(|| err(format!("the prefix length must be 0 to {width}")))?;
        if value & !mask(prefix, width) != 0 {
            let net = value & mask(prefix, width);
            let net = match ip {
                IpAddr::V4(_) => Ipv4Addr::from(net as u32).to_string(),
                IpAddr::V6(_) => format!("[{}]", Ipv6Addr::from(net)),
            };
            return Err(err(format!(
                "the address has bits set beyond the /{prefix} prefix (the network is {net}/{prefix})"
            )));
        }
        Ok(HostPattern::Net { addr: ip, prefix })
    }
}

impl fmt::Display for HostPattern {
    /// The canonical text, which parses back to the same pattern (IPv6 in brackets).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ip = |f: &mut fmt::Formatter<'_>, a: &IpAddr| match a {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "[{v6}]"),
        };
        match self {
            HostPattern::Sess(name) => write!(f, "sess:{name}"),
            HostPattern::Addr(a) => ip(f, a),
            HostPattern::Net { addr, prefix } => {
                ip(f, addr)?;
                write!(f, "/{prefix}")
            }
        }
    }
}

/// An export's host list: `None` is open to every host.
#[derive(Debug, Default)]
pub struct HostList(RwLock<Option<Vec<HostPattern>>>);

impl HostList {
    /// Open to every host.
    pub fn any() -> HostList {
        HostList(RwLock::new(None))
    }

    /// Only the hosts `patterns` match (none if it is empty).
    pub fn only(patterns: Vec<HostPattern>) -> HostList {
        HostList(RwLock::new(Some(patterns)))
    }

    /// Whether `host` may open the export.
    pub fn allows(&self, host: &Host<'_>) -> bool {
        match &*read(&self.0) {
            None => true,
            Some(list) => list.iter().any(|p| p.matches(host)),
        }
    }

    /// Whether a path from `addr` may join a session (named `sessname`) that has the
    /// export open: the list allows any host, or an address or network of it matches
    /// `addr`, or — only on a connection that proved the target's key (`authenticated`)
    /// — a `sess:` pattern matches `sessname`. Without a key a session's name is no
    /// proof, and neither is the session's `paths_uuid`, which every connection request
    /// carries in clear.
    pub fn admits_path(&self, addr: IpAddr, sessname: &str, authenticated: bool) -> bool {
        let host = Host {
            addr: Some(addr),
            sessname,
        };
        match &*read(&self.0) {
            None => true,
            Some(list) => list.iter().any(|p| match p {
                HostPattern::Sess(_) => authenticated && p.matches(&host),
                _ => p.matches(&host),
            }),
        }
    }

    /// The patterns, `None` when open to every host.
    pub fn get(&self) -> Option<Vec<HostPattern>> {
        read(&self.0).clone()
    }

    /// Adds `p` (an export open to every host becomes open to `p` only); false if it
    /// was there already.
    pub fn add(&self, p: HostPattern) -> bool {
        let mut g = write(&self.0);
        let list = g.get_or_insert_with(Vec::new);
        if list.contains(&p) {
            return false;
        }
        list.push(p);
        true
    }

    /// Removes `p`; false if the list does not have it. Removing the last pattern
    /// leaves an empty list, which no host matches.
    pub fn remove(&self, p: &HostPattern) -> bool {
        let mut g = write(&self.0);
        let Some(list) = g.as_mut() else {
            return false;
        };
        let before = list.len();
        list.retain(|q| q != p);
        list.len() != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(addr: &str, sessname: &str) -> (Option<IpAddr>, String) {
        (addr.parse().ok(), sessname.to_string())
    }

    fn m(p: &str, h: &(Option<IpAddr>, String)) -> bool {
        p.parse::<HostPattern>().unwrap().matches(&Host {
            addr: h.0,
            sessname: &h.1,
        })
    }

    #[test]
    fn patterns_parse_print_and_match() {
        for (text, canon) in [
            ("127.0.0.2", "127.0.0.2"),
            ("::1", "[::1]"),
            ("[fd00::1]", "[fd00::1]"),
            ("10.0.0.0/24", "10.0.0.0/24"),
            ("[fd00::]/64", "[fd00::]/64"),
            ("fd00::/64", "[fd00::]/64"),
            ("0.0.0.0/0", "0.0.0.0/0"),
            ("::ffff:10.1.2.3", "10.1.2.3"),
            ("sess:host1", "sess:host1"),
        ] {
            let p: HostPattern = text.parse().unwrap();
            assert_eq!(p.to_string(), canon);
            assert_eq!(canon.parse::<HostPattern>().unwrap(), p);
        }
        let a = host("127.0.0.2", "h1");
        assert!(m("127.0.0.2", &a) && !m("127.0.0.3", &a));
        assert!(m("127.0.0.0/8", &a) && !m("10.0.0.0/8", &a) && m("0.0.0.0/0", &a));
        assert!(m("sess:h1", &a) && !m("sess:h2", &a));
        let v6 = host("fd00::5", "h1");
        assert!(m("[fd00::]/64", &v6) && !m("[fd01::]/64", &v6) && !m("0.0.0.0/0", &v6));
        // A v4 peer seen through a dual-stack socket.
        let mapped = host("::ffff:10.0.0.7", "h1");
        assert!(m("10.0.0.0/24", &mapped) && m("10.0.0.7", &mapped));
        // No address known: only session names match.
        let none = (None, "h1".to_string());
        assert!(!m("0.0.0.0/0", &none) && m("sess:h1", &none));
    }

    #[test]
    fn bad_patterns_name_the_pattern() {
        for (text, words) in [
            ("localhost", "not an IPv4 or IPv6 address"),
            ("10.0.0.1/24", "the network is 10.0.0.0/24"),
            ("10.0.0.0/33", "0 to 32"),
            ("[fd00::1]/64", "the network is [fd00::]/64"),
            ("sess:", "1 to 254"),
            ("sess:a.b", "no '/', '.'"),
            ("", "not an IPv4"),
        ] {
            let e = text.parse::<HostPattern>().unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(&format!("{text:?}")), "{msg}");
            assert!(msg.contains(words), "{msg}");
        }
    }

    #[test]
    fn lists_open_restrict_add_and_remove() {
        let h = host("10.0.0.9", "h");
        let who = Host {
            addr: h.0,
            sessname: &h.1,
        };
        let l = HostList::any();
        assert!(l.allows(&who) && l.get().is_none());
        let p: HostPattern = "10.0.0.0/24".parse().unwrap();
        assert!(l.add(p.clone()) && !l.add(p.clone()));
        assert!(l.allows(&who));
        assert!(!l.remove(&"sess:h".parse().unwrap()));
        assert!(l.remove(&p));
        // The last one removed: an empty list lets nobody in.
        assert_eq!(l.get(), Some(vec![]));
        assert!(!l.allows(&who));
        assert!(!HostList::only(vec![]).allows(&who));
    }

    #[test]
    fn a_joining_path_is_admitted_by_address_or_by_name_with_a_key() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let l = HostList::only(vec![
            "10.0.0.0/24".parse().unwrap(),
            "sess:db1".parse().unwrap(),
        ]);
        assert!(l.admits_path(ip("10.0.0.9"), "other", false));
        assert!(l.admits_path(ip("::ffff:10.0.0.9"), "other", false));
        assert!(!l.admits_path(ip("10.0.1.9"), "other", true));
        // The name alone proves nothing without a key.
        assert!(!l.admits_path(ip("10.0.1.9"), "db1", false));
        assert!(l.admits_path(ip("10.0.1.9"), "db1", true));
        assert!(HostList::any().admits_path(ip("192.0.2.1"), "x", false));
        assert!(!HostList::only(vec![]).admits_path(ip("10.0.0.9"), "db1", true));
    }
}
