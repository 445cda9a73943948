//! Why a target refused a session, and whether trying again can change it.
//!
//! A server rejects a connection request with a negative errno in the REJ private data
//! (`rtrs_msg_conn_rsp.errno`, docs/PROTOCOL.md §3.3; the kernel client only logs it in
//! `rtrs_rdma_conn_rejected`). The client sorts those errnos in two kinds:
//!
//! | errno | the server means | kind |
//! |---|---|---|
//! | ENOMEM | no memory for the session's chunk pool or the path's buffers and keys | permanent |
//! | EUSERS | the target holds as many sessions as its caps allow (in all, or from this address) | permanent |
//! | EINVAL, EPROTO, EPROTONOSUPPORT, EOPNOTSUPP | it does not accept what the client asks | permanent |
//! | EPERM, EACCES | the client is not allowed | permanent |
//! | ECONNRESET | a malformed or out-of-order request, a path in the wrong state (races of reconnects) | transient |
//! | EBUSY | too many sessions are being set up at once (`max_pending_sessions`) | transient |
//! | EEXIST | a path from the same address exists (a stale one the server is replacing) | transient |
//! | ENXIO | unknown session and `first_conn` not set | transient |
//! | anything else | | transient |
//!
//! Failures that carry no errno (nothing listening, a timeout, a dropped connection)
//! are transient too.
//!
//! While a session has never been connected and the latest attempt of *every* path was
//! refused permanently, the session is *refused*: [`super::ClientSession::refusal`] says why,
//! and requests (RNBD's SESS_INFO and OPEN among them) fail at once with
//! [`super::SubmitError::Refused`] instead of waiting for a path. ENOMEM counts as
//! permanent although memory may be freed later: the person creating the session
//! learns at once that the target has no room for it rather than after a timeout. The
//! session itself is not closed by this: its paths keep retrying under the reconnect
//! policy, and if one connects later the refusal is lifted. Its owner decides — the SPDK
//! bdev (`bdev_rtrs_create`) and `rtrs-bench` give up and close it.

use std::fmt;

use crate::Errno;

/// How a refused connection attempt counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectKind {
    /// Trying again is not expected to help.
    Permanent,
    /// A later attempt may succeed.
    Transient,
}

/// Whether a REJ with `errno` is worth retrying.
pub fn reject_kind(errno: Errno) -> RejectKind {
    match errno.get() {
        libc::ENOMEM
        | libc::EUSERS
        | libc::EINVAL
        | libc::EPROTO
        | libc::EPROTONOSUPPORT
        | libc::EOPNOTSUPP
        | libc::EPERM
        | libc::EACCES => RejectKind::Permanent,
        _ => RejectKind::Transient,
    }
}

/// What the server means by rejecting with `errno`, for people.
pub fn reject_reason(errno: Errno) -> String {
    let (what, name) = match errno.get() {
        libc::ENOMEM => ("out of memory for its chunk pool or path buffers", "ENOMEM"),
        libc::EUSERS => (
            "it holds as many sessions as its caps allow (max_sessions, max_sessions_per_source)",
            "EUSERS",
        ),
        libc::EINVAL => ("invalid connection parameters", "EINVAL"),
        libc::EPROTO => ("protocol error", "EPROTO"),
        libc::EPROTONOSUPPORT => ("protocol version not supported", "EPROTONOSUPPORT"),
        libc::EOPNOTSUPP => ("not supported", "EOPNOTSUPP"),
        libc::EPERM => ("not permitted", "EPERM"),
        libc::EACCES => ("access denied", "EACCES"),
        libc::ECONNRESET => ("connection request refused", "ECONNRESET"),
        libc::EBUSY => ("too many sessions being set up", "EBUSY"),
        libc::EEXIST => ("a path from this address already exists", "EEXIST"),
        libc::ENXIO => ("unknown session", "ENXIO"),
        _ => return format!("{} (errno {})", errno.description(), errno.neg()),
    };
    format!("{what} ({name})")
}

/// A session every path of which was refused permanently (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The first refused path's errno.
    pub errno: Errno,
    /// `target refused the session: <reason>`, with each path's reason when they differ.
    pub reason: String,
}

impl Refusal {
    /// The refusal of paths whose latest attempts were refused with `errnos` (one per
    /// path, each with its address); `None` for no paths.
    pub fn of<A: fmt::Display>(errnos: &[(A, Errno)]) -> Option<Refusal> {
        let (_, first) = errnos.first()?;
        let reason = if errnos.iter().all(|(_, e)| e == first) {
            format!("target refused the session: {}", reject_reason(*first))
        } else {
            let each: Vec<String> = errnos
                .iter()
                .map(|(a, e)| format!("{a}: {}", reject_reason(*e)))
                .collect();
            format!(
                "target refused the session on every path: {}",
                each.join("; ")
            )
        };
        Some(Refusal {
            errno: *first,
            reason,
        })
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_reasons() {
        assert_eq!(reject_kind(Errno::ENOMEM), RejectKind::Permanent);
        assert_eq!(reject_kind(Errno::EPERM), RejectKind::Permanent);
        for e in [
            libc::ECONNRESET,
            libc::EBUSY,
            libc::EEXIST,
            libc::ENXIO,
            libc::EIO,
        ] {
            assert_eq!(reject_kind(Errno::new(e)), RejectKind::Transient, "{e}");
        }
        assert_eq!(
            reject_reason(Errno::ENOMEM),
            "out of memory for its chunk pool or path buffers (ENOMEM)"
        );
        assert!(reject_reason(Errno::EIO).contains("errno -5"));
    }

    #[test]
    fn refusal_text() {
        assert_eq!(Refusal::of::<&str>(&[]), None);
        let r = Refusal::of(&[("a", Errno::ENOMEM), ("b", Errno::ENOMEM)]).unwrap();
        assert_eq!(
            r.to_string(),
            "target refused the session: out of memory for its chunk pool or path buffers (ENOMEM)"
        );
        assert_eq!(r.errno, Errno::ENOMEM);
        let r = Refusal::of(&[("a", Errno::ENOMEM), ("b", Errno::EPERM)]).unwrap();
        assert!(r.reason.contains("on every path: a: out of memory"), "{r}");
        assert!(r.reason.contains("b: not permitted (EPERM)"), "{r}");
    }
}
