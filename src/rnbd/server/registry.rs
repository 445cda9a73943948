//! Which RNBD session belongs to which RTRS session, for every core: a table shared by
//! the cores (written on link events, the kernel's `rnbd_srv_link_ev` creating and
//! destroying `rnbd_srv_session`), and a per-core cache read on every request so the
//! data path takes no shared lock once a core has seen a session. The cache holds each
//! session as a [`SessionView`]: the session with this core's copy of its devices.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use super::exports::Exports;
use super::session::{RnbdServerSession, SessionView};

use crate::sync::lock;

/// RNBD sessions by RTRS session key, shared by all cores.
pub struct RnbdSessions<K> {
    exports: Arc<Exports>,
    map: Mutex<HashMap<K, Arc<RnbdServerSession>>>,
}

impl<K: Copy + Eq + Hash> RnbdSessions<K> {
    pub fn new(exports: Arc<Exports>) -> RnbdSessions<K> {
        RnbdSessions {
            exports,
            map: Mutex::new(HashMap::new()),
        }
    }

    pub fn exports(&self) -> &Arc<Exports> {
        &self.exports
    }

    /// The session of `key`, created (named `name`) if there is none: on the RTRS
    /// session's first path coming up, or on its first request should that arrive on
    /// a core before the link event was handled.
    pub fn get_or_create(&self, key: K, name: &str) -> Arc<RnbdServerSession> {
        let mut map = self.lock();
        Arc::clone(
            map.entry(key).or_insert_with(|| {
                Arc::new(RnbdServerSession::new(name, Arc::clone(&self.exports)))
            }),
        )
    }

    pub fn get(&self, key: K) -> Option<Arc<RnbdServerSession>> {
        self.lock().get(&key).cloned()
    }

    /// The RTRS session's last path went away: the RNBD session ends (every mapping
    /// closed, writers released) and leaves the table. Cores still caching it see it
    /// ended and drop it.
    pub fn remove(&self, key: K) -> Option<Arc<RnbdServerSession>> {
        let sess = self.lock().remove(&key);
        if let Some(s) = &sess {
            s.end();
        }
        sess
    }

    /// Every session with its key (a copy of the table: for listing, not per IO).
    pub fn all(&self) -> Vec<(K, Arc<RnbdServerSession>)> {
        self.lock()
            .iter()
            .map(|(k, s)| (*k, Arc::clone(s)))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Arc<RnbdServerSession>>> {
        // Inserts and removes leave the map consistent at every step.
        lock(&self.map)
    }
}

/// One core's view of a [`RnbdSessions`].
pub struct SessionCache<K> {
    table: Arc<RnbdSessions<K>>,
    /// The sessions seen on this core, but for `last`.
    local: HashMap<K, SessionView>,
    /// The session of the last request: consecutive requests mostly come from one
    /// session, and comparing a key is cheaper than hashing it.
    last: Option<(K, SessionView)>,
}

impl<K: Copy + Eq + Hash> SessionCache<K> {
    pub fn new(table: Arc<RnbdSessions<K>>) -> SessionCache<K> {
        SessionCache {
            table,
            local: HashMap::new(),
            last: None,
        }
    }

    pub fn table(&self) -> &Arc<RnbdSessions<K>> {
        &self.table
    }

    /// The live session of `key`, from the cache or else the table; `None` when the
    /// RTRS session has none (not connected yet, or gone).
    pub fn session(&mut self, key: K) -> Option<&mut SessionView> {
        let hit = matches!(&self.last, Some((k, s)) if *k == key && !s.is_ended());
        if !hit {
            if let Some((k, s)) = self.last.take() {
                if !s.is_ended() {
                    self.local.insert(k, s);
                }
            }
            let view = match self.local.remove(&key) {
                Some(s) if !s.is_ended() => s,
                _ => SessionView::new(self.table.get(key)?),
            };
            self.last = Some((key, view));
        }
        self.last.as_mut().map(|(_, s)| s)
    }

    /// As [`session`](Self::session), creating the session (named `name`) in the table
    /// when there is none: for SESS_INFO or OPEN arriving on a core before the link
    /// event that creates it was handled.
    pub fn session_or_create(&mut self, key: K, name: &str) -> &mut SessionView {
        if self.session(key).is_none() {
            let fresh = self.table.get_or_create(key, name);
            self.last = Some((key, SessionView::new(fresh)));
        }
        let (_, view) = self
            .last
            .as_mut()
            .expect("session() or the line above set the last session");
        view
    }

    /// Forgets `key` on this core (the table is not touched).
    pub fn forget(&mut self, key: K) {
        self.local.remove(&key);
        if matches!(&self.last, Some((k, _)) if *k == key) {
            self.last = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::rnbd::{AccessMode, Open};

    #[test]
    fn cores_share_sessions_and_drop_ended_ones() {
        let ex = Arc::new(Exports::ram(&[("a", 4096)]).unwrap());
        let table = Arc::new(RnbdSessions::<u32>::new(ex.clone()));
        let mut c0 = SessionCache::new(table.clone());
        let mut c1 = SessionCache::new(table.clone());
        assert!(c0.session(7).is_none());
        let s = Arc::clone(c0.session_or_create(7, "clt").session());
        let open = Open {
            access_mode: AccessMode::ReadWrite,
            dev_name: b"a",
        };
        assert_eq!(s.open(&open, None).unwrap().device_id, 0);
        // Core 1 finds the same session (and its device).
        assert!(c1.session(7).unwrap().lookup(0).is_some());
        assert_eq!(c1.session_or_create(7, "other name").name(), "clt");
        assert_eq!(table.len(), 1);
        // The last path goes: the session ends everywhere.
        let gone = table.remove(7).unwrap();
        assert!(gone.is_ended());
        assert_eq!(ex.writers(ex.lookup(b"a").unwrap()), 0);
        // A core still caching it no longer finds it; a new one is a new, empty session.
        assert!(c1.session(7).is_none());
        let again = Arc::clone(c1.session_or_create(7, "clt").session());
        assert!(!Arc::ptr_eq(&again, &gone));
        assert!(again.lookup(0).is_none());
        c0.forget(7);
        assert!(Arc::ptr_eq(c0.session(7).unwrap().session(), &again));
        assert!(table.remove(8).is_none());
    }
}
