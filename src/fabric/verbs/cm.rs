//! The connection-manager state machine of one verbs connection, as pure transitions:
//! which rdma_cm event moves the connection where, what to do next, and what to report.
//! This is the userspace counterpart of the kernel's `rtrs_clt_rdma_cm_handler` (active
//! side: ADDR_RESOLVED → create QP and resolve route, ROUTE_RESOLVED → connect,
//! ESTABLISHED / REJECTED / errors) and `rtrs_srv_rdma_cm_handler` (passive side).
//!
//! Kept free of I/O so it is tested here without a device; `conn.rs` carries out the
//! steps.

use super::sys::CmEventKind;
use crate::fabric::{CmEvent, PrivateData};

/// Where a connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CmPhase {
    /// Active side: `rdma_resolve_addr` issued.
    ResolvingAddr,
    /// Active side: QP created, `rdma_resolve_route` issued.
    ResolvingRoute,
    /// Active side: `rdma_connect` issued.
    Connecting,
    /// Passive side: `rdma_accept` issued (the QP can already send).
    Accepting,
    Established,
    /// `rdma_disconnect` issued; waiting for DISCONNECTED.
    Closing,
    /// Gone; the closing event has been (or is being) reported.
    Closed,
}

impl CmPhase {
    pub fn before_established(self) -> bool {
        matches!(
            self,
            CmPhase::ResolvingAddr
                | CmPhase::ResolvingRoute
                | CmPhase::Connecting
                | CmPhase::Accepting
        )
    }
}

/// What to do after an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    Nothing,
    /// Create CQ and QP on the resolved device, then `rdma_resolve_route`.
    CreateQpThenResolveRoute,
    /// `rdma_connect` with the connection's private data.
    Connect,
    Report(CmEvent),
    /// Move the QP to the error state (outstanding work flushes), then report.
    FlushAndReport(CmEvent),
}

/// The reject status of a reject by the peer's application (the kernel's
/// `rdma_is_consumer_reject`): IB CM's "consumer defined" reason over InfiniBand and
/// RoCE, `-ECONNREFUSED` over iWARP. Other rejects come from the peer's CM itself.
const IB_CM_REJ_CONSUMER_DEFINED: i32 = 28;

pub(super) fn is_consumer_reject(status: i32) -> bool {
    status == IB_CM_REJ_CONSUMER_DEFINED || status == -libc::ECONNREFUSED
}

fn status_text(status: i32) -> String {
    if status < 0 {
        std::io::Error::from_raw_os_error(-status).to_string()
    } else {
        format!("status {status}")
    }
}

/// The transition for `kind` (with `status` and private data) in `phase`.
pub(super) fn on_event(
    phase: CmPhase,
    kind: CmEventKind,
    status: i32,
    data: PrivateData,
    passive: bool,
) -> (CmPhase, Step) {
    use CmEventKind as K;
    let error = |reason: String| {
        (
            CmPhase::Closed,
            Step::FlushAndReport(CmEvent::Error { reason }),
        )
    };
    match (phase, kind) {
        (CmPhase::Closed, _) => (CmPhase::Closed, Step::Nothing),
        (CmPhase::ResolvingAddr, K::AddrResolved) => {
            (CmPhase::ResolvingRoute, Step::CreateQpThenResolveRoute)
        }
        (CmPhase::ResolvingRoute, K::RouteResolved) => (CmPhase::Connecting, Step::Connect),
        (CmPhase::Connecting | CmPhase::Accepting, K::Established) => {
            let private_data = if passive { PrivateData::empty() } else { data };
            (
                CmPhase::Established,
                Step::Report(CmEvent::Established { private_data }),
            )
        }
        (CmPhase::Connecting, K::Rejected) if is_consumer_reject(status) => (
            CmPhase::Closed,
            Step::FlushAndReport(CmEvent::Rejected { private_data: data }),
        ),
        (CmPhase::Connecting, K::Rejected) => error(format!(
            "the peer's connection manager rejected the request (reason {status}; 8 means \
             nothing listens on that port)"
        )),
        (p, K::AddrError) if p.before_established() => error(format!(
            "address resolution failed ({}); is the address reachable through an RDMA device?",
            status_text(status)
        )),
        (p, K::RouteError) if p.before_established() => {
            error(format!("route resolution failed ({})", status_text(status)))
        }
        (p, K::Unreachable) if p.before_established() => {
            error(format!("peer unreachable ({})", status_text(status)))
        }
        (p, K::ConnectError | K::Rejected | K::Disconnected) if p.before_established() => {
            error(format!(
                "connection establishment failed ({:?}, {})",
                kind,
                status_text(status)
            ))
        }
        (p, K::DeviceRemoval) if p.before_established() => {
            error("the RDMA device was removed".to_owned())
        }
        (
            CmPhase::Established | CmPhase::Closing,
            K::Disconnected | K::DeviceRemoval | K::ConnectError,
        ) => (CmPhase::Closed, Step::FlushAndReport(CmEvent::Disconnected)),
        // TIMEWAIT_EXIT, ADDR_CHANGE and anything unexpected change nothing.
        (p, _) => (p, Step::Nothing),
    }
}

/// What a local disconnect (or a failed completion) does in `phase`: `(next phase,
/// issue rdma_disconnect, event to report now)`. Once established, DISCONNECTED arrives
/// from the CM later; before that, the CM may never send one, so it is reported here.
pub(super) fn on_local_disconnect(phase: CmPhase) -> (CmPhase, bool, Option<CmEvent>) {
    match phase {
        CmPhase::Established => (CmPhase::Closing, true, None),
        p if p.before_established() => (CmPhase::Closed, true, Some(CmEvent::Disconnected)),
        p => (p, false, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CmEventKind as K;

    fn pd(b: &[u8]) -> PrivateData {
        PrivateData::new(b).unwrap()
    }

    #[test]
    fn active_side_happy_path() {
        let none = PrivateData::empty();
        let (p, s) = on_event(CmPhase::ResolvingAddr, K::AddrResolved, 0, none, false);
        assert_eq!(
            (p, s),
            (CmPhase::ResolvingRoute, Step::CreateQpThenResolveRoute)
        );
        let (p, s) = on_event(p, K::RouteResolved, 0, none, false);
        assert_eq!((p, s), (CmPhase::Connecting, Step::Connect));
        let (p, s) = on_event(p, K::Established, 0, pd(&[1, 2, 3]), false);
        assert_eq!(p, CmPhase::Established);
        assert_eq!(
            s,
            Step::Report(CmEvent::Established {
                private_data: pd(&[1, 2, 3])
            })
        );
        let (p, s) = on_event(p, K::Disconnected, 0, none, false);
        assert_eq!(
            (p, s),
            (CmPhase::Closed, Step::FlushAndReport(CmEvent::Disconnected))
        );
        assert_eq!(
            on_event(p, K::TimewaitExit, 0, none, false),
            (CmPhase::Closed, Step::Nothing)
        );
    }

    #[test]
    fn passive_side_established_carries_no_data() {
        let (p, s) = on_event(CmPhase::Accepting, K::Established, 0, pd(&[9]), true);
        assert_eq!(p, CmPhase::Established);
        assert_eq!(
            s,
            Step::Report(CmEvent::Established {
                private_data: PrivateData::empty()
            })
        );
    }

    #[test]
    fn consumer_reject_carries_private_data_other_rejects_are_errors() {
        let (p, s) = on_event(CmPhase::Connecting, K::Rejected, 28, pd(&[5; 56]), false);
        assert_eq!(p, CmPhase::Closed);
        assert_eq!(
            s,
            Step::FlushAndReport(CmEvent::Rejected {
                private_data: pd(&[5; 56])
            })
        );
        let (_, s) = on_event(
            CmPhase::Connecting,
            K::Rejected,
            -libc::ECONNREFUSED,
            pd(&[1]),
            false,
        );
        assert!(matches!(s, Step::FlushAndReport(CmEvent::Rejected { .. })));
        let (p, s) = on_event(
            CmPhase::Connecting,
            K::Rejected,
            8,
            PrivateData::empty(),
            false,
        );
        assert_eq!(p, CmPhase::Closed);
        match s {
            Step::FlushAndReport(CmEvent::Error { reason }) => {
                assert!(reason.contains("reason 8"), "{reason}")
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn resolution_failures_are_errors_naming_the_cause() {
        let none = PrivateData::empty();
        let (p, s) = on_event(
            CmPhase::ResolvingAddr,
            K::AddrError,
            -libc::ETIMEDOUT,
            none,
            false,
        );
        assert_eq!(p, CmPhase::Closed);
        match s {
            Step::FlushAndReport(CmEvent::Error { reason }) => {
                assert!(reason.contains("address resolution failed"), "{reason}")
            }
            other => panic!("unexpected {other:?}"),
        }
        let (_, s) = on_event(
            CmPhase::Connecting,
            K::Unreachable,
            -libc::ETIMEDOUT,
            none,
            false,
        );
        assert!(matches!(s, Step::FlushAndReport(CmEvent::Error { .. })));
    }

    #[test]
    fn local_disconnect() {
        assert_eq!(
            on_local_disconnect(CmPhase::Established),
            (CmPhase::Closing, true, None)
        );
        assert_eq!(
            on_local_disconnect(CmPhase::Connecting),
            (CmPhase::Closed, true, Some(CmEvent::Disconnected))
        );
        assert_eq!(
            on_local_disconnect(CmPhase::Closed),
            (CmPhase::Closed, false, None)
        );
        assert_eq!(
            on_local_disconnect(CmPhase::Closing),
            (CmPhase::Closing, false, None)
        );
    }

    #[test]
    fn out_of_order_events_change_nothing() {
        let none = PrivateData::empty();
        assert_eq!(
            on_event(CmPhase::Established, K::RouteResolved, 0, none, false),
            (CmPhase::Established, Step::Nothing)
        );
        assert_eq!(
            on_event(CmPhase::ResolvingRoute, K::AddrResolved, 0, none, false),
            (CmPhase::ResolvingRoute, Step::Nothing)
        );
    }
}
