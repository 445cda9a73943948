//! Connection-manager scenarios: private data on REQ, REP and REJ, addresses, states.

use rtrs_spdk::fabric::{
    CapsError, CmEvent, ConnState, FabricError, PrivateData, QpCaps, SetupCause, PRIVATE_DATA_LEN,
};
use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};

use super::{connect_with, pattern, start_connect, wait_cm, wait_request, Backend, Side};

/// Private data arrives zero-padded, never shorter than what was sent.
fn assert_private_data(got: &PrivateData, sent: &[u8], what: &str) {
    let got = got.as_bytes();
    assert!(
        got.len() >= sent.len(),
        "{what}: {} bytes arrived, {} sent",
        got.len(),
        sent.len()
    );
    assert_eq!(&got[..sent.len()], sent, "{what}: bytes differ");
    assert!(
        got[sent.len()..].iter().all(|&b| b == 0),
        "{what}: padding is not zero: {got:?}"
    );
}

pub fn accept_carries_private_data_both_ways(b: &dyn Backend) {
    let req_pd = pattern(1, PRIVATE_DATA_LEN);
    let rep_pd = pattern(2, PRIVATE_DATA_LEN);
    let (mut listener, mut client, sf) = start_connect(b, b.caps(), &req_pd);
    assert_eq!(
        client.conn.state(),
        ConnState::Connecting,
        "state right after connect"
    );
    let req = wait_request(&mut *listener, &mut client);
    assert_private_data(&req.private_data, &req_pd, "connect request private data");
    let conn = req.accept(b.caps(), &rep_pd).expect("accept");
    let mut server = Side::new("server", conn, sf);
    let ev = wait_cm(&mut client, &mut server, "Established on the client", |e| {
        matches!(e, CmEvent::Established { .. })
    });
    let CmEvent::Established { private_data } = ev else {
        unreachable!()
    };
    assert_private_data(&private_data, &rep_pd, "accept private data");
    wait_cm(&mut server, &mut client, "Established on the server", |e| {
        matches!(e, CmEvent::Established { .. })
    });
    assert_eq!(client.conn.state(), ConnState::Connected);
    assert_eq!(server.conn.state(), ConnState::Connected);
}

pub fn reject_carries_private_data(b: &dyn Backend) {
    let rej_pd = [0xde, 0xad, 0xbe, 0xef, 5];
    let (mut listener, mut client, _sf) = start_connect(b, b.caps(), b"hello");
    let req = wait_request(&mut *listener, &mut client);
    assert_private_data(&req.private_data, b"hello", "connect request private data");
    req.reject(&rej_pd).expect("reject");
    let ev = wait_client_cm(&mut client, "Rejected");
    let CmEvent::Rejected { private_data } = ev else {
        panic!("expected CmEvent::Rejected, got {ev:?}");
    };
    assert_private_data(&private_data, &rej_pd, "reject private data");
    assert_ne!(
        client.conn.state(),
        ConnState::Connected,
        "a rejected connection is not connected"
    );
}

pub fn addresses_and_state(b: &dyn Backend) {
    let mut p = connect_with(b, b.caps(), &[], &[]);
    let server_addr = p.listener.local_addr();
    assert_eq!(
        p.client.conn.peer_addr(),
        Some(server_addr),
        "client's peer address"
    );
    let client_addr = p
        .client
        .conn
        .local_addr()
        .expect("client local address once connected");
    assert_eq!(
        p.server.conn.peer_addr(),
        Some(client_addr),
        "server's peer address"
    );
    assert!(
        p.server.conn.caps().max_send_wr >= b.caps().max_send_wr,
        "server caps"
    );
    assert!(
        p.client.conn.caps().max_send_wr >= b.caps().max_send_wr,
        "client caps"
    );
    p.client.conn.disconnect();
    super::wait_both_disconnected(&mut p);
}

/// Two connections to one listener, told apart by their private data, carry their own
/// traffic.
pub fn connections_are_independent(b: &dyn Backend) {
    use rtrs_spdk::fabric::{Access, RecvWr, SendOp, WcOpcode, WcStatus};

    let (mut listener, first, sf) = start_connect(b, b.caps(), b"one");
    let cf = first.fabric.clone();
    let c2 = cf
        .connect(
            listener.local_addr(),
            &ConnectOptions::new(b.caps(), b"two"),
        )
        .expect("second connect");
    let mut clients = [first, Side::new("client 2", c2, cf)];
    let mut servers = Vec::new();
    for _ in 0..2 {
        let req = wait_request(&mut *listener, &mut clients[servers.len()]);
        let tag = req.private_data.as_bytes()[..3].to_vec();
        let conn = req.accept(b.caps(), &tag).expect("accept");
        servers.push((tag, Side::new("server", conn, sf.clone())));
    }
    for (i, client) in clients.iter_mut().enumerate() {
        let want: &[u8] = if i == 0 { b"one" } else { b"two" };
        let (_, server) = servers
            .iter_mut()
            .find(|(t, _)| t == want)
            .expect("its server end");
        let ev = wait_cm(client, server, "Established", |e| {
            matches!(e, CmEvent::Established { .. })
        });
        let CmEvent::Established { private_data } = ev else {
            unreachable!()
        };
        assert_private_data(
            &private_data,
            want,
            "accept private data of its own connection",
        );
        wait_cm(server, client, "Established", |e| {
            matches!(e, CmEvent::Established { .. })
        });
        let rbuf = server.reg(64, Access::LOCAL_WRITE);
        let src = client.reg(64, Access::NONE);
        src.write_at(0, want);
        server.post_recv(&[RecvWr {
            wr_id: 1,
            sge: Some(rbuf.sge(0, 64)),
        }]);
        let sges = [src.sge(0, 3)];
        client.post_send(&[super::wr(2, SendOp::Send, &sges)]);
        let wc = super::wait_wr(server, client, 1);
        super::expect(
            &wc,
            WcStatus::Success,
            WcOpcode::Recv,
            "send on its own connection",
        );
        assert_eq!(
            super::read(&rbuf, 0, 3),
            want,
            "data reached the right connection"
        );
    }
}

/// A request dropped unanswered is a reject with no data.
pub fn dropped_request_rejects(b: &dyn Backend) {
    let (mut listener, mut client, _sf) = start_connect(b, b.caps(), b"dropped");
    drop(wait_request(&mut *listener, &mut client));
    let ev = wait_client_cm(&mut client, "Rejected after a dropped request");
    let CmEvent::Rejected { private_data } = ev else {
        panic!("expected CmEvent::Rejected, got {ev:?}");
    };
    assert_private_data(&private_data, &[], "private data of an implicit reject");
}

/// Connecting where nobody listens fails (refused or rejected, as the transport says).
pub fn connect_to_nobody_fails(b: &dyn Backend) {
    let dst = {
        let listener = b
            .server_fabric()
            .listen(b.listen_addr(), &ListenOptions::default())
            .expect("listen");
        listener.local_addr()
    };
    let conn = match b
        .client_fabric()
        .connect(dst, &ConnectOptions::new(b.caps(), b"anyone?"))
    {
        Ok(conn) => conn,
        // Refused at once: the contract allows failing before any event.
        Err(FabricError::Connect { .. }) => return,
        Err(e) => panic!("connect to {dst} with no listener: unexpected error {e}"),
    };
    let mut client = Side::new("client", conn, b.client_fabric());
    let ev = wait_client_cm(&mut client, "the failure of a connect to nobody");
    assert!(
        matches!(ev, CmEvent::Error { .. } | CmEvent::Rejected { .. }),
        "connect to {dst} with no listener: {ev:?}"
    );
    assert_ne!(client.conn.state(), ConnState::Connected);
}

/// Set-up errors keep their cause typed: queue sizes out of range name the field, and a
/// second listener on a taken address says so, with the OS's error whole where the
/// fabric asked the OS.
pub fn setup_errors_keep_their_cause(b: &dyn Backend) {
    let dst = b.listen_addr();
    let no_send = QpCaps {
        max_send_wr: 0,
        ..b.caps()
    };
    let err = b
        .client_fabric()
        .connect(dst, &ConnectOptions::new(no_send, b"no send queue"))
        .err()
        .expect("a connection with no send work requests is refused at once");
    assert!(matches!(err, FabricError::Connect { .. }), "{err:?}");
    let Some(cause @ SetupCause::Caps(CapsError::Field { field, asked, .. })) = err.cause() else {
        panic!("connect with max_send_wr 0: {err:?}");
    };
    assert_eq!((*field, *asked), ("max_send_wr", 0), "{err}");
    let source = std::error::Error::source(&err).expect("the cause is the error's source");
    assert_eq!(source.to_string(), cause.to_string());

    let fabric = b.server_fabric();
    let first = fabric
        .listen(b.listen_addr(), &ListenOptions::default())
        .expect("listen");
    let taken = first.local_addr();
    let err = fabric
        .listen(taken, &ListenOptions::default())
        .err()
        .expect("a second listener on a taken address");
    let FabricError::Listen { addr, cause } = &err else {
        panic!("second listen on {taken}: {err:?}");
    };
    assert_eq!(*addr, taken, "{err}");
    match &**cause {
        SetupCause::Os { source, .. } | SetupCause::OnDevice { source, .. } => {
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse, "{err}");
            // The whole chain, as a reporter walks it: error, cause, the OS's error.
            let below = std::error::Error::source(&err)
                .and_then(|cause| cause.source())
                .expect("the OS error is the cause's source");
            assert!(below.is::<std::io::Error>(), "{err:?}");
        }
        SetupCause::Refused(why) => assert!(why.contains("in use"), "{err}"),
        other => panic!("second listen on {taken}: unexpected cause {other:?}"),
    }
}

/// The next CM event of a side with no peer to poll.
fn wait_client_cm(client: &mut Side, what: &str) -> CmEvent {
    let start = std::time::Instant::now();
    loop {
        client.pump();
        if let Some(ev) = client.cm.pop_front() {
            return ev;
        }
        assert!(
            start.elapsed() < super::DEADLINE,
            "timed out waiting for {what}"
        );
        std::thread::yield_now();
    }
}
