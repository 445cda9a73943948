//! Unit tests of the chunk trailers, placements and rkey responses.

use super::*;

const DESC: SgDesc = SgDesc {
    addr: 0x7f00_0000_1000,
    key: 0x1234,
    len: 4096,
};

/// A chunk with a READ request for `data_len` bytes and `usr_len` bytes of header.
fn read_chunk(chunk_size: usize, data_len: u32, usr_len: u16, desc: Option<SgDesc>) -> Vec<u8> {
    let mut c = vec![0u8; chunk_size];
    let off = (data_len + u32::from(usr_len)) as usize;
    RdmaRead {
        usr_len,
        desc,
        need_inval: desc.is_some(),
    }
    .encode(&mut c[off..])
    .unwrap();
    c
}

#[test]
fn write_chunk_round_trip() {
    let p = write_placement(100, 32, 8192, 4096).unwrap();
    assert_eq!(
        p,
        ReqPlacement {
            remote_offset: 0,
            hdr_len: 36,
            imm_offset: 132
        }
    );
    let mut c = vec![0u8; 8192];
    RdmaWrite { usr_len: 32 }.encode(&mut c[132..]).unwrap();
    let r = ChunkReq::decode_in_chunk(&c, 132).unwrap();
    assert_eq!(r.op, ChunkOp::Write);
    assert_eq!(
        (r.data_len(), r.data_range(), r.usr_range()),
        (100, 0..100, 100..132)
    );
    assert!(!r.is_read());
}

#[test]
fn read_chunk_round_trip() {
    let p = read_placement(4096, 32, 1, 8192, 4096).unwrap();
    assert_eq!(
        p,
        ReqPlacement {
            remote_offset: 4096,
            hdr_len: 56,
            imm_offset: 4128
        }
    );
    let c = read_chunk(8192, 4096, 32, Some(DESC));
    let r = ChunkReq::decode_in_chunk(&c, 4128).unwrap();
    assert_eq!(
        r.op,
        ChunkOp::Read {
            desc: Some(DESC),
            need_inval: true
        }
    );
    assert_eq!(r.data_len(), 4096);
    // A flush: READ with no descriptor and no data.
    let c = read_chunk(8192, 0, 32, None);
    let r = ChunkReq::decode_in_chunk(&c, 32).unwrap();
    assert_eq!(
        r.op,
        ChunkOp::Read {
            desc: None,
            need_inval: false
        }
    );
    // The decoder also works on the trailer bytes alone.
    let c = read_chunk(8192, 4096, 32, Some(DESC));
    assert!(ChunkReq::decode(&c[4128..4128 + 24], 4128, 8192).is_ok());
    assert!(matches!(
        ChunkReq::decode(&c[4128..4128 + 23], 4128, 8192),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn chunk_checks() {
    let field = |c: &[u8], off| ChunkReq::decode_in_chunk(c, off).unwrap_err().field_name();
    let c = read_chunk(8192, 4096, 32, Some(DESC));
    assert_eq!(field(&c, 8192), Some("offset"));
    assert_eq!(field(&c, 0), Some("type")); // zeros: INFO_REQ type
                                            // usr_len > offset.
    let mut c2 = vec![0u8; 8192];
    RdmaWrite { usr_len: 33 }.encode(&mut c2[32..]).unwrap();
    assert_eq!(field(&c2, 32), Some("usr_len"));
    // Trailer past the end of the chunk: WRITE at 8190, READ desc at 8192-8.
    let mut c3 = vec![0u8; 8192];
    c3[8190] = 2;
    assert_eq!(field(&c3, 8190), Some("offset"));
    let mut c4 = vec![0u8; 8192];
    RdmaRead {
        usr_len: 0,
        desc: None,
        need_inval: false,
    }
    .encode(&mut c4[8184..])
    .unwrap();
    assert!(ChunkReq::decode_in_chunk(&c4, 8184).is_ok());
    c4[8190] = 1; // sg_cnt = 1, descriptor would end past the chunk
    assert_eq!(field(&c4, 8184), Some("offset"));
    c4[8191] = 1; // sg_cnt = 257 (a big-endian 1 would be 256)
    assert_eq!(field(&c4, 8184), Some("sg_cnt"));
    c4[8190] = 0; // sg_cnt = 256
    assert_eq!(field(&c4, 8184), Some("sg_cnt"));
    // sg_cnt 2 with room: refused.
    let mut c5 = read_chunk(8192, 4096, 32, Some(DESC));
    c5[4128 + 6] = 2;
    assert_eq!(field(&c5, 4128), Some("sg_cnt"));
    // desc.len larger than the reply area, or zero.
    let big = SgDesc { len: 4097, ..DESC };
    let c6 = read_chunk(8192, 4096, 32, Some(big));
    assert_eq!(field(&c6, 4128), Some("len"));
    let mut c7 = read_chunk(8192, 4096, 32, Some(DESC));
    c7[4128 + 8 + 12..4128 + 24].fill(0);
    assert_eq!(field(&c7, 4128), Some("len"));
    // NEED_INVAL without a descriptor is ignored; unknown flags ignored.
    let mut c8 = read_chunk(8192, 0, 32, None);
    c8[32 + 4] = 0xff;
    c8[32 + 5] = 0xff;
    assert_eq!(
        ChunkReq::decode_in_chunk(&c8, 32).unwrap().op,
        ChunkOp::Read {
            desc: None,
            need_inval: false
        }
    );
}

#[test]
fn tiny_chunks_are_refused_without_overflow() {
    // Found by cargo-fuzz: a chunk smaller than the trailer.
    for cs in 1..=24u32 {
        for off in 0..cs {
            let e = ChunkReq::decode(&[3, 0, 0, 0, 0, 0, 1, 0], off, cs);
            assert!(e.is_err(), "chunk {cs} offset {off}");
        }
    }
    assert!(ChunkReq::decode_in_chunk(&[], 0).is_err());
}

#[test]
fn placement_limits() {
    // Header limit (the kernel's -EMSGSIZE): usr_len + trailer <= max_hdr_size.
    assert!(write_placement(0, 4092, 8192, 4096).is_ok());
    assert_eq!(
        write_placement(0, 4093, 8192, 4096)
            .unwrap_err()
            .to_string(),
        "rdma_write.usr_len: 4093 (0xffd) cannot be sent, expected <= 4092 (0xffc)"
    );
    assert!(read_placement(0, 4072, 1, 8192, 4096).is_ok());
    assert!(read_placement(0, 4073, 1, 8192, 4096).is_err());
    assert!(read_placement(0, 0, 2, 8192, 4096).is_err());
    // Chunk limit.
    assert!(write_placement(8192 - 36, 32, 8192, 4096).is_ok());
    assert!(write_placement(8192 - 35, 32, 8192, 4096).is_err());
    assert!(read_placement(8192 - 56, 32, 1, 8192, 4096).is_ok());
    assert!(read_placement(8192 - 55, 32, 1, 8192, 4096).is_err());
    assert!(write_placement(u32::MAX, 32, 8192, 4096).is_err());
}

#[test]
fn trailer_encode_limits() {
    let r = RdmaRead {
        usr_len: 0,
        desc: None,
        need_inval: true,
    };
    assert!(r.encode(&mut [0; 8]).is_err());
    let r = RdmaRead {
        usr_len: 0,
        desc: Some(SgDesc { len: 0, ..DESC }),
        need_inval: false,
    };
    assert!(r.encode(&mut [0; 24]).is_err());
    let r = RdmaRead {
        usr_len: 0,
        desc: Some(DESC),
        need_inval: false,
    };
    assert!(r.encode(&mut [0; 23]).is_err());
    assert_eq!(r.encode(&mut [0; 30]), Ok(24));
    assert!(RdmaWrite { usr_len: 1 }.encode(&mut [0; 3]).is_err());
    assert!(RdmaWrite::decode(&[3, 0, 0, 0]).is_err());
    assert!(RdmaRead::decode(&[2, 0, 0, 0, 0, 0, 0, 0]).is_err());
}

#[test]
fn rkey_rsp_checks() {
    let b = RkeyRsp {
        buf_id: 5,
        rkey: 0xdead_beef,
    }
    .to_bytes();
    assert_eq!(
        RkeyRsp::decode(&b, 8, 5),
        Ok(RkeyRsp {
            buf_id: 5,
            rkey: 0xdead_beef
        })
    );
    assert_eq!(
        RkeyRsp::decode(&b, 5, 5).unwrap_err().field_name(),
        Some("buf_id")
    );
    assert_eq!(
        RkeyRsp::decode(&b, 8, 4).unwrap_err().field_name(),
        Some("buf_id")
    );
    assert!(matches!(
        RkeyRsp::decode(&b[..7], 8, 5),
        Err(DecodeError::Truncated { .. })
    ));
    let mut t = b;
    t[0] = 1;
    assert_eq!(
        RkeyRsp::decode(&t, 8, 5).unwrap_err().field_name(),
        Some("type")
    );
    assert!(RkeyRsp { buf_id: 0, rkey: 0 }.encode(&mut [0; 7]).is_err());
}
