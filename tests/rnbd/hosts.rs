//! Per-export host lists over tcp on 127.0.0.x: an RNBD server whose export `vol` only
//! opens to the hosts its list matches (by source address, by network, by session
//! name), clients binding their paths to 127.0.0.2.. as other hosts would. A refused
//! OPEN is −EACCES whose message names the device and says access was denied, and is
//! not retried; removing a host keeps the devices it has open working (its next OPEN
//! is refused); removing the export ends them. Server and clients run on one simulated
//! reactor stepped by hand; every wait is bounded.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rtrs_spdk::client::{ClientConfig, ClientSession, PathAddr, SessionCore};
use rtrs_spdk::engine::Simulation;
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Mr};
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::client::{
    open_rnbd_session, BlockRequest, ClientEvent, DevHandle, DeviceError, DeviceInfo, RnbdClient,
    RnbdClientSession,
};
use rtrs_spdk::rnbd::server::{Exports, HostPattern, RnbdServer};
use rtrs_spdk::server::{Server, ServerConfig};
use rtrs_spdk::Errno;

const WAIT: Duration = Duration::from_secs(20);

struct Rig {
    sim: Simulation,
    fabric: Arc<dyn Fabric>,
    exports: Arc<Exports>,
    server: Server,
}

struct Client {
    rnbd: RnbdClient<SessionCore>,
    buf: Mr,
    session: ClientSession,
}

impl Rig {
    fn new() -> Rig {
        let mut sim = Simulation::new(1, 4096);
        let fabric: Arc<dyn Fabric> = Arc::new(TcpFabric::new());
        let exports = Arc::new(Exports::ram(&[("vol", 1 << 20), ("open", 1 << 20)]).unwrap());
        let cfg = ServerConfig {
            queue_depth: 16,
            chunk_size: 64 << 10,
            ..ServerConfig::default()
        };
        let (f, ex) = (Arc::clone(&fabric), Arc::clone(&exports));
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let server = sim
            .reactor(0)
            .with_ctx(|cx| Server::start(cx, f, &[listen], cfg, RnbdServer::factory(ex)))
            .expect("server start");
        Rig {
            sim,
            fabric,
            exports,
            server,
        }
    }

    /// Restricts `vol` to exactly `patterns`.
    fn allow(&self, patterns: &[&str]) {
        let id = self.exports.lookup(b"vol").unwrap();
        let hosts = self.exports.hosts(id);
        for p in hosts.get().unwrap_or_default() {
            hosts.remove(&p);
        }
        for p in patterns {
            assert!(hosts.add(p.parse::<HostPattern>().unwrap()));
        }
    }

    /// A client session named `sessname` whose path leaves from `src`.
    fn client(&mut self, src: &str, sessname: &str) -> Client {
        let ip: IpAddr = src.parse().unwrap();
        let path = PathAddr {
            src: Some(SocketAddr::new(ip, 0)),
            dst: self.server.local_addrs()[0],
        };
        let cfg = ClientConfig::new(sessname, vec![path]);
        let f = Arc::clone(&self.fabric);
        let RnbdClientSession {
            session,
            admin,
            mut queues,
        } = self
            .sim
            .reactor(0)
            .with_ctx(|cx| open_rnbd_session(cx, 1, f, cfg))
            .expect("session open");
        let buf = self
            .fabric
            .register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
            .unwrap();
        Client {
            rnbd: RnbdClient::from_parts(admin, queues.remove(0)),
            buf,
            session,
        }
    }

    /// Steps until `c` reports an event; returns the events of that poll.
    fn events(&mut self, c: &mut Client) -> Vec<ClientEvent> {
        let start = Instant::now();
        let mut out = vec![
            ClientEvent::Io {
                tag: 0,
                result: Ok(())
            };
            8
        ];
        loop {
            self.sim.step();
            let n = self
                .sim
                .reactor(0)
                .with_ctx(|cx| c.rnbd.poll(cx.now(), &mut out));
            if n > 0 {
                return out[..n].to_vec();
            }
            assert!(start.elapsed() < WAIT, "no client event within {WAIT:?}");
        }
    }

    /// Opens `name` read-write: the handle, and the limits or why not.
    fn open_h(
        &mut self,
        c: &mut Client,
        name: &str,
    ) -> (DevHandle, Result<DeviceInfo, DeviceError>) {
        let h = self
            .sim
            .reactor(0)
            .with_ctx(|cx| c.rnbd.open(cx.now(), name, AccessMode::ReadWrite))
            .unwrap();
        loop {
            for e in self.events(c) {
                match e {
                    ClientEvent::SessInfo(Ok(_)) => {}
                    ClientEvent::Opened { dev, info, .. } if dev == h => return (h, Ok(info)),
                    ClientEvent::OpenFailed { dev, error } if dev == h => return (h, Err(error)),
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    }

    fn open(&mut self, c: &mut Client, name: &str) -> Result<(DevHandle, DeviceInfo), DeviceError> {
        let (h, r) = self.open_h(c, name);
        r.map(|info| (h, info))
    }

    /// Closes `dev` (so the export's writer is free for the next RW open).
    fn close(&mut self, c: &mut Client, dev: DevHandle) {
        self.sim
            .reactor(0)
            .with_ctx(|cx| c.rnbd.close(cx.now(), dev))
            .unwrap();
        assert!(matches!(self.events(c)[..], [ClientEvent::Closed { .. }]));
    }

    /// Writes `byte` over the first 4 KiB of `dev`, reads it back: the errno.
    fn write_read(&mut self, c: &mut Client, dev: DevHandle, byte: u8) -> i32 {
        c.buf.write_at(0, &[byte; 4096]);
        for (tag, req) in [
            (1, BlockRequest::write(0, 4096)),
            (2, BlockRequest::read(0, 4096)),
        ] {
            if tag == 2 {
                c.buf.write_at(0, &[0; 4096]);
            }
            let sge = [c.buf.sge(0, 4096)];
            self.sim
                .reactor(0)
                .with_ctx(|cx| c.rnbd.submit(cx.now(), dev, tag, &req, &sge))
                .unwrap();
            match self.events(c)[..] {
                [ClientEvent::Io {
                    tag: t,
                    result: Ok(()),
                }] if t == tag => {}
                [ClientEvent::Io { result, .. }] => return Errno::neg_of(result),
                ref other => panic!("unexpected {other:?}"),
            }
        }
        let mut got = [0u8; 4096];
        c.buf.read_at(0, &mut got);
        assert!(got.iter().all(|&b| b == byte), "read back other data");
        0
    }

    /// Requests the server has seen from `sessname` (SESS_INFO and OPEN are READs).
    fn reads_from(&self, sessname: &str) -> u64 {
        self.server
            .stats()
            .sessions
            .iter()
            .filter(|s| s.name == sessname)
            .flat_map(|s| &s.paths)
            .map(|p| p.read_cnt)
            .sum()
    }
}

fn denied(r: Result<(DevHandle, DeviceInfo), DeviceError>) -> DeviceError {
    let e = r.expect_err("OPEN must be refused");
    assert_eq!(e.errno().neg(), -libc::EACCES, "{e}");
    e
}

#[test]
fn allowed_by_address_network_and_session_name() {
    let mut rig = Rig::new();
    rig.allow(&["127.0.0.2"]);
    let mut a = rig.client("127.0.0.2", "host-a");
    let (dev, _) = rig.open(&mut a, "vol").expect("127.0.0.2 is allowed");
    assert_eq!(rig.write_read(&mut a, dev, 0x11), 0);
    rig.close(&mut a, dev);
    let mut b = rig.client("127.0.0.3", "host-b");
    denied(rig.open(&mut b, "vol"));
    // An export without a list is open to every host.
    assert!(rig.open(&mut b, "open").is_ok());

    // A network: 127.0.0.0/30 holds .0 to .3.
    rig.allow(&["127.0.0.0/30"]);
    let mut c = rig.client("127.0.0.3", "host-c");
    let (dev, _) = rig
        .open(&mut c, "vol")
        .expect("127.0.0.3 is in 127.0.0.0/30");
    rig.close(&mut c, dev);
    let mut d = rig.client("127.0.0.4", "host-d");
    denied(rig.open(&mut d, "vol"));

    // A session name, whatever the address.
    rig.allow(&["sess:host-e"]);
    let mut e = rig.client("127.0.0.5", "host-e");
    let (dev, _) = rig.open(&mut e, "vol").expect("sess:host-e is allowed");
    assert_eq!(rig.write_read(&mut e, dev, 0x22), 0);
    let mut f = rig.client("127.0.0.5", "host-f");
    denied(rig.open(&mut f, "vol"));
    for c in [a, b, c, d, e, f] {
        c.session.close();
    }
}

#[test]
fn a_denied_open_names_the_device_and_is_not_retried() {
    let mut rig = Rig::new();
    rig.allow(&["10.0.0.0/8"]);
    let mut c = rig.client("127.0.0.2", "refused");
    let (h, r) = rig.open_h(&mut c, "vol");
    let e = denied(r.map(|info| (h, info)));
    let msg = e.to_string();
    assert!(
        msg.contains("'vol'") && msg.contains("access denied"),
        "{msg}"
    );
    // The handle is dead and nothing more is sent: SESS_INFO and the one OPEN.
    assert!(c.rnbd.device(h).is_none());
    let reads = rig.reads_from("refused");
    assert_eq!(reads, 2);
    let mut out = vec![
        ClientEvent::Io {
            tag: 0,
            result: Ok(())
        };
        8
    ];
    for _ in 0..2000 {
        rig.sim.step();
        let n = rig
            .sim
            .reactor(0)
            .with_ctx(|cx| c.rnbd.poll(cx.now(), &mut out));
        assert_eq!(n, 0, "{:?}", &out[..n]);
    }
    assert_eq!(rig.reads_from("refused"), reads);
    c.session.close();
}

#[test]
fn removing_a_host_keeps_its_open_devices() {
    let mut rig = Rig::new();
    rig.allow(&["127.0.0.2", "127.0.0.3"]);
    let mut a = rig.client("127.0.0.2", "keeps");
    let (dev, _) = rig.open(&mut a, "vol").unwrap();
    assert_eq!(rig.write_read(&mut a, dev, 0x33), 0);
    let id = rig.exports.lookup(b"vol").unwrap();
    assert!(rig.exports.hosts(id).remove(&"127.0.0.2".parse().unwrap()));
    // Its device keeps working...
    assert_eq!(rig.write_read(&mut a, dev, 0x44), 0);
    // ...but a new OPEN of the host is refused, in another session or in this one.
    let mut b = rig.client("127.0.0.2", "again");
    denied(rig.open(&mut b, "vol"));
    rig.sim
        .reactor(0)
        .with_ctx(|cx| a.rnbd.close(cx.now(), dev))
        .unwrap();
    assert!(matches!(
        rig.events(&mut a)[..],
        [ClientEvent::Closed { .. }]
    ));
    denied(rig.open(&mut a, "vol"));
    // The host still allowed opens; removing the export ends its device.
    let mut c = rig.client("127.0.0.3", "other");
    let (dev, _) = rig.open(&mut c, "vol").unwrap();
    assert_eq!(rig.write_read(&mut c, dev, 0x55), 0);
    rig.exports.remove("vol");
    assert_eq!(rig.write_read(&mut c, dev, 0x66), -libc::EIO);
    for c in [a, b, c] {
        c.session.close();
    }
}
