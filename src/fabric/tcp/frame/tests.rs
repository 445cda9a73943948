//! Unit tests of the frame format: golden bytes, round trips, validation, garbage.

use super::*;

#[test]
fn golden_bytes_of_a_write_with_imm() {
    let h = Header {
        opcode: Opcode::RdmaWriteWithImm,
        len: 0x0102_0304,
        rkey: 0xaabb_ccdd,
        remote_addr: 0x1122_3344_5566_7788,
        imm: 0xdead_beef,
        inv_rkey: 0,
        seq: 0x0a0b_0c0d_0e0f_1011,
    };
    let b = h.to_bytes_as(V1);
    #[rustfmt::skip]
    let mut golden: [u8; HEADER_LEN] = [
        b'R', b'T', b'C', b'P', 1, 0x05, 0, 0,
        0x04, 0x03, 0x02, 0x01, 0xdd, 0xcc, 0xbb, 0xaa,
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
        0xef, 0xbe, 0xad, 0xde, 0, 0, 0, 0,
        0x11, 0x10, 0x0f, 0x0e, 0x0d, 0x0c, 0x0b, 0x0a,
    ];
    assert_eq!(b, golden);
    assert_eq!(Header::decode_as(&b, V1), Ok(h));
    // Version 2 differs in the version byte only.
    golden[4] = 2;
    assert_eq!(h.to_bytes(), golden);
    assert_eq!(Header::decode_as(&golden, V2), Ok(h));
    assert_eq!(
        Header::decode_as(&golden, V1),
        Err(FrameError::WrongVersion {
            found: 2,
            expected: 1
        })
    );
}

#[test]
fn golden_bytes_of_the_version_2_handshake() {
    let payload = CmPayload::new(RejectReason::None, PrivateData::new(b"pd").unwrap());
    let mut p = [0u8; CM_PAYLOAD_LEN];
    payload.encode(&mut p);
    let nonce = [0xaa; NONCE_LEN];
    let (req, n) = v2_frame(Opcode::CmReq, &[&p, &nonce]);
    assert_eq!(n, HEADER_LEN + 96);
    #[rustfmt::skip]
    let head: [u8; 48] = [
        b'R', b'T', b'C', b'P', 2, 0x20, 0, 0,
        96, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0,
        // CM payload: max_version 2, pd_len 2, reason 0, reserved, "pd"
        2, 0, 2, 0, 0, 0, 0, 0,
    ];
    assert_eq!(req[..48], head);
    assert_eq!(&req[48..50], b"pd");
    assert!(req[50..HEADER_LEN + 64].iter().all(|&b| b == 0));
    assert_eq!(req[HEADER_LEN + 64..n], [0xaa; 32]);
    let h = Header::decode_as(req[..HEADER_LEN].try_into().unwrap(), V2).unwrap();
    assert_eq!((h.opcode, h.len), (Opcode::CmReq, 96));

    let (ch, n) = v2_frame(Opcode::CmChallenge, &[&[1; 32], &[2; 32]]);
    assert_eq!(n, HEADER_LEN + 64);
    assert_eq!(
        ch[..12],
        [b'R', b'T', b'C', b'P', 2, 0x23, 0, 0, 64, 0, 0, 0]
    );
    assert_eq!(ch[HEADER_LEN..HEADER_LEN + 32], [1; 32]);
    assert_eq!(ch[HEADER_LEN + 32..n], [2; 32]);
    let (pr, n) = v2_frame(Opcode::CmProof, &[&[3; 32]]);
    assert_eq!(n, HEADER_LEN + 32);
    assert_eq!(
        pr[..12],
        [b'R', b'T', b'C', b'P', 2, 0x24, 0, 0, 32, 0, 0, 0]
    );
    for f in [&ch[..HEADER_LEN], &pr[..HEADER_LEN]] {
        let b: &[u8; HEADER_LEN] = f.try_into().unwrap();
        assert!(Header::decode_as(b, V2).is_ok());
    }
}

#[test]
fn handshake_frames_are_checked_per_version() {
    // The version-2 opcodes do not exist in version 1.
    for op in [Opcode::CmChallenge, Opcode::CmProof] {
        let mut h = Header::new(op);
        h.len = cm_payload_len(op, V2) as u32;
        assert_eq!(
            Header::decode_as(&h.to_bytes_as(V1), V1),
            Err(FrameError::OpcodeVersion {
                opcode: op,
                version: V1
            })
        );
        assert_eq!(Header::decode_as(&h.to_bytes_as(V2), V2), Ok(h));
    }
    // CM_REQ is 64 bytes in version 1, 96 in version 2.
    let mut req = Header::cm(Opcode::CmReq);
    assert!(Header::decode_as(&req.to_bytes_as(V1), V1).is_ok());
    assert!(matches!(
        Header::decode_as(&req.to_bytes_as(V2), V2),
        Err(FrameError::Length { expected: 96, .. })
    ));
    req.len = 96;
    assert!(Header::decode_as(&req.to_bytes_as(V2), V2).is_ok());
    assert!(Header::decode_as(&req.to_bytes_as(V1), V1).is_err());
    // A proof of the wrong length, a challenge with a sequence number.
    let mut p = Header::new(Opcode::CmProof);
    p.len = 31;
    assert!(Header::decode_as(&p.to_bytes_as(V2), V2).is_err());
    let mut c = Header::new(Opcode::CmChallenge);
    c.len = 64;
    c.seq = 1;
    assert!(Header::decode_as(&c.to_bytes_as(V2), V2).is_err());
    // The authentication-failed rejection round-trips.
    let rej = CmPayload::new(RejectReason::AuthFailed, PrivateData::empty());
    let mut b = [0u8; CM_PAYLOAD_LEN];
    rej.encode(&mut b);
    assert_eq!(b[3], 3);
    assert_eq!(CmPayload::decode(&b), Ok(rej));
}

#[test]
fn every_opcode_round_trips() {
    let hs = [
        Header {
            len: 7,
            seq: 1,
            ..Header::new(Opcode::Send)
        },
        Header {
            len: 7,
            imm: 9,
            seq: 2,
            ..Header::new(Opcode::SendWithImm)
        },
        Header {
            inv_rkey: 0x1234,
            seq: 3,
            ..Header::new(Opcode::SendWithInv)
        },
        Header {
            len: 1 << 20,
            rkey: 5,
            remote_addr: 4096,
            seq: 4,
            ..Header::new(Opcode::RdmaWrite)
        },
        Header {
            imm: 1,
            seq: 5,
            ..Header::new(Opcode::RdmaWriteWithImm)
        },
        Header::ack(99),
        Header::nak(7, WcStatus::RemoteAccess),
        Header {
            len: 96,
            ..Header::new(Opcode::CmReq)
        },
        Header::cm(Opcode::CmRep),
        Header::cm(Opcode::CmRej),
        Header {
            len: 64,
            ..Header::new(Opcode::CmChallenge)
        },
        Header {
            len: 32,
            ..Header::new(Opcode::CmProof)
        },
        Header::new(Opcode::Disconnect),
    ];
    for h in hs {
        assert_eq!(Header::decode(&h.to_bytes()), Ok(h), "{h:?}");
    }
    assert_eq!(
        Header::nak(7, WcStatus::RemoteAccess).nak_status(),
        WcStatus::RemoteAccess
    );
}

#[test]
fn invalid_headers_are_errors() {
    let good = Header::ack(1).to_bytes();
    let mut b = good;
    b[0] = b'X';
    assert!(matches!(
        Header::decode(&b),
        Err(FrameError::BadMagic { .. })
    ));
    let mut b = good;
    b[4] = 3;
    assert_eq!(
        Header::decode(&b),
        Err(FrameError::UnsupportedVersion { version: 3 })
    );
    b[4] = 0;
    assert_eq!(
        Header::decode(&b),
        Err(FrameError::UnsupportedVersion { version: 0 })
    );
    b[4] = 1;
    assert_eq!(
        Header::decode(&b),
        Err(FrameError::WrongVersion {
            found: 1,
            expected: 2
        })
    );
    let mut b = good;
    b[5] = 0x7f;
    assert_eq!(
        Header::decode(&b),
        Err(FrameError::UnknownOpcode { opcode: 0x7f })
    );
    let mut b = good;
    b[6] = 1;
    assert!(matches!(Header::decode(&b), Err(FrameError::Flags { .. })));
    let mut b = good;
    b[8] = 1;
    assert!(matches!(Header::decode(&b), Err(FrameError::Length { .. })));
    let mut b = good;
    b[12] = 1;
    assert!(matches!(
        Header::decode(&b),
        Err(FrameError::Reserved { field: "rkey", .. })
    ));
    let send_with_addr = Header {
        remote_addr: 1,
        ..Header::new(Opcode::Send)
    };
    assert!(Header::decode(&send_with_addr.to_bytes()).is_err());
    let nak_success = Header {
        seq: 1,
        ..Header::new(Opcode::Nak)
    };
    assert_eq!(
        Header::decode(&nak_success.to_bytes()),
        Err(FrameError::NakStatus { code: 0 })
    );
    let cm_short = Header {
        len: 3,
        ..Header::new(Opcode::CmReq)
    };
    assert!(matches!(
        Header::decode(&cm_short.to_bytes()),
        Err(FrameError::Length { .. })
    ));
    let (magic, version, len) = peek_version(&b);
    assert_eq!((magic, version, len), (MAGIC, VERSION, 0));
}

#[test]
fn garbage_never_panics() {
    // A deterministic pseudo-random stream, plus variations of a valid header.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut ok = 0;
    for i in 0..20_000 {
        let mut b = [0u8; HEADER_LEN];
        for byte in b.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *byte = x as u8;
        }
        if i % 2 == 0 {
            let version = 1 + (i / 2 % 2) as u8;
            b[..6].copy_from_slice(&[b'R', b'T', b'C', b'P', version, (x >> 8) as u8 % 0x32]);
        }
        for v in [V1, V2] {
            if let Ok(h) = Header::decode_as(&b, v) {
                ok += 1;
                assert_eq!(h.to_bytes_as(v), b, "decoded frames re-encode identically");
            }
        }
        let mut p = [0u8; CM_PAYLOAD_LEN];
        p[..HEADER_LEN].copy_from_slice(&b);
        p[HEADER_LEN..].copy_from_slice(&b[..CM_PAYLOAD_LEN - HEADER_LEN]);
        if let Ok(c) = CmPayload::decode(&p) {
            let mut again = [0u8; CM_PAYLOAD_LEN];
            c.encode(&mut again);
            assert_eq!(CmPayload::decode(&again), Ok(c));
        }
    }
    // Random bytes almost never make a valid frame.
    assert!(ok < 100, "{ok} random headers decoded");
}

#[test]
fn cm_payload_round_trip_and_checks() {
    let pd = PrivateData::new(&[7; 56]).unwrap();
    let p = CmPayload::new(RejectReason::Consumer, pd);
    let f = cm_frame(VERSION, Opcode::CmRej, &p);
    let h = Header::decode(f[..HEADER_LEN].try_into().unwrap()).unwrap();
    assert_eq!((h.opcode, h.len), (Opcode::CmRej, CM_PAYLOAD_LEN as u32));
    let back = CmPayload::decode(f[HEADER_LEN..].try_into().unwrap()).unwrap();
    assert_eq!(back, p);
    assert_eq!(back.max_version, 2);

    let mut bad = [0u8; CM_PAYLOAD_LEN];
    bad[2] = 57;
    assert_eq!(
        CmPayload::decode(&bad),
        Err(FrameError::PrivateDataLen { len: 57 })
    );
    let mut bad = [0u8; CM_PAYLOAD_LEN];
    bad[3] = 9;
    assert_eq!(
        CmPayload::decode(&bad),
        Err(FrameError::RejectReason { reason: 9 })
    );
    let mut bad = [0u8; CM_PAYLOAD_LEN];
    bad[5] = 1;
    assert_eq!(CmPayload::decode(&bad), Err(FrameError::CmReserved));
}
