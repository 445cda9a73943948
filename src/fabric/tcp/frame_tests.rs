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
    let b = h.to_bytes();
    #[rustfmt::skip]
    let golden: [u8; HEADER_LEN] = [
        b'R', b'T', b'C', b'P', 1, 0x05, 0, 0,
        0x04, 0x03, 0x02, 0x01, 0xdd, 0xcc, 0xbb, 0xaa,
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
        0xef, 0xbe, 0xad, 0xde, 0, 0, 0, 0,
        0x11, 0x10, 0x0f, 0x0e, 0x0d, 0x0c, 0x0b, 0x0a,
    ];
    assert_eq!(b, golden);
    assert_eq!(Header::decode(&b), Ok(h));
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
        Header::cm(Opcode::CmReq),
        Header::cm(Opcode::CmRep),
        Header::cm(Opcode::CmRej),
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
    b[4] = 2;
    assert_eq!(
        Header::decode(&b),
        Err(FrameError::UnsupportedVersion { version: 2 })
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
    assert_eq!((magic, version, len), (MAGIC, 1, 0));
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
            b[..6].copy_from_slice(&[b'R', b'T', b'C', b'P', 1, (x >> 8) as u8 % 0x32]);
        }
        if let Ok(h) = Header::decode(&b) {
            ok += 1;
            assert_eq!(h.to_bytes(), b, "decoded frames re-encode identically");
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
    let f = cm_frame(Opcode::CmRej, &p);
    let h = Header::decode(f[..HEADER_LEN].try_into().unwrap()).unwrap();
    assert_eq!((h.opcode, h.len), (Opcode::CmRej, CM_PAYLOAD_LEN as u32));
    let back = CmPayload::decode(f[HEADER_LEN..].try_into().unwrap()).unwrap();
    assert_eq!(back, p);
    assert_eq!(back.max_version, 1);

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
