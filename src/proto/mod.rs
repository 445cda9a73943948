//! Wire format of RTRS 2.0 and RNBD 2.x (pure: no I/O, no allocation).
//!
//! This module is the only place that parses or builds protocol bytes; it corresponds
//! to the kernel's `rtrs-pri.h` (RTRS messages and imm helpers) and `rnbd-proto.h`.
//! Every decoder takes `&[u8]` and returns a typed value or a [`DecodeError`] that names
//! the message, the field, the value found and what was expected; it checks every field
//! the peer controls (the docs/PROTOCOL.md §9 checklist, including the "Add" items a pure
//! decoder can check), ignores reserved bytes, never panics and never allocates.
//! Decoders that need session context (queue depth, chunk size, the largest user
//! header) take it as parameters. Encoders write into caller buffers (or return fixed
//! arrays) and refuse values the peer would reject, with an [`EncodeError`].
//! All multi-byte fields are little-endian; imm values are in host order (the fabric
//! does the big-endian conversion).
//!
//! # Message map
//!
//! | Message | Size | Carried by | Type | docs/PROTOCOL.md |
//! |---|---|---|---|---|
//! | imm: IO_REQ / IO_RSP(_W_INV) / HB_MSG / HB_ACK | 32 bits | WRITE_WITH_IMM, SEND_WITH_IMM | [`Imm`], [`ImmLayout`], [`IoReq`], [`IoRsp`] | §2.1, §4.5, §4.6, §5 |
//! | `rtrs_msg_conn_req` | 56 | CM REQ private data | [`ConnReq`] | §2.2, §3.3, §9.1 |
//! | `rtrs_msg_conn_rsp` | 56 | CM REP / REJ private data | [`ConnRsp`], [`ConnAccept`], [`ConnReject`] | §2.3, §3.2, §9.2 |
//! | `rtrs_msg_info_req` | 272 | SEND on cid 0 | [`InfoReq`] | §2.4, §3.5, §9.3 |
//! | `rtrs_msg_info_rsp` + `rtrs_sg_desc[]` | 8 + 16·n | SEND on cid 0 | [`InfoRsp`], [`SgDesc`] | §2.5, §3.6, §9.4 |
//! | `rtrs_msg_rkey_rsp` | 8 | SEND_WITH_IMM | [`RkeyRsp`] | §2.6, §9.6 |
//! | `rtrs_msg_rdma_read` | 8 + 16·n (n ≤ 1) | in the chunk | [`RdmaRead`], [`ChunkReq`] | §2.7, §2.9, §9.5 |
//! | `rtrs_msg_rdma_write` | 4 | in the chunk | [`RdmaWrite`], [`ChunkReq`] | §2.8, §2.9, §9.5 |
//! | chunk layout | — | — | [`write_placement`], [`read_placement`], [`ChunkReq`] | §2.9 |
//! | `rnbd_msg_sess_info` / `_rsp` | 36 / 36 | user header / READ data | [`rnbd::SessInfo`], [`rnbd::SessInfoRsp`] | §2.10, §7.1 |
//! | `rnbd_msg_open` / `_rsp` | 264 / 56 | user header / READ data | [`rnbd::Open`], [`rnbd::OpenRsp`] | §2.10, §7.2, §9.8 |
//! | `rnbd_msg_io` | 32 (≥ 24 accepted) | user header | [`rnbd::Io`] | §2.10, §7.3, §9.8 |
//! | `rnbd_msg_close` | 8 | user header | [`rnbd::Close`] | §2.10, §7.4 |
//!
//! # Typical calls
//!
//! Client: [`ConnReq::new`]`(..).encode(..)` for each connection;
//! [`ConnRsp::decode_accept`] on ESTABLISHED or [`ConnRsp::refusal`] on REJECTED;
//! [`ConnAccept::imm_layout`] (the session's [`ImmLayout`]); [`InfoReq::encode`];
//! a receive buffer of [`InfoRsp::wire_len`]`(qd)` bytes, then
//! [`InfoRsp::decode`]`(..).chunks()` to fill the per-chunk table; per request
//! [`write_placement`]/[`read_placement`], [`RdmaWrite`]/[`RdmaRead`] after the user
//! header and [`ImmLayout::io_req`]; on completion [`Imm::decode`] →
//! [`IoRsp::check_msg_id`], and [`RkeyRsp::decode`] with NEW_RKEY_F.
//!
//! Server: [`ConnReq::decode`], [`ConnRsp::accept`] / [`ConnRsp::reject`];
//! [`InfoReq::decode`], [`InfoRsp::encode`]; per imm [`Imm::decode`] →
//! [`ImmLayout::decode_io_req`] → [`ChunkReq::decode`] (then the user header at
//! [`ChunkReq::usr_range`]); respond with
//! [`IoRsp::new`]`(..).to_imm()` and, with NEW_RKEY_F, [`RkeyRsp::encode`].
//! RNBD on top: [`rnbd::RnbdMsg::decode`] on the user header.

mod conn;
pub mod constants;
mod error;
mod imm;
mod info;
mod io;
pub mod rnbd;
mod wire;

pub use conn::{ConnAccept, ConnReject, ConnReq, ConnRsp};
pub use constants::{ceil_log2, chunk_bits, fits_imm_budget, mem_bits, signal_interval, MsgType};
pub use error::{BadString, DecodeError, EncodeError, Expected};
pub use imm::{
    imm_payload, imm_type_code, to_imm, Imm, ImmLayout, ImmType, IoReq, IoRsp, HB_ACK_IMM,
    HB_MSG_IMM, RSP_MAX_ERRNO, RSP_MAX_MSG_ID,
};
pub use info::{InfoReq, InfoRsp, SgDesc};
pub use io::{
    read_placement, write_placement, ChunkOp, ChunkReq, RdmaRead, RdmaWrite, ReqPlacement, RkeyRsp,
    RDMA_READ_HDR_LEN, RDMA_READ_MAX_TRAILER_LEN, RDMA_WRITE_LEN,
};
