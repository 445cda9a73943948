//! Who holds the target's session slots and connections, and who gives way
//! (docs/ARCHITECTURE.md, "Session slots"): the caps on sessions (each holds its chunk
//! pool from its first connection request) and on connections, in all and per client
//! address, checked against the session table; the
//! rule that makes room at a cap — a session not in use (the layer above's account,
//! [`super::SessionUse`]) gives way, the oldest of the busiest address (of the
//! newcomer's own address at a per-address cap), and a newcomer is refused (−EUSERS)
//! only when none is left; and the grace after which a session not in use is closed.
//!
//! Sessions that gave way count against no cap while their paths drain (milliseconds),
//! at most [`MAX_DRAINING`] at once; so the pools held never exceed
//! `max_sessions + MAX_DRAINING`. Paths being closed count against no connection cap.

use std::net::IpAddr;
use std::sync::Arc;

use crate::fabric::admission::{source_of, victim};
use crate::Errno;

use super::session::{Path, SessEntry, SessionId, Sessions, Usage, CLOSING, CONNECTING};

/// Sessions that gave way and are still draining, at most: beyond, a newcomer that needs
/// room is refused for now (−EBUSY, which clients retry).
pub(crate) const MAX_DRAINING: usize = 4;

/// The caps in force (`ServerConfig::session_cap`, `connection_cap`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caps {
    pub sessions: usize,
    pub sessions_per_source: usize,
    pub conns: usize,
    pub conns_per_source: usize,
}

/// What a newcomer asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Need {
    /// A session, and its chunk pool (asked at its first connection request).
    ServerSession,
    /// A path's connections (its `cid_num`).
    Conns(usize),
}

impl SessEntry {
    /// Connections of its paths that are not closing (those being made included).
    pub fn conns(&self) -> usize {
        self.paths
            .iter()
            .filter(|p| p.state() < CLOSING)
            .map(|p| usize::from(p.cid_num))
            .sum()
    }

    /// Whether it gives way to a newcomer: it is established and not in use, or still
    /// being set up (it has proven nothing either way).
    fn may_give_way(&self) -> bool {
        if self.evicted {
            return false;
        }
        if self.established {
            return self.up > 0 && matches!(self.usage, Usage::By(_)) && !self.usage.in_use();
        }
        self.all.iter().any(|p| p.state() == CONNECTING)
    }

    /// Every path still connecting or connected (what closing it closes).
    pub fn open_paths(&self) -> Vec<Arc<Path>> {
        self.all
            .iter()
            .filter(|p| p.state() < CLOSING)
            .cloned()
            .collect()
    }
}

/// Sessions that give way to a newcomer: their indices in the table and why.
pub(crate) struct Room {
    pub victims: Vec<usize>,
    pub why: String,
}

impl Sessions {
    /// Which cap one more `need` from `source` would pass, not counting the sessions in
    /// `gone` nor, for [`Need::ServerSession`], session `except`: `(per source?, why)`.
    fn over(
        &self,
        caps: &Caps,
        source: IpAddr,
        need: Need,
        except: Option<SessionId>,
        gone: &[usize],
    ) -> Option<(bool, String)> {
        let except = if matches!(need, Need::ServerSession) {
            except
        } else {
            None
        };
        let counted = || {
            self.sessions.iter().enumerate().filter_map(move |(i, e)| {
                (!e.evicted && Some(e.sess.id) != except && !gone.contains(&i)).then_some(e)
            })
        };
        let source = source_of(source);
        match need {
            Need::ServerSession => {
                let all = counted().count();
                if all >= caps.sessions {
                    return Some((
                        false,
                        format!(
                            "the target holds {all} sessions, its cap (max_sessions {})",
                            caps.sessions
                        ),
                    ));
                }
                let per = caps.sessions_per_source.min(caps.sessions);
                let mine = counted().filter(|e| e.source == source).count();
                (mine >= per).then(|| {
                    (
                        true,
                        format!(
                            "{mine} sessions from {source} already, the cap per source \
                             (max_sessions_per_source {per})"
                        ),
                    )
                })
            }
            Need::Conns(n) => {
                let all: usize = counted().map(SessEntry::conns).sum();
                if all + n > caps.conns {
                    return Some((
                        false,
                        format!(
                            "{n} connections more than the {all} the target holds would pass \
                             its cap (max_connections {})",
                            caps.conns
                        ),
                    ));
                }
                let mine: usize = counted()
                    .filter(|e| e.source == source)
                    .map(SessEntry::conns)
                    .sum();
                (mine + n > caps.conns_per_source).then(|| {
                    (
                        true,
                        format!(
                            "{n} connections more than the {mine} of {source} would pass the \
                             cap per source (max_connections_per_source {})",
                            caps.conns_per_source
                        ),
                    )
                })
            }
        }
    }

    /// Room for `need` from `source` (the newcomer's session is `except`, if it has one:
    /// it never gives way to itself): nothing to do, or the sessions that must give way
    /// (see the module doc). Changes nothing; [`Sessions::evict`] carries the plan out.
    ///
    /// # Errors
    /// −EUSERS with the cap passed when no session may give way; −EBUSY when
    /// [`MAX_DRAINING`] sessions that gave way are still draining.
    pub fn plan_room(
        &self,
        caps: &Caps,
        source: IpAddr,
        need: Need,
        except: Option<SessionId>,
    ) -> Result<Room, (Errno, String)> {
        let mut gone = Vec::new();
        let mut first_why = None;
        let draining = self.sessions.iter().filter(|e| e.evicted).count();
        while let Some((per_source, why)) = self.over(caps, source, need, except, &gone) {
            let cands: Vec<usize> = (0..self.sessions.len())
                .filter(|i| !gone.contains(i))
                .filter(|&i| {
                    let e = &self.sessions[i];
                    Some(e.sess.id) != except
                        && e.may_give_way()
                        && (!per_source || e.source == source_of(source))
                })
                .collect();
            let key = |&i: &usize| (self.sessions[i].source, self.sessions[i].sess.id.0);
            let pick = if per_source {
                victim(&cands, source, 1, usize::MAX, key)
            } else {
                victim(&cands, source, usize::MAX, 1, key)
            };
            let Some(k) = pick else {
                return Err((Errno::EUSERS, why));
            };
            if draining + gone.len() >= MAX_DRAINING {
                return Err((
                    Errno::EBUSY,
                    format!("{why}; {MAX_DRAINING} sessions that gave way are still closing"),
                ));
            }
            first_why.get_or_insert(why);
            gone.push(cands[k]);
        }
        Ok(Room {
            victims: gone,
            why: first_why.unwrap_or_default(),
        })
    }

    /// Carries out `room`: marks its sessions as having given way and returns their
    /// paths to close, each with the session's description.
    pub fn evict(&mut self, room: &Room) -> Vec<Arc<Path>> {
        let mut paths = Vec::new();
        for &i in &room.victims {
            let e = &mut self.sessions[i];
            e.evicted = true;
            e.idle_since = None;
            paths.extend(e.open_paths());
        }
        paths
    }

    /// The established sessions not in use for `grace_ns` by `now`: marked as having
    /// given way, their paths returned to be closed. Starts the clock of those that just
    /// stopped being in use, and stops it for those in use again.
    pub fn idle_overdue(&mut self, now: u64, grace_ns: u64) -> Vec<Arc<Path>> {
        let mut paths = Vec::new();
        for e in &mut self.sessions {
            if e.evicted || !e.established || e.up == 0 || !matches!(e.usage, Usage::By(_)) {
                continue;
            }
            if e.usage.in_use() {
                e.idle_since = None;
                continue;
            }
            let since = *e.idle_since.get_or_insert(now);
            if now.saturating_sub(since) >= grace_ns {
                e.evicted = true;
                e.idle_since = None;
                paths.extend(e.open_paths());
            }
        }
        paths
    }
}
