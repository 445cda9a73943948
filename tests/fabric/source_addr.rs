//! `Fabric::connect` with `ConnectOptions::from`: a connection leaves from the source address it was given
//! (RTRS paths are `[src,]dst`), on the software fabrics; a source that cannot be used is
//! a clear error naming it.

use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::{CmEvent, Conn, Fabric, QpCaps};

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Connects `client` to a listener of `server` from `src`; returns (client end, server end).
fn connect_from(
    server: &dyn Fabric,
    client: &dyn Fabric,
    src: SocketAddr,
) -> (Box<dyn Conn>, Box<dyn Conn>) {
    let mut l = server
        .listen(addr("127.0.0.1:0"), &ListenOptions::default())
        .expect("listen");
    let caps = QpCaps::default();
    let mut c = client
        .connect(
            l.local_addr(),
            &ConnectOptions::new(caps, b"req").from(Some(src)),
        )
        .expect("connect_from");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = None;
    let mut up = false;
    while !up || s.is_none() {
        assert!(Instant::now() < deadline, "not connected within 10 s");
        if s.is_none() {
            if let Some(req) = l.poll() {
                assert_eq!(req.peer.ip(), src.ip(), "the request comes from the source");
                s = Some(req.accept(caps, b"rep").expect("accept"));
            }
        }
        match c.poll_cm() {
            Some(CmEvent::Established { .. }) => up = true,
            Some(ev) => panic!("client: {ev:?}"),
            None => {}
        }
        if let Some(s) = s.as_mut() {
            s.poll_cm();
        }
    }
    (c, s.unwrap())
}

fn binds_the_source(server: Arc<dyn Fabric>, client: Arc<dyn Fabric>) {
    let src = addr("127.0.0.2:0");
    let (c, s) = connect_from(&*server, &*client, src);
    assert_eq!(c.local_addr().map(|a| a.ip()), Some(src.ip()));
    assert_eq!(s.peer_addr().map(|a| a.ip()), Some(src.ip()));
    // An IPv6 source for an IPv4 destination cannot work: refused up front, named.
    let err = client
        .connect(
            addr("127.0.0.1:9"),
            &ConnectOptions::new(QpCaps::default(), &[]).from(Some(addr("[::1]:0"))),
        )
        .err()
        .expect("mixed IP versions refused");
    assert!(err.to_string().contains("[::1]:0"), "{err}");
}

#[test]
fn tcp_binds_the_source_address() {
    binds_the_source(Arc::new(TcpFabric::new()), Arc::new(TcpFabric::new()));
}

#[test]
fn tcp_source_that_is_not_local_is_an_error() {
    // 192.0.2.1 (TEST-NET-1) is no address of this host: the bind fails, nothing is sent.
    let f = TcpFabric::new();
    let err = f
        .connect(
            addr("127.0.0.1:9"),
            &ConnectOptions::new(QpCaps::default(), &[]).from(Some(addr("192.0.2.1:0"))),
        )
        .err()
        .expect("bind to a foreign address refused");
    assert!(
        err.to_string().contains("bind to source 192.0.2.1:0"),
        "{err}"
    );
}

#[test]
fn loopback_binds_the_source_address() {
    let f = Arc::new(LoopbackFabric::new());
    binds_the_source(f.clone(), f);
}

#[test]
fn loopback_source_in_use_is_an_error() {
    let f = LoopbackFabric::new();
    let l = f
        .listen(addr("127.0.0.1:0"), &ListenOptions::default())
        .expect("listen");
    let taken = l.local_addr();
    let err = f
        .connect(
            l.local_addr(),
            &ConnectOptions::new(QpCaps::default(), &[]).from(Some(taken)),
        )
        .err()
        .expect("a source already in use is refused");
    assert!(err.to_string().contains("address in use"), "{err}");
}
