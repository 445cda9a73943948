//! The fabric conformance suite: the contract of `src/fabric/mod.rs`, checked scenario by
//! scenario against any backend, unchanged.
//!
//! A backend's test file provides a [`Backend`] (two fabric instances modelling two
//! hosts, and an address to listen on) and expands [`conformance_tests!`], which makes one
//! `#[test]` per scenario:
//!
//! ```ignore
//! #[macro_use]
//! mod conformance;
//!
//! struct Tcp { server: Arc<TcpFabric>, client: Arc<TcpFabric> }
//! impl conformance::Backend for Tcp {
//!     fn server_fabric(&self) -> Arc<dyn Fabric> { self.server.clone() }
//!     fn client_fabric(&self) -> Arc<dyn Fabric> { self.client.clone() }
//!     fn listen_addr(&self) -> SocketAddr { "127.0.0.1:0".parse().unwrap() }
//! }
//! conformance_tests!(Tcp { server: Arc::new(TcpFabric::new()), client: Arc::new(TcpFabric::new()) });
//! ```
//!
//! The expression is evaluated afresh for every test. A backend that knowingly
//! deviates lists the scenario in [`Backend::expected_failures`] (with the reason); the
//! test then checks that it still fails, so a fix is noticed.
//!
//! Scenarios use only the traits of `rtrs_spdk::fabric`, and one test thread polls both
//! ends. Every wait is bounded by [`DEADLINE`] and panics with what it was waiting for
//! (and every completion and CM event seen so far); nothing asserts on timing.

pub mod cm;
pub mod data;
pub mod domains;
pub mod errors;
pub mod keys;
pub mod shared_cq;

use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::{
    Access, CmEvent, Conn, ConnState, CqRef, Fabric, Listener, MemBuf, Mr, PostError, QpCaps,
    RecvWr, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus,
};

/// Upper bound of every wait in the suite: generous, never a performance figure.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Poll rounds used to give a backend every chance to do something it must not do
/// (deliver before a receive is posted, complete an unsignaled request).
pub const SETTLE_ROUNDS: usize = 2000;

/// What a backend's test file provides.
pub trait Backend {
    /// The fabric of the accepting host (registrations of the server side live here).
    fn server_fabric(&self) -> Arc<dyn Fabric>;
    /// The fabric of the connecting host; may be the same instance as the server's.
    fn client_fabric(&self) -> Arc<dyn Fabric>;
    /// Where the server listens (port 0: any free port).
    fn listen_addr(&self) -> SocketAddr;
    /// Queue sizes both ends ask for, unless a scenario needs others.
    fn caps(&self) -> QpCaps {
        QpCaps::default()
    }
    /// Where this backend's device is known to report differently from what hardware
    /// must (a software device's deviations); none by default.
    fn quirks(&self) -> Quirks {
        Quirks::default()
    }
    /// Scenarios (by function name) this backend is known to fail, each with the
    /// reason. They still run: the test passes only while the scenario does fail, so a
    /// fix shows up as a test asking to remove the entry.
    fn expected_failures(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }
}

/// A device's known deviations from the verbs specification, which scenarios allow for
/// by name so that what every other device must do stays checked. Soft-RoCE (`rxe`) has
/// them, some only in some kernel series (the verbs test file keys them by version;
/// docs/INTEROP.md lists them); hardware and the software fabrics none.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quirks {
    /// A local SGE naming an unknown lkey completes as `LocalQpOperation` (one outside
    /// its region still as `LocalProtection`).
    pub unknown_lkey_as_qp_operation: bool,
    /// A receive too short for an incoming SEND completes as `LocalQpOperation`.
    pub short_receive_as_qp_operation: bool,
    /// A receive consumed by a SEND_WITH_INV does not report the invalidated rkey (the
    /// device sets the kernel's flag value, which user space reads as another flag).
    pub no_invalidated_rkey: bool,
    /// A SEND_WITH_INV the receiver refuses completes successfully at the sender; the
    /// receiver's completion carries the error and both sides disconnect.
    pub refused_inv_succeeds_at_sender: bool,
    /// A request that fails at the sender (a bad local SGE, a REG_MR the device refuses)
    /// completes as `WrFlush`, not with its error: the device moves the queue pair to
    /// the error state before reporting the request, and the flush that follows reports
    /// it with every request behind it.
    pub local_error_as_flush: bool,
}

impl Quirks {
    /// What an SGE naming an unknown lkey completes with on this device.
    pub fn unknown_lkey(&self) -> WcStatus {
        if self.unknown_lkey_as_qp_operation {
            WcStatus::LocalQpOperation
        } else {
            WcStatus::LocalProtection
        }
    }

    /// What a request failing at the sender with `status` completes with on this device.
    pub fn local_error(&self, status: WcStatus) -> WcStatus {
        if self.local_error_as_flush {
            WcStatus::WrFlush
        } else {
            status
        }
    }

    /// What a receive too short for an incoming SEND completes with on this device.
    pub fn local_length(&self) -> WcStatus {
        if self.short_receive_as_qp_operation {
            WcStatus::LocalQpOperation
        } else {
            WcStatus::LocalLength
        }
    }
}

/// Runs one scenario, honouring [`Backend::expected_failures`].
pub fn run<B: Backend>(backend: &B, name: &str, scenario: fn(&dyn Backend)) {
    let Some((_, why)) = backend.expected_failures().iter().find(|(n, _)| *n == name) else {
        scenario(backend);
        return;
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(backend)));
    assert!(
        outcome.is_err(),
        "{name} is listed as an expected failure ({why}) but passes: remove it from \
         expected_failures"
    );
    eprintln!("{name}: failed as expected ({why})");
}

/// Expands to one `#[test]` per scenario, each with a fresh `$backend`;
/// `conformance_tests!(ignore = "why", backend)` marks every one `#[ignore]`;
/// `conformance_tests!(shared_cq, backend)` expands the shared-CQ scenarios only (for a
/// backend's variants that differ only there, such as tcp's readiness modes).
#[macro_export]
macro_rules! conformance_tests {
    (@one [$(#[$attr:meta])*] $backend:expr; $module:ident :: $name:ident) => {
        #[test]
        $(#[$attr])*
        fn $name() {
            let backend = $backend;
            $crate::conformance::run(
                &backend,
                stringify!($name),
                $crate::conformance::$module::$name,
            );
        }
    };
    (@each $attrs:tt $backend:expr; $($module:ident :: $name:ident),+ $(,)?) => {
        $( $crate::conformance_tests!(@one $attrs $backend; $module :: $name); )+
    };
    (@list $attrs:tt $backend:expr) => {
        $crate::conformance_tests!(@each $attrs $backend;
            cm::accept_carries_private_data_both_ways,
            cm::reject_carries_private_data,
            cm::addresses_and_state,
            cm::connections_are_independent,
            cm::dropped_request_rejects,
            cm::connect_to_nobody_fails,
            cm::setup_errors_keep_their_cause,
            data::send_into_posted_receive,
            data::send_with_imm_reports_imm,
            data::write_then_imm_is_ordered,
            data::many_operations_stay_in_order,
            data::write_with_imm_reports_len_and_imm,
            data::zero_length_write_with_imm_needs_no_key,
            data::unsignaled_requests_free_slots,
            data::queue_full_without_signaling,
            data::unsignaled_slots_held_until_a_completion,
            data::server_writes_into_client,
            data::receive_not_ready_waits,
            data::push_transmits_without_another_poll,
            errors::unknown_rkey_breaks_connection,
            errors::write_past_region_end_is_remote_access,
            errors::write_without_remote_write_right_is_remote_access,
            errors::bad_lkey_is_local_protection,
            errors::sge_outside_region_is_local_protection,
            errors::short_receive_buffer_is_local_length,
            errors::receive_with_bad_lkey_is_local_protection,
            errors::post_errors_name_the_index,
            errors::disconnect_flushes_outstanding_work,
            errors::disconnect_flushes_peer_receives,
            keys::reg_mr_binds_new_rkey,
            keys::local_inv_retires_rkey,
            keys::local_ops_take_effect_at_post,
            keys::local_ops_done_at_once_without_a_work_request,
            keys::send_with_inv_retires_peer_rkey,
            keys::send_with_inv_of_unknown_rkey_is_refused,
            keys::send_with_inv_of_a_domain_key_is_refused,
            keys::domain_key_is_valid_on_every_connection,
            domains::keys_of_another_domain_are_refused,
            domains::a_domain_shares_its_device_completion_queues,
            keys::bind_outside_region_fails,
            keys::rebinding_a_bound_slot_fails,
            shared_cq::private_cq_completions_carry_qp_num,
            shared_cq::shared_cq_keeps_per_connection_order,
            shared_cq::shared_cq_break_leaves_the_others,
            shared_cq::shared_cq_busy_connection_does_not_starve_another,
            shared_cq::shared_cq_overrun_is_reported,
            shared_cq::shared_cq_sees_a_peer_vanish,
            shared_cq::shared_cq_idle_then_busy_loses_nothing,
            shared_cq::shared_cq_hands_out_a_connection_before_the_next_lands,
        );
    };
    (shared_cq, $backend:expr) => {
        $crate::conformance_tests!(@each [] $backend;
            shared_cq::private_cq_completions_carry_qp_num,
            shared_cq::shared_cq_keeps_per_connection_order,
            shared_cq::shared_cq_break_leaves_the_others,
            shared_cq::shared_cq_busy_connection_does_not_starve_another,
            shared_cq::shared_cq_overrun_is_reported,
            shared_cq::shared_cq_sees_a_peer_vanish,
            shared_cq::shared_cq_idle_then_busy_loses_nothing,
            shared_cq::shared_cq_hands_out_a_connection_before_the_next_lands,
        );
    };
    (ignore = $why:literal, $backend:expr) => {
        $crate::conformance_tests!(@list [#[ignore = $why]] $backend);
    };
    ($backend:expr) => {
        $crate::conformance_tests!(@list [] $backend);
    };
}

/// One end of a connection with the completions and CM events already polled from it.
pub struct Side {
    pub conn: Box<dyn Conn>,
    pub fabric: Arc<dyn Fabric>,
    wcs: VecDeque<Wc>,
    cm: VecDeque<CmEvent>,
    name: &'static str,
}

impl Side {
    pub fn new(name: &'static str, conn: Box<dyn Conn>, fabric: Arc<dyn Fabric>) -> Side {
        Side {
            conn,
            fabric,
            wcs: VecDeque::new(),
            cm: VecDeque::new(),
            name,
        }
    }

    /// Polls the CQ and the CM once; returns whether anything came out.
    pub fn pump(&mut self) -> bool {
        let mut buf = [Wc::default(); 16];
        let n = self.conn.poll_cq(&mut buf);
        self.wcs.extend(&buf[..n]);
        let mut any = n > 0;
        while let Some(ev) = self.conn.poll_cm() {
            self.cm.push_back(ev);
            any = true;
        }
        any
    }

    /// Completions polled so far and not yet taken.
    pub fn pending_wcs(&self) -> &VecDeque<Wc> {
        &self.wcs
    }

    /// Takes every completion polled so far.
    pub fn drain_wcs(&mut self) -> Vec<Wc> {
        self.wcs.drain(..).collect()
    }

    /// Registers `len` zeroed bytes on this side's fabric.
    pub fn reg(&self, len: usize, access: Access) -> Mr {
        self.fabric
            .register(MemBuf::zeroed(len), access)
            .unwrap_or_else(|e| panic!("{}: register {len} bytes: {e}", self.name))
    }

    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) {
        let name = self.name;
        self.conn
            .post_send(wrs)
            .unwrap_or_else(|e| panic!("{name}: post_send: {e}"));
    }

    pub fn post_recv(&mut self, wrs: &[RecvWr]) {
        let name = self.name;
        self.conn
            .post_recv(wrs)
            .unwrap_or_else(|e| panic!("{name}: post_recv: {e}"));
    }

    pub fn try_post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        self.conn.post_send(wrs)
    }
}

/// A connected client/server pair (the listener is kept so the address stays taken).
pub struct Pair {
    pub client: Side,
    pub server: Side,
    pub listener: Box<dyn Listener>,
}

/// Polls both sides until `done` says so, panicking after [`DEADLINE`] with `what`.
pub fn pump_until(a: &mut Side, b: &mut Side, what: &str, mut done: impl FnMut(&mut Side) -> bool) {
    let start = Instant::now();
    loop {
        if done(a) {
            return;
        }
        let progressed = a.pump() | b.pump();
        if done(a) {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{}: timed out after {DEADLINE:?} waiting for {what}; completions so far {:?}, \
             CM events {:?}; peer completions {:?}, peer CM events {:?}",
            a.name,
            a.wcs,
            a.cm,
            b.wcs,
            b.cm
        );
        if !progressed {
            std::thread::yield_now();
        }
    }
}

/// Polls both sides a fixed number of rounds (to let anything that should not happen
/// happen).
pub fn settle(a: &mut Side, b: &mut Side) {
    for _ in 0..SETTLE_ROUNDS {
        if !(a.pump() | b.pump()) {
            std::thread::yield_now();
        }
    }
}

/// The first completion of `a` matching `pred` (earlier non-matching ones stay queued),
/// polling `b` too so the peer makes progress.
pub fn wait_wc(a: &mut Side, b: &mut Side, what: &str, pred: impl Fn(&Wc) -> bool) -> Wc {
    let mut found = None;
    pump_until(a, b, what, |s| {
        if let Some(i) = s.wcs.iter().position(&pred) {
            found = s.wcs.remove(i);
            true
        } else {
            false
        }
    });
    found.expect("found")
}

/// The next completion of `a`, in completion order.
pub fn next_wc(a: &mut Side, b: &mut Side, what: &str) -> Wc {
    let mut found = None;
    pump_until(a, b, what, |s| {
        found = s.wcs.pop_front();
        found.is_some()
    });
    found.expect("found")
}

/// The completion of `wr_id` on `a`.
pub fn wait_wr(a: &mut Side, b: &mut Side, wr_id: u64) -> Wc {
    wait_wc(a, b, &format!("the completion of wr_id {wr_id}"), |wc| {
        wc.wr_id == wr_id
    })
}

/// The first CM event of `a` matching `pred`.
pub fn wait_cm(a: &mut Side, b: &mut Side, what: &str, pred: impl Fn(&CmEvent) -> bool) -> CmEvent {
    let mut found = None;
    pump_until(a, b, what, |s| {
        if let Some(i) = s.cm.iter().position(&pred) {
            found = s.cm.remove(i);
            true
        } else {
            false
        }
    });
    found.expect("found")
}

/// Waits until both sides have seen `CmEvent::Disconnected` and report that state.
pub fn wait_both_disconnected(p: &mut Pair) {
    let is_disc = |e: &CmEvent| matches!(e, CmEvent::Disconnected);
    wait_cm(
        &mut p.client,
        &mut p.server,
        "CmEvent::Disconnected",
        is_disc,
    );
    wait_cm(
        &mut p.server,
        &mut p.client,
        "CmEvent::Disconnected",
        is_disc,
    );
    assert_eq!(
        p.client.conn.state(),
        ConnState::Disconnected,
        "client state after disconnect"
    );
    assert_eq!(
        p.server.conn.state(),
        ConnState::Disconnected,
        "server state after disconnect"
    );
}

/// Listens on the backend's address and starts a connect to it: the listener, the
/// connecting side, and the server's fabric.
pub fn start_connect(
    b: &dyn Backend,
    caps: QpCaps,
    private_data: &[u8],
) -> (Box<dyn Listener>, Side, Arc<dyn Fabric>) {
    let sf = b.server_fabric();
    let cf = b.client_fabric();
    let listener = sf
        .listen(b.listen_addr(), &ListenOptions::default())
        .unwrap_or_else(|e| panic!("listen on {}: {e}", b.listen_addr()));
    let conn = cf
        .connect(
            listener.local_addr(),
            &ConnectOptions::new(caps, private_data),
        )
        .unwrap_or_else(|e| panic!("connect to {}: {e}", listener.local_addr()));
    (listener, Side::new("client", conn, cf), sf)
}

/// Polls the listener (and the connecting side) until a request arrives.
pub fn wait_request(
    listener: &mut dyn Listener,
    client: &mut Side,
) -> rtrs_spdk::fabric::ConnRequest {
    let start = Instant::now();
    loop {
        if let Some(req) = listener.poll() {
            return req;
        }
        let progressed = client.pump();
        assert!(
            start.elapsed() < DEADLINE,
            "timed out after {DEADLINE:?} waiting for a connection request on {}; client CM \
             events {:?}",
            listener.local_addr(),
            client.cm
        );
        if !progressed {
            std::thread::yield_now();
        }
    }
}

/// Connects a pair with `caps` on both ends and the given private data; both sides have
/// seen `Established` when it returns (their CM queues are empty).
pub fn connect_with(b: &dyn Backend, caps: QpCaps, client_pd: &[u8], server_pd: &[u8]) -> Pair {
    let (mut listener, mut client, sf) = start_connect(b, caps, client_pd);
    let req = wait_request(&mut *listener, &mut client);
    let conn = req
        .accept(caps, server_pd)
        .unwrap_or_else(|e| panic!("accept: {e}"));
    let mut server = Side::new("server", conn, sf);
    let est = |e: &CmEvent| matches!(e, CmEvent::Established { .. });
    wait_cm(&mut client, &mut server, "CmEvent::Established", est);
    wait_cm(&mut server, &mut client, "CmEvent::Established", est);
    Pair {
        client,
        server,
        listener,
    }
}

/// Connects a pair whose server end is accepted into protection domain `domain` (a
/// [`Fabric::domain`] of the server's fabric), on `cq` when given (a completion queue of
/// the server's device); the server side registers through `domain`.
pub fn connect_into(b: &dyn Backend, domain: Arc<dyn Fabric>, cq: Option<&CqRef>) -> Pair {
    let caps = b.caps();
    let (mut listener, mut client, _) = start_connect(b, caps, &[]);
    let req = wait_request(&mut *listener, &mut client);
    let conn = req
        .accept_into(&*domain, cq, caps, &[])
        .unwrap_or_else(|e| panic!("accept_into: {e}"));
    let mut server = Side::new("server", conn, domain);
    let est = |e: &CmEvent| matches!(e, CmEvent::Established { .. });
    wait_cm(&mut client, &mut server, "CmEvent::Established", est);
    wait_cm(&mut server, &mut client, "CmEvent::Established", est);
    Pair {
        client,
        server,
        listener,
    }
}

/// Connects a pair with the backend's caps and no private data.
pub fn connect(b: &dyn Backend) -> Pair {
    connect_with(b, b.caps(), &[], &[])
}

/// A byte pattern that differs per `seed` and per position.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add(i as u8).wrapping_add(1))
        .collect()
}

pub fn read(mr: &Mr, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    mr.read_at(offset, &mut out);
    out
}

/// A signaled send work request.
pub fn wr<'a>(wr_id: u64, op: SendOp<'a>, sges: &'a [Sge]) -> SendWr<'a> {
    SendWr {
        wr_id,
        op,
        sges,
        signaled: true,
    }
}

/// An unsignaled send work request.
pub fn wr_unsignaled<'a>(wr_id: u64, op: SendOp<'a>, sges: &'a [Sge]) -> SendWr<'a> {
    SendWr {
        wr_id,
        op,
        sges,
        signaled: false,
    }
}

/// Asserts a completion's status and opcode, naming the scenario step.
pub fn expect(wc: &Wc, status: WcStatus, opcode: WcOpcode, step: &str) {
    assert_eq!(wc.status, status, "{step}: status of {wc:?}");
    if status.is_ok() {
        assert_eq!(wc.opcode, opcode, "{step}: opcode of {wc:?}");
    }
}

/// An rkey no registration of this test has: the index bits of `rkey` flipped.
pub fn bogus_rkey(rkey: u32) -> u32 {
    rkey ^ 0x00ff_ff00
}

/// Posts `wrs` on `a`, polling both sides and retrying the rest of the chain while the
/// send queue is full.
pub fn post_send_retrying(a: &mut Side, b: &mut Side, wrs: &[SendWr<'_>]) {
    let mut from = 0;
    let start = Instant::now();
    while from < wrs.len() {
        match a.conn.post_send(&wrs[from..]) {
            Ok(()) => return,
            Err(PostError {
                index,
                kind: rtrs_spdk::fabric::PostErrorKind::QueueFull,
            }) => {
                from += index;
                assert!(
                    start.elapsed() < DEADLINE,
                    "{}: send queue stayed full",
                    a.name
                );
                if !(a.pump() | b.pump()) {
                    std::thread::yield_now();
                }
            }
            Err(e) => panic!("{}: post_send: {e}", a.name),
        }
    }
}
