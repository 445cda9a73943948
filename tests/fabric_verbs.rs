//! The verbs fabric: what can be checked without hardware (opening fails cleanly and
//! says why), and, ignored by default, round trips over a real RDMA device.
//!
//! Hardware tests connect to the device's own address (a loopback connection through
//! the NIC). Run them with, for example:
//!
//! ```text
//! RTRS_TEST_DEVICE=mlx5_0 RTRS_TEST_ADDR=192.0.2.1 cargo test --test fabric_verbs -- --ignored
//! ```
//!
//! `RTRS_TEST_DEVICE` names the rdma-core device (`rdma link show`), `RTRS_TEST_ADDR` an
//! IP address configured on one of its ports (IPoIB, RoCE netdev, or rxe/siw).
//! `RTRS_TEST_ADDR2`, an address of a second device, is needed by the tests of one fabric
//! over two devices (`hw_two_devices_*`).
//!
//! The shared conformance suite (`tests/conformance/`) runs against the same device in
//! the `conformance_verbs` module; like the round trips, its scenarios are ignored unless
//! asked for with `--ignored` on a machine with a device.
#![cfg(feature = "verbs")]

#[macro_use]
mod conformance;

use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::verbs::VerbsFabric;
use rtrs_spdk::fabric::{
    inc_rkey, Access, CmEvent, Conn, ConnState, Fabric, FabricError, FabricKind, KeyScope, MemBuf,
    QpCaps, RecvWr, SendOp, SendWr, Wc, WcOpcode, WcStatus,
};

/// Upper bound for anything to happen on a device; never a performance figure.
const DEADLINE: Duration = Duration::from_secs(10);

fn kernel_has_rdma_devices() -> bool {
    Path::new("/sys/class/infiniband")
        .read_dir()
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

#[test]
fn opening_without_a_device_fails_with_no_device() {
    let result = VerbsFabric::open(None);
    if kernel_has_rdma_devices() {
        // A machine with devices: opening the first one works, or fails naming why.
        match result {
            Ok(f) => assert_eq!(f.kind(), FabricKind::Verbs),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
        return;
    }
    let err = result.expect_err("no RDMA device on this machine, yet open succeeded");
    assert!(matches!(err, FabricError::NoDevice(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.starts_with("no RDMA device found"), "{msg}");
    assert!(
        msg.contains("rxe/siw"),
        "the message should say what to configure: {msg}"
    );
}

#[test]
fn opening_a_missing_named_device_names_it() {
    let err = VerbsFabric::open(Some("rtrs_missing_dev7")).expect_err("no such device exists");
    assert!(matches!(err, FabricError::NoDevice(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.starts_with("no RDMA device found"), "{msg}");
    assert!(msg.contains("\"rtrs_missing_dev7\""), "{msg}");
}

#[test]
fn repeated_failed_opens_give_the_same_answer() {
    if kernel_has_rdma_devices() {
        return;
    }
    let first = VerbsFabric::open(None).unwrap_err().to_string();
    for _ in 0..50 {
        assert_eq!(VerbsFabric::open(None).unwrap_err().to_string(), first);
    }
}

// ---------------------------------------------------------------------------------------
// Hardware tests.

fn device() -> (VerbsFabric, IpAddr) {
    let dev = std::env::var("RTRS_TEST_DEVICE")
        .expect("set RTRS_TEST_DEVICE to an RDMA device name (see `rdma link show`)");
    let addr = std::env::var("RTRS_TEST_ADDR")
        .expect("set RTRS_TEST_ADDR to an IP address of that device")
        .parse()
        .expect("RTRS_TEST_ADDR is not an IP address");
    let fabric = VerbsFabric::open(Some(&dev))
        .unwrap_or_else(|e| panic!("opening RTRS_TEST_DEVICE={dev}: {e}"));
    (fabric, addr)
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
    }
}

fn wait_cm(conn: &mut dyn Conn, what: &str) -> CmEvent {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(ev) = conn.poll_cm() {
            return ev;
        }
        assert!(
            Instant::now() < end,
            "no CM event within {DEADLINE:?} while waiting for {what}"
        );
        std::thread::yield_now();
    }
}

fn wait_wc(conn: &mut dyn Conn, what: &str) -> Wc {
    let end = Instant::now() + DEADLINE;
    let mut wc = [Wc::default(); 1];
    loop {
        if conn.poll_cq(&mut wc) == 1 {
            return wc[0];
        }
        assert!(
            Instant::now() < end,
            "no completion within {DEADLINE:?} while waiting for {what}"
        );
        std::thread::yield_now();
    }
}

/// Waits for `Disconnected` on both ends, polling both: a disconnect completes only when
/// the peer's connection manager answers it, which needs the peer polled.
fn wait_both_disconnected(a: &mut dyn Conn, b: &mut dyn Conn) {
    let end = Instant::now() + DEADLINE;
    let (mut seen_a, mut seen_b) = (Vec::new(), Vec::new());
    let down = |seen: &Vec<CmEvent>| seen.contains(&CmEvent::Disconnected);
    while !(down(&seen_a) && down(&seen_b)) {
        seen_a.extend(a.poll_cm());
        seen_b.extend(b.poll_cm());
        let mut wc = [Wc::default(); 8];
        a.poll_cq(&mut wc);
        b.poll_cq(&mut wc);
        assert!(
            Instant::now() < end,
            "not both Disconnected within {DEADLINE:?}: one end saw {seen_a:?}, the other {seen_b:?}"
        );
        std::thread::yield_now();
    }
}

/// A connected pair over the device's own address: (client, server).
fn pair(fabric: &VerbsFabric, ip: IpAddr) -> (Box<dyn Conn>, Box<dyn Conn>) {
    let mut listener = fabric
        .listen(SocketAddr::new(ip, 0), &ListenOptions::default())
        .expect("listen");
    let dst = listener.local_addr();
    let mut client = fabric
        .connect(dst, &ConnectOptions::new(caps(), b"hello"))
        .expect("connect");
    let end = Instant::now() + DEADLINE;
    let req = loop {
        assert!(
            client.poll_cm().is_none(),
            "client got an event before the server answered"
        );
        if let Some(req) = listener.poll() {
            break req;
        }
        assert!(
            Instant::now() < end,
            "no connect request within {DEADLINE:?}"
        );
        std::thread::yield_now();
    };
    assert_eq!(&req.private_data.as_bytes()[..5], b"hello");
    let mut server = req.accept(caps(), b"welcome").expect("accept");
    match wait_cm(client.as_mut(), "client Established") {
        CmEvent::Established { private_data } => {
            assert_eq!(&private_data.as_bytes()[..7], b"welcome")
        }
        other => panic!("client: {other:?}"),
    }
    assert!(matches!(
        wait_cm(server.as_mut(), "server Established"),
        CmEvent::Established { .. }
    ));
    assert_eq!(client.state(), ConnState::Connected);
    (client, server)
}

#[test]
#[ignore = "needs an RDMA device: RTRS_TEST_DEVICE=<dev> RTRS_TEST_ADDR=<ip> cargo test --test fabric_verbs -- --ignored"]
fn hw_register_and_allocate_a_window() {
    let (fabric, _) = device();
    let mr = fabric
        .register(
            MemBuf::zeroed(1 << 16),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .expect("register");
    assert_eq!(mr.len(), 1 << 16);
    let slot = fabric
        .alloc_fast_mr(KeyScope::Connection)
        .expect("type-2 memory window");
    assert_ne!(slot.rkey(), mr.rkey());
    let domain = fabric
        .alloc_fast_mr(KeyScope::Domain)
        .expect("type-1 memory window");
    assert_ne!(domain.rkey(), slot.rkey());
    let err = fabric
        .register(MemBuf::zeroed(4096), Access::REMOTE_WRITE)
        .unwrap_err();
    assert!(err.to_string().contains("LOCAL_WRITE"), "{err}");
}

#[test]
#[ignore = "needs an RDMA device: RTRS_TEST_DEVICE=<dev> RTRS_TEST_ADDR=<ip> cargo test --test fabric_verbs -- --ignored"]
fn hw_connect_and_reject_carry_private_data() {
    let (fabric, ip) = device();
    let (mut client, mut server) = pair(&fabric, ip);
    client.disconnect();
    wait_both_disconnected(client.as_mut(), server.as_mut());

    let mut listener = fabric
        .listen(SocketAddr::new(ip, 0), &ListenOptions::default())
        .expect("listen");
    let mut client = fabric
        .connect(
            listener.local_addr(),
            &ConnectOptions::new(caps(), &[1; 56]),
        )
        .expect("connect");
    let end = Instant::now() + DEADLINE;
    let req = loop {
        if let Some(req) = listener.poll() {
            break req;
        }
        assert!(Instant::now() < end, "no connect request");
        if let Some(ev) = client.poll_cm() {
            panic!("unexpected {ev:?} before the server answered");
        }
    };
    assert_eq!(req.private_data.as_bytes(), &[1; 56][..]);
    req.reject(b"busy").expect("reject");
    match wait_cm(client.as_mut(), "Rejected") {
        CmEvent::Rejected { private_data } => assert_eq!(&private_data.as_bytes()[..4], b"busy"),
        other => panic!("{other:?}"),
    }
}

#[test]
#[ignore = "needs an RDMA device: RTRS_TEST_DEVICE=<dev> RTRS_TEST_ADDR=<ip> cargo test --test fabric_verbs -- --ignored"]
fn hw_rdma_write_with_imm_lands_before_its_completion() {
    let (fabric, ip) = device();
    let (mut client, mut server) = pair(&fabric, ip);
    let src = fabric
        .register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
        .unwrap();
    let dst = fabric
        .register(
            MemBuf::zeroed(4096),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    src.write_at(0, b"rtrs over verbs");
    server
        .post_recv(&[
            RecvWr {
                wr_id: 7,
                sge: None,
            },
            RecvWr {
                wr_id: 8,
                sge: None,
            },
        ])
        .unwrap();
    let sge = [src.sge(0, 15)];
    let wrs = [
        SendWr {
            wr_id: 1,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: dst.addr() + 100,
                rkey: dst.rkey(),
                imm: 0xdead_beef,
            },
            sges: &sge,
            signaled: true,
        },
        // Zero-length, no remote address: only the immediate travels.
        SendWr {
            wr_id: 2,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: 0,
                rkey: 0,
                imm: 0x0102_0304,
            },
            sges: &[],
            signaled: true,
        },
    ];
    client.post_send(&wrs).unwrap();
    for id in [1, 2] {
        let wc = wait_wc(client.as_mut(), "write completion");
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (id, WcStatus::Success, WcOpcode::RdmaWrite)
        );
    }
    let wc = wait_wc(server.as_mut(), "first imm");
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.byte_len, wc.imm),
        (7, WcOpcode::RecvRdmaWithImm, 15, Some(0xdead_beef))
    );
    let mut got = [0u8; 15];
    dst.read_at(100, &mut got);
    assert_eq!(&got, b"rtrs over verbs");
    let wc = wait_wc(server.as_mut(), "second imm");
    assert_eq!((wc.wr_id, wc.byte_len, wc.imm), (8, 0, Some(0x0102_0304)));
}

#[test]
#[ignore = "needs an RDMA device: RTRS_TEST_DEVICE=<dev> RTRS_TEST_ADDR=<ip> cargo test --test fabric_verbs -- --ignored"]
fn hw_bound_window_then_send_with_inv_retires_the_key() {
    let (fabric, ip) = device();
    let (mut client, mut server) = pair(&fabric, ip);
    let region = fabric
        .register(MemBuf::zeroed(8192), Access::LOCAL_WRITE)
        .unwrap();
    let slot = fabric.alloc_fast_mr(KeyScope::Connection).unwrap();
    let rkey = inc_rkey(slot.rkey());
    let bind = SendOp::RegMr {
        slot: &slot,
        region: &region,
        addr: region.addr() + 4096,
        len: 4096,
        access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        rkey,
    };
    server
        .post_send(&[SendWr {
            wr_id: 10,
            op: bind,
            sges: &[],
            signaled: true,
        }])
        .unwrap();
    let wc = wait_wc(server.as_mut(), "bind");
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (10, WcStatus::Success, WcOpcode::RegMr)
    );
    assert_eq!(slot.rkey(), rkey);

    let src = fabric
        .register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
        .unwrap();
    src.write_at(0, b"through the window");
    let sge = [src.sge(0, 18)];
    let write = SendOp::RdmaWrite {
        remote_addr: region.addr() + 4096,
        rkey,
    };
    client
        .post_send(&[SendWr {
            wr_id: 20,
            op: write,
            sges: &sge,
            signaled: true,
        }])
        .unwrap();
    assert_eq!(
        wait_wc(client.as_mut(), "write via window").status,
        WcStatus::Success
    );
    let mut got = [0u8; 18];
    region.read_at(4096, &mut got);
    assert_eq!(&got, b"through the window");

    let buf = fabric
        .register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
        .unwrap();
    server
        .post_recv(&[RecvWr {
            wr_id: 30,
            sge: Some(buf.sge(0, 64)),
        }])
        .unwrap();
    let msg = [src.sge(0, 4)];
    client
        .post_send(&[SendWr {
            wr_id: 21,
            op: SendOp::SendWithInv { rkey },
            sges: &msg,
            signaled: true,
        }])
        .unwrap();
    assert_eq!(
        wait_wc(client.as_mut(), "send with inv").status,
        WcStatus::Success
    );
    let wc = wait_wc(server.as_mut(), "receive of send with inv");
    // Soft-RoCE does not report the invalidation (tests/conformance, `Quirks`).
    let reported = (fabric.vendor_id() != VerbsFabric::RXE_VENDOR_ID).then_some(rkey);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.byte_len, wc.invalidated_rkey),
        (30, WcOpcode::Recv, 4, reported)
    );

    // The retired key no longer grants access; the connection breaks on both sides.
    client
        .post_send(&[SendWr {
            wr_id: 22,
            op: write,
            sges: &sge,
            signaled: true,
        }])
        .unwrap();
    assert_eq!(
        wait_wc(client.as_mut(), "write with retired key").status,
        WcStatus::RemoteAccess
    );
    wait_both_disconnected(client.as_mut(), server.as_mut());
}

#[test]
#[ignore = "needs an RDMA device: RTRS_TEST_DEVICE=<dev> RTRS_TEST_ADDR=<ip> cargo test --test fabric_verbs -- --ignored"]
fn hw_disconnect_flushes_posted_receives() {
    let (fabric, ip) = device();
    let (mut client, mut server) = pair(&fabric, ip);
    server
        .post_recv(&[RecvWr {
            wr_id: 5,
            sge: None,
        }])
        .unwrap();
    server.disconnect();
    let wc = wait_wc(server.as_mut(), "flushed receive");
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::WrFlush));
    wait_both_disconnected(server.as_mut(), client.as_mut());
    let err = client
        .post_recv(&[RecvWr {
            wr_id: 6,
            sge: None,
        }])
        .unwrap_err();
    assert_eq!(err.index, 0);
}

/// The series (major, minor) of a kernel release string such as `6.12.117+deb12-amd64`.
fn kernel_series(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Soft-RoCE's deviations from what hardware must do in kernel series `series`, each
/// with the series it was seen in (docs/INTEROP.md, "Soft-RoCE is not hardware"). A
/// series between two that were tried gets only what both show: a deviation it lacks
/// fails its scenario rather than pass unchecked.
fn rxe_quirks(series: (u32, u32)) -> conformance::Quirks {
    conformance::Quirks {
        // 6.1 and 6.12: an unknown lkey is LOC_QP_OP_ERR, a short receive LOC_QP_OP_ERR
        // (not LOC_LEN_ERR), no IBV_WC_WITH_INV, a refused SEND_WITH_INV succeeds at the
        // sender.
        unknown_lkey_as_qp_operation: true,
        short_receive_as_qp_operation: true,
        no_invalidated_rkey: true,
        refused_inv_succeeds_at_sender: true,
        // 6.12, not 6.1: the requester puts the queue pair in the error state before
        // the failing request is completed, so the flush reports it as WR_FLUSH_ERR.
        local_error_as_flush: series >= (6, 12),
    }
}

#[test]
fn rxe_quirks_follow_the_kernel_series() {
    assert_eq!(kernel_series("6.12.117+deb12-amd64\n"), Some((6, 12)));
    assert_eq!(kernel_series("6.1.0-56-amd64"), Some((6, 1)));
    assert_eq!(kernel_series("6"), None);
    assert!(!rxe_quirks((6, 1)).local_error_as_flush);
    assert!(rxe_quirks((6, 12)).local_error_as_flush);
    assert!(rxe_quirks((6, 1)).unknown_lkey_as_qp_operation);
}

/// The shared conformance suite over `RTRS_TEST_DEVICE`: one fabric serves as both hosts
/// and the pair connects through the NIC to `RTRS_TEST_ADDR`.
mod conformance_verbs {
    use std::net::{IpAddr, SocketAddr};
    use std::sync::Arc;

    use rtrs_spdk::fabric::verbs::VerbsFabric;
    use rtrs_spdk::fabric::Fabric;

    struct Verbs {
        fabric: Arc<VerbsFabric>,
        ip: IpAddr,
    }

    impl Verbs {
        /// The backend on `RTRS_TEST_DEVICE` / `RTRS_TEST_ADDR` (the tests are ignored
        /// unless asked for, so a missing device is a failure here, not a skip).
        fn from_env() -> Verbs {
            let (fabric, ip) = super::device();
            Verbs {
                fabric: Arc::new(fabric),
                ip,
            }
        }
    }

    impl crate::conformance::Backend for Verbs {
        fn server_fabric(&self) -> Arc<dyn Fabric> {
            self.fabric.clone()
        }
        fn client_fabric(&self) -> Arc<dyn Fabric> {
            self.fabric.clone()
        }
        fn listen_addr(&self) -> SocketAddr {
            SocketAddr::new(self.ip, 0)
        }
        fn quirks(&self) -> crate::conformance::Quirks {
            if self.fabric.vendor_id() != VerbsFabric::RXE_VENDOR_ID {
                return crate::conformance::Quirks::default();
            }
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_else(|e| panic!("Soft-RoCE's quirks depend on the kernel: reading /proc/sys/kernel/osrelease: {e}"));
            let series = super::kernel_series(&release).unwrap_or_else(|| {
                panic!("Soft-RoCE's quirks depend on the kernel: no MAJOR.MINOR in release {release:?}")
            });
            super::rxe_quirks(series)
        }
    }

    conformance_tests!(
        ignore = "needs an RDMA NIC: RTRS_TEST_DEVICE=<dev> RTRS_TEST_ADDR=<its ip> \
                  cargo test --test fabric_verbs -- --ignored",
        Verbs::from_env()
    );
}

// ---------------------------------------------------------------------------------------
// One fabric over two devices (docs/ARCHITECTURE.md, "Several RDMA devices").

/// Every device of the host, and an address on each of two of them.
fn two_devices() -> (VerbsFabric, IpAddr, IpAddr) {
    let addr = |var: &str| -> IpAddr {
        std::env::var(var)
            .unwrap_or_else(|_| {
                panic!("set {var}: RTRS_TEST_ADDR and RTRS_TEST_ADDR2 are addresses of two RDMA devices")
            })
            .parse()
            .unwrap_or_else(|e| panic!("{var} is not an IP address: {e}"))
    };
    let (a, b) = (addr("RTRS_TEST_ADDR"), addr("RTRS_TEST_ADDR2"));
    let fabric = VerbsFabric::open(None).expect("open every device");
    assert!(
        fabric.device_names().len() >= 2,
        "two devices needed, the fabric has {:?}",
        fabric.device_names()
    );
    (fabric, a, b)
}

/// A pair over `ip` in `dom`: the client with its own CQ, the server on `cq` (as a
/// server's core accepts its connections).
fn pair_in(
    dom: &dyn Fabric,
    ip: IpAddr,
    cq: &rtrs_spdk::fabric::CqRef,
) -> (Box<dyn Conn>, Box<dyn Conn>) {
    let mut listener = dom
        .listen(SocketAddr::new(ip, 0), &ListenOptions::default())
        .expect("listen");
    let mut client = dom
        .connect(listener.local_addr(), &ConnectOptions::new(caps(), b"hi"))
        .expect("connect");
    let end = Instant::now() + DEADLINE;
    let req = loop {
        if let Some(req) = listener.poll() {
            break req;
        }
        assert!(client.poll_cm().is_none(), "client event before the answer");
        assert!(Instant::now() < end, "no connect request");
        std::thread::yield_now();
    };
    let hca = req.hca().expect("a verbs request names its device");
    let mut server = req
        .accept_into(dom, Some(cq), caps(), b"ok")
        .expect("accept");
    assert!(matches!(
        wait_cm(client.as_mut(), "client Established"),
        CmEvent::Established { .. }
    ));
    assert!(matches!(
        wait_cm(server.as_mut(), "server Established"),
        CmEvent::Established { .. }
    ));
    assert_eq!(server.hca().as_ref(), Some(&hca));
    (client, server)
}

/// The next completion of the shared CQ.
fn wait_shared(cq: &mut rtrs_spdk::fabric::Cq, what: &str) -> Wc {
    let end = Instant::now() + DEADLINE;
    let mut wc = [Wc::default(); 1];
    loop {
        if cq.poll(&mut wc) == 1 {
            return wc[0];
        }
        assert!(Instant::now() < end, "no completion for {what}");
        std::thread::yield_now();
    }
}

#[test]
#[ignore = "needs two RDMA devices: RTRS_TEST_ADDR=<ip of one> RTRS_TEST_ADDR2=<ip of another> cargo test --test fabric_verbs -- --ignored"]
fn hw_two_devices_one_domain_one_cq() {
    let (fabric, a, b) = two_devices();
    let dom = fabric.domain().expect("a session's domain");
    let mut cq = dom.create_cq(256).expect("one CQ for both devices");
    let share = cq.share();
    let src = dom
        .register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
        .unwrap();
    let dst = dom
        .register(
            MemBuf::zeroed(1 << 16),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let (mut ca, sa) = pair_in(&*dom, a, &share);
    let (mut cb, sb) = pair_in(&*dom, b, &share);
    let (ha, hb) = (ca.hca().expect("hca a"), cb.hca().expect("hca b"));
    assert_ne!(
        ha.name, hb.name,
        "the two addresses' connections live on their own devices"
    );
    assert_ne!(ha.index, hb.index);
    assert_ne!(
        sa.qp_num(),
        sb.qp_num(),
        "connection numbers stay unique across devices"
    );
    let mut servers = [sa, sb];
    for (k, (client, hca)) in [(&mut ca, &ha), (&mut cb, &hb)].into_iter().enumerate() {
        let server = &mut servers[k];
        let off = 4096 * (2 * k + 1);
        // A write with the registration's key on this connection's device, from memory
        // whose SGE carries device 0's lkey (the connection puts its own in).
        let text = format!("over {}", hca.name);
        src.write_at(0, text.as_bytes());
        server
            .post_recv(&[RecvWr {
                wr_id: 70 + k as u64,
                sge: None,
            }])
            .unwrap();
        let sge = [src.sge(0, text.len())];
        client
            .post_send(&[SendWr {
                wr_id: 1,
                op: SendOp::RdmaWriteWithImm {
                    remote_addr: dst.addr() + off as u64,
                    rkey: dst.rkey_on(hca.index),
                    imm: k as u32,
                },
                sges: &sge,
                signaled: true,
            }])
            .unwrap();
        assert_eq!(wait_wc(client.as_mut(), "write").status, WcStatus::Success);
        let wc = wait_shared(&mut cq, "the write's immediate");
        assert_eq!(
            (wc.wr_id, wc.status, wc.qp_num, wc.imm),
            (
                70 + k as u64,
                WcStatus::Success,
                server.qp_num(),
                Some(k as u32)
            )
        );
        let mut got = vec![0u8; text.len()];
        dst.read_at(off, &mut got);
        assert_eq!(got, text.as_bytes());

        // A window on this device, bound by the server over the same registration.
        let slot = dom
            .alloc_fast_mr_on(KeyScope::Connection, hca.index)
            .expect("a window on the connection's device");
        let rkey = inc_rkey(slot.rkey());
        server
            .post_send(&[SendWr {
                wr_id: 80,
                op: SendOp::RegMr {
                    slot: &slot,
                    region: &dst,
                    addr: dst.addr() + off as u64 + 4096,
                    len: 4096,
                    access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                    rkey,
                },
                sges: &[],
                signaled: true,
            }])
            .unwrap();
        let wc = wait_shared(&mut cq, "bind");
        assert_eq!((wc.wr_id, wc.status), (80, WcStatus::Success));
        client
            .post_send(&[SendWr {
                wr_id: 2,
                op: SendOp::RdmaWrite {
                    remote_addr: dst.addr() + off as u64 + 4096,
                    rkey,
                },
                sges: &sge,
                signaled: true,
            }])
            .unwrap();
        assert_eq!(
            wait_wc(client.as_mut(), "write via window").status,
            WcStatus::Success
        );
        dst.read_at(off + 4096, &mut got);
        assert_eq!(got, text.as_bytes());

        // A window of the other device is refused on this connection.
        let other = dom
            .alloc_fast_mr_on(KeyScope::Connection, 1 - hca.index.min(1))
            .expect("a window on the other device");
        let refused = server.post_send(&[SendWr {
            wr_id: 81,
            op: SendOp::RegMr {
                slot: &other,
                region: &dst,
                addr: dst.addr(),
                len: 4096,
                access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                rkey: inc_rkey(other.rkey()),
            },
            sges: &[],
            signaled: true,
        }]);
        assert!(refused.is_err(), "a window of another device bound here");
    }
}

/// A post learns the keys of the registrations its requests name, then builds them. While
/// another thread makes and lets go of registrations of the same domain (each a change of
/// its key map, as a device's removal is), a connection that translates its keys (one
/// not on device 0) posts writes of two SGEs from two registrations: none may be
/// refused, and each lands whole. A key cache that looked at the map's generation
/// between the two ids of one post forgot the first and refused it; a device removed
/// under IO showed it (docs/ARCHITECTURE.md, "Several RDMA devices").
#[test]
#[ignore = "needs two RDMA devices: RTRS_TEST_ADDR=<ip of one> RTRS_TEST_ADDR2=<ip of another> cargo test --test fabric_verbs -- --ignored"]
fn hw_two_devices_posts_keep_their_keys_while_registrations_change() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let (fabric, a, b) = two_devices();
    let dom = fabric.domain().expect("a session's domain");
    let cq = dom.create_cq(256).expect("a CQ");
    let share = cq.share();
    let srcs: Vec<_> = (0..2)
        .map(|_| {
            dom.register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
                .unwrap()
        })
        .collect();
    let dst = dom
        .register(
            MemBuf::zeroed(4096),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let (mut client, _server, hca) = [a, b]
        .into_iter()
        .map(|ip| {
            let (c, s) = pair_in(&*dom, ip, &share);
            let hca = c.hca().expect("a verbs connection names its device");
            (c, s, hca)
        })
        .find(|(_, _, hca)| hca.index != 0)
        .expect("a connection on a device other than device 0");

    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (dom, stop) = (Arc::clone(&dom), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut changes = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mr = dom
                    .register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
                    .expect("a registration of the churning thread");
                drop(mr);
                changes += 1;
            }
            changes
        })
    };
    // Bounded in time, not a performance figure: as many posts as fit.
    let end = Instant::now() + Duration::from_secs(3);
    let mut posts = 0u64;
    let mut got = [0u8; 16];
    while Instant::now() < end {
        srcs[0].write_at(0, &posts.to_le_bytes());
        srcs[1].write_at(0, &(!posts).to_le_bytes());
        let sges = [srcs[0].sge(0, 8), srcs[1].sge(0, 8)];
        let posted = client.post_send(&[SendWr {
            wr_id: posts,
            op: SendOp::RdmaWrite {
                remote_addr: dst.addr(),
                rkey: dst.rkey_on(hca.index),
            },
            sges: &sges,
            signaled: true,
        }]);
        if let Err(e) = posted {
            stop.store(true, Ordering::Relaxed);
            panic!(
                "post {posts} on {} refused while registrations changed: {e}",
                hca.name
            );
        }
        let wc = wait_wc(client.as_mut(), "a two-SGE write");
        assert_eq!((wc.wr_id, wc.status), (posts, WcStatus::Success));
        dst.read_at(0, &mut got);
        assert_eq!(got[..8], posts.to_le_bytes(), "write {posts}, first SGE");
        assert_eq!(
            got[8..],
            (!posts).to_le_bytes(),
            "write {posts}, second SGE"
        );
        posts += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let changes = churn.join().expect("the churning thread");
    assert!(posts > 0 && changes > 0, "{posts} posts, {changes} changes");
    eprintln!(
        "{posts} two-SGE writes on {}, {changes} registrations made and let go meanwhile",
        hca.name
    );
}

/// Whether `fd` is readable within `ms` milliseconds.
fn readable_within(fd: std::os::fd::RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    assert!(r >= 0, "poll: {}", std::io::Error::last_os_error());
    r > 0 && p.revents & libc::POLLIN != 0
}

/// A write with an immediate from `client` into `dst` through a connection on `hca`,
/// waited for at the client (the server's receive completion is then in the CQ).
fn write_imm(
    client: &mut dyn Conn,
    server: &mut dyn Conn,
    src: &rtrs_spdk::fabric::Mr,
    dst: &rtrs_spdk::fabric::Mr,
    hca: u8,
    imm: u32,
) {
    server
        .post_recv(&[RecvWr {
            wr_id: u64::from(imm),
            sge: None,
        }])
        .expect("post_recv");
    let sge = [src.sge(0, 64)];
    client
        .post_send(&[SendWr {
            wr_id: 1,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: dst.addr(),
                rkey: dst.rkey_on(hca),
                imm,
            },
            sges: &sge,
            signaled: true,
        }])
        .expect("post_send");
    assert_eq!(wait_wc(client, "write").status, WcStatus::Success);
}

// Interrupt mode (docs/ARCHITECTURE.md, "Interrupt mode"): a shared CQ over two devices
// wakes a sleeper through one descriptor, only once armed, and is quiet again once the
// completions that raised it are polled; a listener's descriptor wakes for a request.
#[test]
#[ignore = "needs two RDMA devices: RTRS_TEST_ADDR=<ip of one> RTRS_TEST_ADDR2=<ip of another> cargo test --test fabric_verbs -- --ignored"]
fn hw_two_devices_a_shared_cq_wakes_its_sleeper_once_armed() {
    let (fabric, a, b) = two_devices();
    let dom = fabric.domain().expect("a session's domain");
    let mut listener = dom
        .listen(SocketAddr::new(a, 0), &ListenOptions::default())
        .expect("listen");
    let lfd = listener
        .wait_fd()
        .expect("a verbs listener has a descriptor to wait on");
    assert!(
        !readable_within(lfd, 0),
        "listener readable with no request"
    );
    let mut client = dom
        .connect(listener.local_addr(), &ConnectOptions::new(caps(), b"hi"))
        .expect("connect");
    // The client resolves its address and route, then sends the request, as it is
    // polled; the listener is not.
    let end = Instant::now() + DEADLINE;
    while !readable_within(lfd, 10) {
        assert!(client.poll_cm().is_none(), "client event before the answer");
        assert!(
            Instant::now() < end,
            "the listener's descriptor did not wake for a connect request"
        );
    }
    let req = listener.poll().expect("the request that woke the listener");
    assert!(
        !readable_within(lfd, 0),
        "listener still readable once polled"
    );
    drop(req);
    let _ = wait_cm(client.as_mut(), "the client's rejection");

    let mut cq = dom.create_cq(256).expect("one CQ for both devices");
    let fd = cq
        .wait_fd()
        .expect("a verbs CQ has a descriptor to wait on");
    let share = cq.share();
    let src = dom
        .register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
        .unwrap();
    let dst = dom
        .register(
            MemBuf::zeroed(4096),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let (ca, sa) = pair_in(&*dom, a, &share);
    let (cb, sb) = pair_in(&*dom, b, &share);
    let (ha, hb) = (ca.hca().expect("hca a"), cb.hca().expect("hca b"));
    assert_ne!(ha.index, hb.index, "one connection on each device");
    let mut on = [(ca, sa, ha.index), (cb, sb, hb.index)];
    let mut write = |k: usize, imm: u32| {
        let (client, server, hca) = &mut on[k];
        write_imm(client.as_mut(), server.as_mut(), &src, &dst, *hca, imm);
    };
    let mut wcs = [Wc::default(); 8];
    // Not armed: a completion is in the CQ and the descriptor stays quiet.
    write(0, 1);
    assert!(!readable_within(fd, 100), "readable before any arming");
    assert_eq!(cq.poll(&mut wcs), 1);
    assert_eq!(wcs[0].imm, Some(1));
    // Each device's completion wakes the sleeper through the one descriptor.
    for (round, k) in [0, 1, 0].into_iter().enumerate() {
        let imm = 10 + round as u32;
        assert!(
            !cq.arm(),
            "round {round}: arming anew asks for one more poll"
        );
        assert_eq!(
            cq.poll(&mut wcs),
            0,
            "round {round}: nothing came meanwhile"
        );
        assert!(
            cq.arm(),
            "round {round}: armed already, sleeping misses nothing"
        );
        assert!(
            !readable_within(fd, 0),
            "round {round}: readable while idle"
        );
        write(k, imm);
        assert!(
            readable_within(fd, DEADLINE.as_millis() as i32),
            "round {round}: a completion on device {k} did not wake the sleeper"
        );
        let wc = wait_shared(&mut cq, "the waking write's immediate");
        assert_eq!((wc.status, wc.imm), (WcStatus::Success, Some(imm)));
        assert!(
            !readable_within(fd, 0),
            "round {round}: still readable once the completion was polled"
        );
    }
    // An event not read back by a poll (its completion left in the CQ) is read back by
    // the next arming, which asks for the poll that finds the completion.
    assert!(!cq.arm());
    assert!(cq.arm());
    write(0, 20);
    assert!(
        readable_within(fd, DEADLINE.as_millis() as i32),
        "the armed device did not raise its event"
    );
    assert!(!cq.arm(), "arming after an event asks for one more poll");
    let wc = wait_shared(&mut cq, "the completion behind the event");
    assert_eq!(wc.imm, Some(20));
    // Armed once more with nothing new (a provider may raise an event at once for a
    // completion left in the CQ while arming, as the one above was: read back here).
    let mut tries = 0;
    while !cq.arm() {
        tries += 1;
        assert!(tries < 3, "the CQ never stays armed");
        assert_eq!(cq.poll(&mut wcs), 0, "nothing new came");
    }
    assert!(
        !readable_within(fd, 0),
        "readable after re-arming with nothing new"
    );
}

// ---------------------------------------------------------------------------------------
// A device that goes and comes back (docs/ARCHITECTURE.md, "Devices that come and go").

/// Writes `text` with an immediate from `client` into `dst` at `off`, through a
/// connection on device `hca`, and checks that it landed and that the server's receive
/// on the shared `cq` completed.
#[allow(clippy::too_many_arguments)]
fn write_through(
    client: &mut dyn Conn,
    server: &mut dyn Conn,
    cq: &mut rtrs_spdk::fabric::Cq,
    src: &rtrs_spdk::fabric::Mr,
    dst: &rtrs_spdk::fabric::Mr,
    device: u8,
    off: usize,
    text: &str,
) {
    src.write_at(0, text.as_bytes());
    server
        .post_recv(&[RecvWr {
            wr_id: 90,
            sge: None,
        }])
        .expect("post the receive");
    let sge = [src.sge(0, text.len())];
    client
        .post_send(&[SendWr {
            wr_id: 91,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: dst.addr() + off as u64,
                rkey: dst.rkey_on(device),
                imm: 7,
            },
            sges: &sge,
            signaled: true,
        }])
        .expect("post the write");
    assert_eq!(wait_wc(client, text).status, WcStatus::Success, "{text}");
    let wc = wait_shared(cq, text);
    assert_eq!((wc.wr_id, wc.status), (90, WcStatus::Success), "{text}");
    let mut got = vec![0u8; text.len()];
    dst.read_at(off, &mut got);
    assert_eq!(got, text.as_bytes(), "{text}");
}

/// Runs `cmd` to its end, polling `tick` meanwhile (the kernel waits for this process to
/// let a device go before `rdma link delete` returns); panics past `secs`.
/// This process's open RDMA files (uverbs device files, rdma_cm) and its threads, for a
/// failure message: what may still hold a device the kernel is removing.
fn rdma_files() -> String {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(t) = std::fs::read_link(e.path()) {
            let t = t.to_string_lossy().into_owned();
            if t.contains("infiniband") || t.contains("rdma") {
                out.push(format!("fd {} -> {t}", e.file_name().to_string_lossy()));
            }
        }
    }
    let mut threads = Vec::new();
    for e in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(c) = std::fs::read_to_string(e.path().join("comm")) {
            threads.push(c.trim().to_owned());
        }
    }
    threads.sort();
    format!("{}; threads: {}", out.join(", "), threads.join(" "))
}

fn run_while(cmd: &[&str], secs: u64, mut tick: impl FnMut()) {
    let mut child = std::process::Command::new(cmd[0])
        .args(&cmd[1..])
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", cmd.join(" ")));
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            assert!(st.success(), "{} failed: {st}", cmd.join(" "));
            return;
        }
        if Instant::now() > end {
            // Left running: the device stays held until this process exits.
            panic!(
                "{} did not finish within {secs} s; this process has open: {}",
                cmd.join(" "),
                rdma_files()
            );
        }
        tick();
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
#[ignore = "removes an RDMA device: RTRS_TEST_ADDR=<ip> RTRS_TEST_ADDR2=<ip of another device> \
            RTRS_TEST_REMOVE=<that device>:<its rxe netdev> cargo test --test fabric_verbs -- --ignored"]
fn hw_device_removed_and_taken_up_again() {
    let Ok(spec) = std::env::var("RTRS_TEST_REMOVE") else {
        eprintln!(
            "SKIPPED hw_device_removed_and_taken_up_again: it deletes and re-adds a Soft-RoCE \
             device; set RTRS_TEST_REMOVE=<rxe device>:<netdev> to run it"
        );
        return;
    };
    let (name, netdev) = spec
        .split_once(':')
        .expect("RTRS_TEST_REMOVE is <rxe device>:<netdev>");
    // The fabric's log of devices going and coming, shown when the test fails.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("rtrs_spdk::fabric=debug")
        .with_test_writer()
        .try_init();
    let (fabric, a, b) = two_devices();
    let dom = fabric.domain().expect("a session's domain");
    let mut cq = dom.create_cq(256).expect("one CQ for both devices");
    let share = cq.share();
    let src = dom
        .register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
        .unwrap();
    let dst = dom
        .register(
            MemBuf::zeroed(1 << 16),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let (mut ca, mut sa) = pair_in(&*dom, a, &share);
    let (cb, sb) = pair_in(&*dom, b, &share);
    let (ha, hb) = (ca.hca().unwrap(), cb.hca().unwrap());
    assert_eq!(&*hb.name, name, "RTRS_TEST_ADDR2 is an address of {name}");
    write_through(
        &mut *ca, &mut *sa, &mut cq, &src, &dst, ha.index, 0, "a before",
    );

    // The device goes: its connections break, the kernel's removal completes once the
    // fabric has let go of everything on it (its connections are dropped as they break).
    let mut on_b = Some((cb, sb));
    let mut broke = [false; 2];
    let mut wc = [Wc::default(); 8];
    run_while(&["rdma", "link", "delete", name], 60, || {
        if let Some((c, s)) = on_b.as_mut() {
            for (k, conn) in [c, s].into_iter().enumerate() {
                if let Some(ev) = conn.poll_cm() {
                    assert!(
                        matches!(ev, CmEvent::Disconnected | CmEvent::Error { .. }),
                        "{ev:?}"
                    );
                    broke[k] = true;
                }
                conn.poll_cq(&mut wc);
            }
            if broke == [true, true] {
                on_b = None;
            }
        }
        cq.poll(&mut wc);
    });
    assert!(on_b.is_none(), "both ends on {name} broke");
    assert!(
        !fabric.device_names().iter().any(|n| n == name),
        "{name} is no longer the fabric's: {:?}",
        fabric.device_names()
    );
    let refused = dom
        .alloc_fast_mr_on(KeyScope::Connection, hb.index)
        .expect_err("a window on a device that went");
    assert!(refused.to_string().contains("no RDMA device"), "{refused}");
    // The other device's connection never noticed.
    write_through(
        &mut *ca, &mut *sa, &mut cq, &src, &dst, ha.index, 512, "a during",
    );
    let late = dom
        .register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
        .expect("a registration while one device is away");

    // It comes back: a new connection over its address lives on it, with the keys of
    // registrations made before it went, while it was away, and after.
    run_while(
        &["rdma", "link", "add", name, "type", "rxe", "netdev", netdev],
        30,
        || {},
    );
    let end = Instant::now() + Duration::from_secs(30);
    let (mut cb, mut sb) = loop {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pair_in(&*dom, b, &share))) {
            Ok(p) => break p,
            Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => std::panic::resume_unwind(e),
        }
    };
    let hb2 = cb.hca().unwrap();
    assert_eq!(&*hb2.name, name);
    assert!(fabric.device_names().iter().any(|n| n == name));
    write_through(
        &mut *cb, &mut *sb, &mut cq, &src, &dst, hb2.index, 1024, "b again",
    );
    write_through(
        &mut *cb, &mut *sb, &mut cq, &late, &dst, hb2.index, 2048, "b late",
    );
    let after = dom
        .register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
        .unwrap();
    write_through(
        &mut *cb, &mut *sb, &mut cq, &after, &dst, hb2.index, 3072, "b after",
    );
    write_through(
        &mut *ca, &mut *sa, &mut cq, &after, &dst, ha.index, 3584, "a after",
    );
}
