//! Joining a session is authorised (docs/ARCHITECTURE.md, "Session slots"), against the
//! built `rtrs-target` on 127.0.0.x. A session's `paths_uuid` and a path's `sess_uuid`
//! travel in clear in every connection request, so the attacker here knows them (the
//! test reads them off the victim, as a host on the path of the victim's requests
//! would):
//! - the victim (an address `--allow` admits) has `vol` open and data written; a host
//!   the list refuses asks for a new path in the victim's session, for a reconnect of
//!   the victim's own path, and for a new session under the victim's `paths_uuid`: each
//!   is refused with −EACCES and a log line saying why, the victim's path stays up and
//!   its data reads back untouched; a second path from an address the list admits joins
//!   and carries IO;
//! - a refused host that joins before the victim opens its device makes that OPEN fail
//!   (−EACCES naming its address): the device is never opened with it in the session.
//!
//! Waits are bounded; nothing is timed.

use crate::cli_util;
use crate::rnbd_raw;

use std::net::SocketAddr;

use cli_util::start_target_logged;
use rnbd_raw::{open, read, write, Remote};
use rtrs_spdk::common::random_uuid;
use rtrs_spdk::proto::rnbd::AccessMode;

use crate::server_util::client::{info_req, Ids, TestPath};

/// A path of `ids` from 127.0.0.`src` (2 connections); the path or the refusal's errno.
fn path(r: &mut Remote, src: u8, name: &str, ids: Ids, first_conn: bool) -> Result<TestPath, i32> {
    let addr = r.addr;
    TestPath::connect_info_from(
        r,
        Some(SocketAddr::from(([127, 0, 0, src], 0))),
        addr,
        &info_req(name),
        2,
        ids,
        first_conn,
    )
}

fn data(seed: u8) -> Vec<u8> {
    (0..4096)
        .map(|i| (i as u8).wrapping_mul(7) ^ seed)
        .collect()
}

#[test]
fn a_refused_host_cannot_join_a_session_that_has_a_device_open() {
    let (t, _) = start_target_logged(
        &["vol=ram:16M"],
        &[
            "--allow",
            "vol=127.0.0.2",
            "--allow",
            "vol=127.0.0.4",
            "--queue-depth",
            "64",
        ],
    );
    let mut r = Remote::new(SocketAddr::from(([127, 0, 0, 1], t.port)));
    let ids = Ids::random();
    let mut victim = path(&mut r, 2, "victim", ids, true).expect("the victim's session");
    let dev = open(&mut victim, &mut r, "vol", AccessMode::ReadWrite).expect("open vol");
    for b in 0..8u64 {
        assert_eq!(write(&mut victim, &mut r, dev, b * 8, &data(b as u8)), 0);
    }

    // A new path in the victim's session, a reconnect of its path, a new session
    // under its paths_uuid: all from 127.0.0.3, which the host list refuses.
    let tries = [
        (
            "a new path",
            Ids {
                sess_uuid: random_uuid(),
                ..ids
            },
            false,
        ),
        (
            "a reconnect of the victim's path",
            Ids {
                recon_cnt: ids.recon_cnt + 1,
                ..ids
            },
            false,
        ),
        (
            "a first connection",
            Ids {
                sess_uuid: random_uuid(),
                ..ids
            },
            true,
        ),
    ];
    for (what, ids, first) in tries {
        let got = path(&mut r, 3, "attacker", ids, first).err();
        assert_eq!(got, Some(-libc::EACCES), "{what} from 127.0.0.3");
    }
    let line = t.wait_log(&[
        "refusing connection from 127.0.0.3",
        "path joining",
        "EACCES",
    ]);
    assert!(
        line.contains("'vol'") && line.contains("127.0.0.3"),
        "the log line names the device and the address: {line}"
    );

    // The victim is still served, its data untouched.
    victim.poll();
    assert!(!victim.down, "{:?}", victim.events);
    for b in 0..8u64 {
        let (e, got) = read(&mut victim, &mut r, dev, b * 8, 4096);
        assert_eq!(e, 0);
        assert!(got == data(b as u8), "block {b} changed");
    }

    // An address the list admits joins, and its path carries the device's IO.
    let mut second = path(
        &mut r,
        4,
        "victim",
        Ids {
            sess_uuid: random_uuid(),
            ..ids
        },
        false,
    )
    .expect("a second path from an allowed address");
    let (e, got) = read(&mut second, &mut r, dev, 0, 4096);
    assert_eq!((e, got), (0, data(0)));
}

#[test]
fn a_path_that_joined_before_the_open_makes_the_open_fail() {
    let (t, _) = start_target_logged(
        &["vol=ram:16M"],
        &["--allow", "vol=127.0.0.2", "--queue-depth", "64"],
    );
    let mut r = Remote::new(SocketAddr::from(([127, 0, 0, 1], t.port)));
    let ids = Ids::random();
    let mut victim = path(&mut r, 2, "early", ids, true).expect("the victim's session");
    // No device is open yet: nothing to check the joiner against, so it gets in...
    let attacker = path(
        &mut r,
        3,
        "early",
        Ids {
            sess_uuid: random_uuid(),
            ..ids
        },
        false,
    )
    .expect("a join before any OPEN");
    // ... and the OPEN, which would let it carry the device's IO, is refused.
    let got = open(&mut victim, &mut r, "vol", AccessMode::ReadWrite);
    assert_eq!(got, Err(-libc::EACCES));
    t.wait_log(&[
        "open refused",
        "the session has a path from 127.0.0.3",
        "EACCES",
    ]);
    // Without it, the same client opens the device.
    drop(attacker);
    let mut again = path(&mut r, 2, "early-2", Ids::random(), true).expect("a new session");
    let dev = open(&mut again, &mut r, "vol", AccessMode::ReadWrite).expect("open vol");
    assert_eq!(write(&mut again, &mut r, dev, 0, &data(1)), 0);
}
