//! A completion queue shared by verbs connections: one `ibv_cq` that the queue pairs
//! made on it report to, as a polled-mode engine shares one CQ per core.
//!
//! The hardware keeps the completions; what the CQ adds is the software shadow of each
//! queue pair's queues (`slots.rs`: queue sizes counted as the contract counts them,
//! opcodes of failed completions), which a completion must update and a post must read.
//! The shadows of all connections of the CQ live in one [`Shadows`] reached by the CQ and
//! by each connection through [`OwnedByThread`] (one thread at a time, a plain load per
//! call). A failed completion marks its connection, which breaks it at its next poll (as
//! a private CQ's connection does at once). `IBV_EVENT_CQ_ERR`, read from the device's
//! asynchronous events, is the overrun: [`CqEvent::Overrun`], and every connection of
//! the CQ breaks.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use super::slots::QueueSlots;
use super::sys::{self, AsyncEvent, PollBuf};
use super::{wc, Shared};
use crate::fabric::cq::OwnedByThread;
use crate::fabric::{CqBackend, CqEvent, QpCaps, Wc};

/// One connection's shadow queues.
pub(super) struct Shadow {
    pub slots: QueueSlots,
    /// A completion of the connection failed (or the CQ overran): break it.
    pub failed: bool,
}

/// The shadows of every connection of one CQ, by slot and by queue-pair number.
#[derive(Default)]
pub(super) struct Shadows {
    slots: Vec<Option<Shadow>>,
    free: Vec<usize>,
    by_qp: HashMap<u32, usize>,
    overrun: bool,
}

pub(super) type Link = OwnedByThread<Shadows>;

impl Shadows {
    /// A shadow for a new connection with queues of `caps`; `None` once the CQ overran.
    pub fn add(&mut self, caps: QpCaps) -> Option<usize> {
        if self.overrun {
            return None;
        }
        let shadow = Shadow {
            slots: QueueSlots::new(caps),
            failed: false,
        };
        Some(match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(shadow);
                i
            }
            None => {
                self.slots.push(Some(shadow));
                self.slots.len() - 1
            }
        })
    }

    /// The connection in slot `idx` has queue pair `qp_num`.
    pub fn bind(&mut self, idx: usize, qp_num: u32) {
        self.by_qp.insert(qp_num, idx);
    }

    pub fn remove(&mut self, idx: usize) {
        if self.slots.get_mut(idx).and_then(Option::take).is_some() {
            self.by_qp.retain(|_, i| *i != idx);
            self.free.push(idx);
        }
    }

    pub fn get(&mut self, idx: usize) -> Option<&mut Shadow> {
        self.slots.get_mut(idx).and_then(Option::as_mut)
    }

    /// Whether the connection in slot `idx` must break (once per failure).
    pub fn take_failed(&mut self, idx: usize) -> bool {
        self.get(idx).is_some_and(|s| std::mem::take(&mut s.failed))
    }
}

/// A verbs CQ shared by connections.
pub(super) struct VerbsCq {
    pub shared: Arc<Shared>,
    pub cq: Arc<sys::Cq>,
    pub link: Arc<Link>,
    buf: PollBuf,
    entries: u32,
    event: Option<CqEvent>,
    overran: bool,
    poll_error_logged: bool,
}

impl VerbsCq {
    /// The CQ's entries are what the device gave it (providers round up).
    pub fn new(shared: Arc<Shared>, cq: Arc<sys::Cq>) -> VerbsCq {
        let entries = cq.entries();
        VerbsCq {
            shared,
            cq,
            link: Arc::new(OwnedByThread::new(Shadows::default())),
            buf: PollBuf::new(),
            entries,
            event: None,
            overran: false,
            poll_error_logged: false,
        }
    }

    /// Reads the device's asynchronous events: this CQ's error is kept here, other CQs'
    /// are left with the fabric for their own poll.
    fn read_async_events(&mut self) {
        let mut others = self
            .shared
            .cq_errors
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        loop {
            match self.shared.pd.device().next_async_event() {
                Ok(None) => break,
                Ok(Some(AsyncEvent::CqError { cq })) => others.push(cq),
                Ok(Some(AsyncEvent::Other(kind))) => {
                    tracing::debug!(kind, "verbs asynchronous event");
                }
                Err(e) => {
                    tracing::warn!("{e}");
                    break;
                }
            }
        }
        let before = others.len();
        others.retain(|&cq| !self.cq.is(cq));
        if others.len() < before && !self.overran {
            self.overran = true;
            self.event = Some(CqEvent::Overrun);
            self.link.with(|sh| {
                sh.overrun = true;
                for s in sh.slots.iter_mut().flatten() {
                    s.failed = true;
                }
            });
        }
    }
}

impl CqBackend for VerbsCq {
    fn poll(&mut self, wcs: &mut [Wc]) -> usize {
        let VerbsCq {
            cq,
            link,
            buf,
            poll_error_logged,
            ..
        } = self;
        link.with(|sh| {
            let mut filled = 0;
            while filled < wcs.len() {
                let out = &mut wcs[filled..];
                let mut k = 0;
                let res = cq.poll(buf, out.len(), |raw| {
                    let mut w = wc::completion(&raw);
                    let idx = sh.by_qp.get(&raw.qp_num).copied();
                    if let Some(s) = idx.and_then(|i| sh.get(i)) {
                        s.slots.completed(&mut w, raw.opcode.is_some());
                        s.failed |= !w.status.is_ok();
                    }
                    out[k] = w;
                    k += 1;
                });
                match res {
                    Ok(0) => break,
                    Ok(got) => filled += got,
                    Err(e) => {
                        if !*poll_error_logged {
                            *poll_error_logged = true;
                            tracing::error!("shared completion queue: {e}");
                        }
                        break;
                    }
                }
            }
            filled
        })
        .unwrap_or(0)
    }

    fn poll_event(&mut self) -> Option<CqEvent> {
        self.read_async_events();
        self.event.take()
    }

    fn entries(&self) -> u32 {
        self.entries
    }

    fn release_thread(&self) {
        self.link.release();
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
