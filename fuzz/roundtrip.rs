//! Round-trip oracle for the wire decoders, shared by the in-suite fuzz loop
//! (`tests/proto/fuzz.rs`) and the cargo-fuzz target (`fuzz_targets/decode_all.rs`).
//!
//! For each decoder: feed it bytes; it must not panic; if it accepts them, the value
//! must re-encode, and the re-encoded bytes must equal the input on every meaningful
//! bit while every ignored bit (reserved bytes, padding, minor version, unknown flags)
//! comes out zero. Invariants the decoder promises (offsets inside the chunk, chunk
//! count equal to the queue depth, ...) are asserted too.

#![allow(dead_code)]

use core::ops::Range;

use rtrs_spdk::proto::rnbd::{Close, Io, Open, OpenRsp, RnbdMsg, SessInfo, SessInfoRsp};
use rtrs_spdk::proto::{
    imm_payload, to_imm, ChunkOp, ChunkReq, ConnReq, ConnRsp, Imm, ImmLayout, ImmType, InfoReq,
    InfoRsp, RdmaRead, RdmaWrite, RkeyRsp,
};
use rtrs_spdk::Errno;

/// Session context the context-dependent decoders take.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    pub queue_depth: u16,
    pub chunk_size: u32,
    pub msg_id: u32,
    pub offset: u32,
    pub max_usr_hdr: u32,
}

/// One decoder under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    ConnReq,
    ConnRsp,
    InfoReq,
    InfoRsp,
    RkeyRsp,
    RdmaWrite,
    RdmaRead,
    Chunk,
    Imm,
    SessInfo,
    SessInfoRsp,
    Open,
    OpenRsp,
    Close,
    Io,
    RnbdMsg,
}

pub const TARGETS: [Target; 16] = [
    Target::ConnReq,
    Target::ConnRsp,
    Target::InfoReq,
    Target::InfoRsp,
    Target::RkeyRsp,
    Target::RdmaWrite,
    Target::RdmaRead,
    Target::Chunk,
    Target::Imm,
    Target::SessInfo,
    Target::SessInfoRsp,
    Target::Open,
    Target::OpenRsp,
    Target::Close,
    Target::Io,
    Target::RnbdMsg,
];

/// Asserts `re` equals `orig` on the bits of `meaningful` (byte range, bit mask) and is
/// zero on every other bit of `re`.
fn same(name: &str, orig: &[u8], re: &[u8], meaningful: &[(Range<usize>, u8)]) {
    for (i, &r) in re.iter().enumerate() {
        let m = meaningful
            .iter()
            .filter(|(rg, _)| rg.contains(&i))
            .fold(0u8, |acc, (_, m)| acc | m);
        assert_eq!(
            orig[i] & m,
            r & m,
            "{name}: byte {i} differs after re-encoding (orig {orig:02x?}, re {re:02x?})"
        );
        assert_eq!(
            r & !m,
            0,
            "{name}: ignored bits of byte {i} re-encoded non-zero"
        );
    }
}

const ALL: u8 = 0xff;

fn check_rdma_read(name: &str, data: &[u8], r: &RdmaRead) {
    let mut out = [0u8; 24];
    let n = r.encode(&mut out).expect("decoded rdma_read re-encodes");
    assert_eq!(n, if r.desc.is_some() { 24 } else { 8 });
    let flag = if r.desc.is_some() { 1 } else { 0 };
    same(
        name,
        data,
        &out[..n],
        &[(0..4, ALL), (4..5, flag), (6..n, ALL)],
    );
}

/// Runs one decoder on `data`; returns whether it accepted the input.
pub fn check(target: Target, ctx: &Ctx, data: &[u8]) -> bool {
    match target {
        Target::ConnReq => {
            let Ok(r) = ConnReq::decode(data) else {
                return false;
            };
            let re = r.to_bytes().expect("decoded conn_req re-encodes");
            same(
                "conn_req",
                data,
                &re,
                &[(2..4, ALL), (5..44, ALL), (44..45, 1)],
            );
            true
        }
        Target::ConnRsp => {
            let errno = ConnRsp::reject_errno(data);
            assert!(errno < 0, "reject_errno gave {errno}");
            assert_eq!(ConnRsp::refusal(data).neg(), errno);
            let accept = ConnRsp::decode_accept(data, ctx.max_usr_hdr);
            let Ok(r) = ConnRsp::decode(data) else {
                assert!(accept.is_err());
                assert_eq!(errno, Errno::ECONNRESET.neg());
                return false;
            };
            let re = r.to_bytes().expect("decoded conn_rsp re-encodes");
            match r {
                ConnRsp::Accept(a) => {
                    assert_eq!(errno, Errno::ECONNRESET.neg());
                    if let Ok(b) = accept {
                        assert_eq!(a, b);
                    }
                    let qd_bits = u64::from(a.queue_depth)
                        .next_power_of_two()
                        .trailing_zeros();
                    let cs_bits = a.chunk_size().next_power_of_two().trailing_zeros();
                    assert!(qd_bits + cs_bits <= 28 && a.queue_depth >= 1);
                    same(
                        "conn_rsp",
                        data,
                        &re,
                        &[(0..2, ALL), (3..16, ALL), (16..17, 2)],
                    );
                }
                ConnRsp::Reject(j) => {
                    assert!(accept.is_err());
                    assert_eq!(errno, j.errno);
                    same("conn_rsp", data, &re, &[(0..2, ALL), (3..6, ALL)]);
                }
            }
            true
        }
        Target::InfoReq => {
            let Ok(r) = InfoReq::decode(data) else {
                return false;
            };
            let mut re = [0u8; InfoReq::LEN];
            r.encode(&mut re).expect("decoded info_req re-encodes");
            let end = 2 + r.pathname.len() + 1;
            same("info_req", data, &re, &[(0..end, ALL)]);
            true
        }
        Target::InfoRsp => {
            let Ok(r) = InfoRsp::decode(data, ctx.queue_depth, ctx.chunk_size) else {
                return false;
            };
            assert!(r.sg_cnt() >= 1 && r.sg_cnt() <= ctx.queue_depth);
            assert_eq!(r.chunks().count(), usize::from(ctx.queue_depth));
            // Re-encode into a buffer the size of the client's receive buffer.
            let mut re = [0u8; 8 + 16 * 64];
            if usize::from(r.sg_cnt()) <= 64 {
                let n = InfoRsp::encode(r.descs(), &mut re).expect("info_rsp re-encodes");
                assert_eq!(n, InfoRsp::wire_len(r.sg_cnt()));
                same("info_rsp", data, &re[..n], &[(0..4, ALL), (8..n, ALL)]);
            }
            true
        }
        Target::RkeyRsp => {
            let Ok(r) = RkeyRsp::decode(data, ctx.queue_depth, ctx.msg_id) else {
                return false;
            };
            assert!(r.buf_id < ctx.queue_depth && u32::from(r.buf_id) == ctx.msg_id);
            same("rkey_rsp", data, &r.to_bytes(), &[(0..8, ALL)]);
            true
        }
        Target::RdmaWrite => {
            let Ok(r) = RdmaWrite::decode(data) else {
                return false;
            };
            same("rdma_write", data, &r.to_bytes(), &[(0..4, ALL)]);
            true
        }
        Target::RdmaRead => {
            let Ok(r) = RdmaRead::decode(data) else {
                return false;
            };
            check_rdma_read("rdma_read", data, &r);
            true
        }
        Target::Chunk => {
            let Ok(r) = ChunkReq::decode(data, ctx.offset, ctx.chunk_size) else {
                return false;
            };
            assert!(r.offset < ctx.chunk_size && u32::from(r.usr_len) <= r.offset);
            assert_eq!(r.data_len() + u32::from(r.usr_len), r.offset);
            assert_eq!(r.usr_range().end, r.offset as usize);
            let room = (ctx.chunk_size - r.offset) as usize;
            match r.op {
                ChunkOp::Write => {
                    assert!(room >= 4);
                    let w = RdmaWrite { usr_len: r.usr_len };
                    same("chunk write", data, &w.to_bytes(), &[(0..4, ALL)]);
                }
                ChunkOp::Read { desc, need_inval } => {
                    let rd = RdmaRead {
                        usr_len: r.usr_len,
                        desc,
                        need_inval,
                    };
                    assert!(room >= rd.wire_len());
                    if let Some(d) = desc {
                        assert!(d.len >= 1 && d.len <= r.data_len());
                    }
                    check_rdma_read("chunk read", data, &rd);
                }
            }
            true
        }
        Target::Imm => {
            let Some(raw) = data.get(..4) else {
                return false;
            };
            let raw = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
            let ok = match Imm::decode(raw) {
                Ok(imm) => {
                    assert_eq!(imm.to_imm(), raw);
                    true
                }
                Err(_) => false,
            };
            if let Ok(l) = ImmLayout::new(ctx.queue_depth, ctx.chunk_size) {
                if let Ok(req) = l.decode_io_req(raw) {
                    assert!(req.buf_id < ctx.queue_depth && req.offset < ctx.chunk_size);
                    let imm = l.io_req(req.buf_id, req.offset).expect("io_req re-encodes");
                    assert_eq!(imm, to_imm(ImmType::IoReq, imm_payload(raw)));
                }
            }
            ok
        }
        Target::SessInfo => {
            let Ok(r) = SessInfo::decode(data) else {
                return false;
            };
            same(
                "sess_info",
                data,
                &r.to_bytes(),
                &[(0..2, ALL), (4..5, ALL)],
            );
            true
        }
        Target::SessInfoRsp => {
            let Ok(r) = SessInfoRsp::decode(data) else {
                return false;
            };
            same(
                "sess_info_rsp",
                data,
                &r.to_bytes(),
                &[(0..2, ALL), (4..5, ALL)],
            );
            true
        }
        Target::Open => {
            let Ok(r) = Open::decode(data) else {
                return false;
            };
            let mut re = [0u8; Open::LEN];
            r.encode(&mut re).expect("decoded open re-encodes");
            let end = 6 + r.dev_name.len() + 1;
            same(
                "open",
                data,
                &re,
                &[(0..2, ALL), (4..5, ALL), (6..end, ALL)],
            );
            true
        }
        Target::OpenRsp => {
            let Ok(r) = OpenRsp::decode(data) else {
                return false;
            };
            let mut re = [0u8; OpenRsp::LEN];
            r.encode(&mut re).expect("decoded open_rsp re-encodes");
            assert!(r.logical_block_size.is_power_of_two() && r.logical_block_size >= 512);
            assert!(r.physical_block_size >= r.logical_block_size);
            same(
                "open_rsp",
                data,
                &re,
                &[(0..2, ALL), (4..44, ALL), (45..46, 3)],
            );
            true
        }
        Target::Close => {
            let Ok(r) = Close::decode(data) else {
                return false;
            };
            same("close", data, &r.to_bytes(), &[(0..2, ALL), (4..8, ALL)]);
            true
        }
        Target::Io => {
            let Ok(r) = Io::decode(data) else {
                return false;
            };
            let re = r.to_bytes();
            let mut m = vec![(0..2, ALL), (4..17, ALL), (17..18, 0x0f), (20..24, ALL)];
            if data.len() >= 32 {
                m.push((24..26, ALL));
            } else {
                assert_eq!(r.prio, 0);
            }
            same("io", data, &re[..data.len().min(32)], &m);
            true
        }
        Target::RnbdMsg => {
            let Ok(m) = RnbdMsg::decode(data) else {
                return false;
            };
            let sub = match m {
                RnbdMsg::SessInfo(_) => Target::SessInfo,
                RnbdMsg::Open(_) => Target::Open,
                RnbdMsg::Io(_) => Target::Io,
                RnbdMsg::Close(_) => Target::Close,
            };
            assert!(
                check(sub, ctx, data),
                "dispatch accepted what {sub:?} refuses"
            );
            true
        }
    }
}

/// Runs every decoder on `data`; returns how many accepted it.
pub fn check_all(ctx: &Ctx, data: &[u8]) -> usize {
    TARGETS.iter().filter(|&&t| check(t, ctx, data)).count()
}

/// Splits a fuzzer input into a context (first 12 bytes) and the message bytes.
pub fn split_input(data: &[u8]) -> (Ctx, &[u8]) {
    let mut p = [0u8; 12];
    let n = data.len().min(12);
    p[..n].copy_from_slice(&data[..n]);
    let qd = u16::from_le_bytes([p[0], p[1]]).max(1);
    // Mostly power-of-two chunk sizes 4 KiB..1 MiB, sometimes an arbitrary size.
    let chunk_size = if p[2] & 0x80 == 0 {
        1u32 << (12 + u32::from(p[2] % 9))
    } else {
        u32::from_le_bytes([p[3], p[4], p[5], 0]).max(1)
    };
    let ctx = Ctx {
        queue_depth: qd,
        chunk_size,
        msg_id: u32::from(u16::from_le_bytes([p[6], p[7]])),
        offset: u32::from(u16::from_le_bytes([p[8], p[9]])) % chunk_size,
        max_usr_hdr: u32::from(p[10]) * 4,
    };
    (ctx, &data[n..])
}
