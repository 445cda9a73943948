//! Connection-manager private data: `rtrs_msg_conn_req` (REQ, client → server) and
//! `rtrs_msg_conn_rsp` (REP on accept, REJ consumer data on reject), 56 bytes each.
//!
//! The kernel builds them in `rtrs_rdma_route_resolved` / `rtrs_rdma_do_accept` /
//! `rtrs_rdma_do_reject` and checks them in `rtrs_rdma_connect` (server) and
//! `rtrs_rdma_conn_established` / `rtrs_rdma_conn_rejected` (client).
//! See docs/PROTOCOL.md §2.2, §2.3, §3.2, §3.3, §9.1 and §9.2.

use super::constants::{
    ceil_log2, chunk_bits, signal_interval, CM_PRIVATE_DATA_LEN, IMM_PAYLOAD_BITS, MAGIC,
    MAX_CID_NUM, MSG_NEW_RKEY_F, VERSION, VERSION_MAJOR,
};
use super::error::{DecodeError, EncodeError, Expected};
use super::imm::ImmLayout;
use super::io::RDMA_READ_MAX_TRAILER_LEN;
use super::wire::{get_u16, get_u32, head, head_mut, put_u16, put_u32};
use crate::Errno;

/// What a client assumes when a reject carries no usable errno (docs/PROTOCOL.md §9.2).
const NO_USABLE_ERRNO: Errno = Errno::ECONNRESET;

const _: () = assert!(ConnReq::LEN == CM_PRIVATE_DATA_LEN);
const _: () = assert!(ConnRsp::LEN == CM_PRIVATE_DATA_LEN);
// conn_req field offsets, as laid out by the kernel structure.
const _: () = assert!(12 + 16 + 16 + 1 + 11 == ConnReq::LEN);
const _: () = assert!(20 + 36 == ConnRsp::LEN);

fn check_magic_version(b: &[u8], off: usize, msg: &'static str) -> Result<(), DecodeError> {
    let magic = get_u16(b, off);
    if magic != MAGIC {
        return Err(DecodeError::field(
            msg,
            "magic",
            magic,
            Expected::Eq(MAGIC.into()),
        ));
    }
    let version = get_u16(b, off + 2);
    if (version >> 8) as u8 != VERSION_MAJOR {
        return Err(DecodeError::field(
            msg,
            "version",
            version,
            Expected::Rule("major version 2 (0x02xx)"),
        ));
    }
    Ok(())
}

/// `rtrs_msg_conn_req`: the client's REQ private data for connection `cid` of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnReq {
    /// Connection index, 0 = service connection.
    pub cid: u16,
    /// Connections in this path (the same in every REQ of the path).
    pub cid_num: u16,
    /// Per-path (re)connect counter; the server stores it and never checks it.
    pub recon_cnt: u16,
    /// Per-path UUID (`sess_uuid`).
    pub sess_uuid: [u8; 16],
    /// Per-session UUID (`paths_uuid`).
    pub paths_uuid: [u8; 16],
    /// May create a new server session for `paths_uuid`.
    pub first_conn: bool,
}

impl ConnReq {
    /// Size on the wire.
    pub const LEN: usize = 56;

    /// A REQ for connection `cid` of `cid_num`.
    pub const fn new(
        cid: u16,
        cid_num: u16,
        recon_cnt: u16,
        sess_uuid: [u8; 16],
        paths_uuid: [u8; 16],
        first_conn: bool,
    ) -> ConnReq {
        ConnReq {
            cid,
            cid_num,
            recon_cnt,
            sess_uuid,
            paths_uuid,
            first_conn,
        }
    }

    fn check(cid: u16, cid_num: u16) -> Result<(), (&'static str, i64, Expected)> {
        if cid_num == 0 || cid_num > MAX_CID_NUM {
            return Err((
                "cid_num",
                cid_num.into(),
                Expected::Range(1, MAX_CID_NUM.into()),
            ));
        }
        if cid >= cid_num {
            return Err(("cid", cid.into(), Expected::Below(cid_num.into())));
        }
        Ok(())
    }

    /// Writes the 56 bytes into `out` (bytes 0 and 1 are zero, as AF_IB requires).
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`], or [`EncodeError::BadValue`] for a `cid_num`
    /// outside 1..=4096 or `cid >= cid_num` (the server would reject it).
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        Self::check(self.cid, self.cid_num)
            .map_err(|(f, v, e)| EncodeError::value("conn_req", f, v, e))?;
        let b = head_mut::<{ Self::LEN }>(out, "conn_req")?;
        *b = [0; Self::LEN];
        put_u16(b, 2, MAGIC);
        put_u16(b, 4, VERSION);
        put_u16(b, 6, self.cid);
        put_u16(b, 8, self.cid_num);
        put_u16(b, 10, self.recon_cnt);
        b[12..28].copy_from_slice(&self.sess_uuid);
        b[28..44].copy_from_slice(&self.paths_uuid);
        b[44] = u8::from(self.first_conn);
        Ok(Self::LEN)
    }

    /// The 56 bytes as an array.
    ///
    /// # Errors
    /// As [`ConnReq::encode`].
    pub fn to_bytes(&self) -> Result<[u8; Self::LEN], EncodeError> {
        let mut b = [0; Self::LEN];
        self.encode(&mut b)?;
        Ok(b)
    }

    /// Decodes REQ private data (at least 56 bytes). Checks magic, major version,
    /// `1 <= cid_num <= 4096` and `cid < cid_num`; ignores bytes 0..2, the minor
    /// version, bits 1..7 of byte 44 and the reserved bytes.
    ///
    /// # Errors
    /// [`DecodeError`] naming the field; the server answers any of them with a reject
    /// carrying −ECONNRESET.
    pub fn decode(buf: &[u8]) -> Result<ConnReq, DecodeError> {
        let b = head::<{ Self::LEN }>(buf, "conn_req")?;
        check_magic_version(b, 2, "conn_req")?;
        let cid = get_u16(b, 6);
        let cid_num = get_u16(b, 8);
        Self::check(cid, cid_num).map_err(|(f, v, e)| DecodeError::field("conn_req", f, v, e))?;
        let mut sess_uuid = [0; 16];
        sess_uuid.copy_from_slice(&b[12..28]);
        let mut paths_uuid = [0; 16];
        paths_uuid.copy_from_slice(&b[28..44]);
        Ok(ConnReq {
            cid,
            cid_num,
            recon_cnt: get_u16(b, 10),
            sess_uuid,
            paths_uuid,
            first_conn: b[44] & 1 != 0,
        })
    }
}

/// The accept form of `rtrs_msg_conn_rsp` (errno 0): what the server offers the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnAccept {
    /// Session queue depth (number of chunks), 1..=65535.
    pub queue_depth: u16,
    /// `max_chunk_size - MAX_HDR_SIZE`.
    pub max_io_size: u32,
    /// `MAX_HDR_SIZE` (the server's page size).
    pub max_hdr_size: u32,
    /// `RTRS_MSG_NEW_RKEY_F`: every response carries a new chunk rkey.
    pub new_rkey: bool,
}

impl ConnAccept {
    /// The chunk size the client uses: `max_io_size + max_hdr_size`.
    pub const fn chunk_size(&self) -> u64 {
        self.max_io_size as u64 + self.max_hdr_size as u64
    }

    /// The IO_REQ imm layout for this session (queue depth, chunk size).
    ///
    /// # Errors
    /// [`EncodeError::BadValue`] if the values break the imm budget (never for an
    /// accept that came out of [`ConnRsp::decode_accept`]).
    pub fn imm_layout(&self) -> Result<ImmLayout, EncodeError> {
        let chunk = u32::try_from(self.chunk_size()).map_err(|_| {
            EncodeError::value(
                "conn_rsp",
                "max_io_size",
                self.max_io_size,
                Expected::Rule("max_io_size + max_hdr_size < 2^32"),
            )
        })?;
        ImmLayout::new(self.queue_depth, chunk)
    }

    /// Every n-th send work request is signaled: `min(queue_depth, 512)`.
    pub const fn signal_interval(&self) -> u32 {
        signal_interval(self.queue_depth)
    }

    /// Checks everything §9.2 asks of an accept; `min_usr_hdr` is the largest user
    /// header the caller will send (an RTRS READ trailer with one descriptor must fit
    /// beside it in `max_hdr_size`).
    fn check(&self, min_usr_hdr: u32) -> Result<(), (&'static str, i64, Expected)> {
        if self.queue_depth == 0 {
            return Err(("queue_depth", 0, Expected::NonZero));
        }
        if self.max_io_size == 0 {
            return Err(("max_io_size", 0, Expected::NonZero));
        }
        let need_hdr = u64::from(min_usr_hdr) + RDMA_READ_MAX_TRAILER_LEN as u64;
        if u64::from(self.max_hdr_size) < need_hdr {
            return Err((
                "max_hdr_size",
                self.max_hdr_size.into(),
                Expected::AtLeast(need_hdr),
            ));
        }
        let chunk = self.chunk_size();
        if chunk > u64::from(u32::MAX)
            || chunk_bits(self.queue_depth) + ceil_log2(chunk) > IMM_PAYLOAD_BITS
        {
            return Err((
                "max_io_size",
                self.max_io_size.into(),
                Expected::Rule(
                    "ceil_log2(queue_depth) + ceil_log2(max_io_size + max_hdr_size) <= 28",
                ),
            ));
        }
        Ok(())
    }
}

/// A reject: the negative errno the server reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnReject {
    /// Negative errno, e.g. −104 (ECONNRESET), as on the wire.
    pub errno: i32,
}

impl ConnReject {
    /// The errno the server reports; `None` for a value no errno has (0, positive).
    pub const fn reason(self) -> Option<Errno> {
        Errno::from_neg(self.errno)
    }
}

/// `rtrs_msg_conn_rsp`: accept or reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnRsp {
    /// REP private data.
    Accept(ConnAccept),
    /// REJ consumer data.
    Reject(ConnReject),
}

impl ConnRsp {
    /// Size on the wire.
    pub const LEN: usize = 56;

    /// An accept offering `queue_depth` chunks of `max_io_size + max_hdr_size` bytes.
    pub const fn accept(
        queue_depth: u16,
        max_io_size: u32,
        max_hdr_size: u32,
        new_rkey: bool,
    ) -> ConnRsp {
        ConnRsp::Accept(ConnAccept {
            queue_depth,
            max_io_size,
            max_hdr_size,
            new_rkey,
        })
    }

    /// A reject with `errno`, given with either sign (it is sent negative, as int16).
    pub const fn reject(errno: i32) -> ConnRsp {
        ConnRsp::Reject(ConnReject {
            errno: if errno > 0 { -errno } else { errno },
        })
    }

    /// A reject reporting `errno`.
    pub const fn reject_with(errno: Errno) -> ConnRsp {
        ConnRsp::reject(errno.neg())
    }

    /// Writes the 56 bytes into `out`.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`]; [`EncodeError::BadValue`] for an accept the
    /// client would refuse (see [`ConnRsp::decode_accept`] with no user header) or a
    /// reject errno of 0 or beyond int16.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        let b = head_mut::<{ Self::LEN }>(out, "conn_rsp")?;
        let mut a = [0u8; Self::LEN];
        put_u16(&mut a, 0, MAGIC);
        put_u16(&mut a, 2, VERSION);
        match self {
            ConnRsp::Accept(acc) => {
                acc.check(0)
                    .map_err(|(f, v, e)| EncodeError::value("conn_rsp", f, v, e))?;
                put_u16(&mut a, 6, acc.queue_depth);
                put_u32(&mut a, 8, acc.max_io_size);
                put_u32(&mut a, 12, acc.max_hdr_size);
                put_u32(&mut a, 16, if acc.new_rkey { MSG_NEW_RKEY_F } else { 0 });
            }
            ConnRsp::Reject(rej) => {
                let Some(e) = i16::try_from(rej.errno).ok().filter(|&e| e < 0) else {
                    return Err(EncodeError::value(
                        "conn_rsp",
                        "errno",
                        rej.errno,
                        Expected::Rule("a negative errno in -32768..=-1"),
                    ));
                };
                put_u16(&mut a, 4, e as u16);
            }
        }
        *b = a;
        Ok(Self::LEN)
    }

    /// The 56 bytes as an array.
    ///
    /// # Errors
    /// As [`ConnRsp::encode`].
    pub fn to_bytes(&self) -> Result<[u8; Self::LEN], EncodeError> {
        let mut b = [0; Self::LEN];
        self.encode(&mut b)?;
        Ok(b)
    }

    /// Decodes either form: errno 0 is an accept (checked as by
    /// [`ConnRsp::decode_accept`] with no user header), a negative errno a reject.
    ///
    /// # Errors
    /// [`DecodeError`] naming the field (a positive errno is `conn_rsp.errno`).
    pub fn decode(buf: &[u8]) -> Result<ConnRsp, DecodeError> {
        let b = head::<{ Self::LEN }>(buf, "conn_rsp")?;
        check_magic_version(b, 0, "conn_rsp")?;
        let errno = get_u16(b, 4) as i16;
        if errno == 0 {
            Self::decode_accept(buf, 0).map(ConnRsp::Accept)
        } else if errno < 0 {
            Ok(ConnRsp::Reject(ConnReject {
                errno: errno.into(),
            }))
        } else {
            Err(DecodeError::field(
                "conn_rsp",
                "errno",
                errno,
                Expected::Rule("0 (accept) or a negative errno (reject)"),
            ))
        }
    }

    /// Decodes REP private data, which must be an accept. Besides the kernel's checks
    /// (length, magic, major version, errno 0) it requires `queue_depth >= 1`,
    /// `max_io_size > 0`, room in `max_hdr_size` for `max_usr_hdr` bytes of user header
    /// plus an RTRS READ trailer with one descriptor, and the 28-bit imm budget.
    /// Unknown flag bits are ignored.
    ///
    /// # Errors
    /// [`DecodeError`] naming the field; the client fails the connection (−ECONNRESET).
    pub fn decode_accept(buf: &[u8], max_usr_hdr: u32) -> Result<ConnAccept, DecodeError> {
        let b = head::<{ Self::LEN }>(buf, "conn_rsp")?;
        check_magic_version(b, 0, "conn_rsp")?;
        let errno = get_u16(b, 4) as i16;
        if errno != 0 {
            return Err(DecodeError::field(
                "conn_rsp",
                "errno",
                errno,
                Expected::Eq(0),
            ));
        }
        let acc = ConnAccept {
            queue_depth: get_u16(b, 6),
            max_io_size: get_u32(b, 8),
            max_hdr_size: get_u32(b, 12),
            new_rkey: get_u32(b, 16) & MSG_NEW_RKEY_F != 0,
        };
        acc.check(max_usr_hdr)
            .map_err(|(f, v, e)| DecodeError::field("conn_rsp", f, v, e))?;
        Ok(acc)
    }

    /// The errno a client reports for a REJ with consumer data `buf`: the carried errno
    /// if the data is a well-formed reject (at least 56 bytes, magic, major version,
    /// errno < 0), otherwise ECONNRESET (docs/PROTOCOL.md §9.2).
    pub fn refusal(buf: &[u8]) -> Errno {
        match ConnRsp::decode(buf) {
            Ok(ConnRsp::Reject(r)) => r.reason().unwrap_or(NO_USABLE_ERRNO),
            _ => NO_USABLE_ERRNO,
        }
    }

    /// [`ConnRsp::refusal`] as the kernel's negative `int`.
    pub fn reject_errno(buf: &[u8]) -> i32 {
        ConnRsp::refusal(buf).neg()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req_bytes() -> [u8; 56] {
        ConnReq::new(1, 3, 7, [0xaa; 16], [0xbb; 16], true)
            .to_bytes()
            .unwrap()
    }

    #[test]
    fn conn_req_checks() {
        let good = req_bytes();
        assert!(ConnReq::decode(&good).is_ok());
        assert!(matches!(
            ConnReq::decode(&good[..55]),
            Err(DecodeError::Truncated {
                need: 56,
                have: 55,
                ..
            })
        ));
        let mut b = good;
        b[2] = 0x34;
        b[3] = 0x12;
        let e = ConnReq::decode(&b).unwrap_err();
        assert_eq!(
            e.to_string(),
            "conn_req.magic: 4660 (0x1234), expected 7101 (0x1bbd)"
        );
        let mut b = good;
        b[5] = 3;
        assert_eq!(
            ConnReq::decode(&b).unwrap_err().field_name(),
            Some("version")
        );
        let mut b = good;
        b[4] = 0x7f; // minor version is ignored
        assert!(ConnReq::decode(&b).is_ok());
        let mut b = good;
        b[6] = 3; // cid == cid_num
        assert_eq!(ConnReq::decode(&b).unwrap_err().field_name(), Some("cid"));
        let mut b = good;
        b[6] = 0;
        b[8] = 0; // cid_num 0
        assert_eq!(
            ConnReq::decode(&b).unwrap_err().field_name(),
            Some("cid_num")
        );
        let mut b = good;
        put_u16(&mut b, 8, 4097);
        assert_eq!(
            ConnReq::decode(&b).unwrap_err().field_name(),
            Some("cid_num")
        );
        let mut b = good;
        b[0] = 1;
        b[1] = 4;
        b[44] = 0xfe; // reserved bits set, first_conn clear
        b[50] = 9;
        let r = ConnReq::decode(&b).unwrap();
        assert!(!r.first_conn);
        assert!(ConnReq::new(4, 4, 0, [0; 16], [0; 16], false)
            .to_bytes()
            .is_err());
        assert!(ConnReq::new(0, 1, 0, [0; 16], [0; 16], false)
            .encode(&mut [0; 55])
            .is_err());
    }

    #[test]
    fn conn_rsp_accept_checks() {
        let good = ConnRsp::accept(512, 126976, 4096, true).to_bytes().unwrap();
        let acc = ConnRsp::decode_accept(&good, 32).unwrap();
        assert_eq!(acc.chunk_size(), 131072);
        assert_eq!(acc.signal_interval(), 512);
        let l = acc.imm_layout().unwrap();
        assert_eq!(
            (l.queue_depth(), l.chunk_size(), l.mem_bits()),
            (512, 131072, 19)
        );
        let huge = ConnAccept {
            max_io_size: u32::MAX,
            ..acc
        };
        assert!(huge.imm_layout().is_err());
        assert!(ConnRsp::decode_accept(&good, 4096).is_err());
        let mut b = good;
        put_u16(&mut b, 6, 0);
        assert_eq!(
            ConnRsp::decode_accept(&b, 0).unwrap_err().field_name(),
            Some("queue_depth")
        );
        let mut b = good;
        put_u32(&mut b, 8, 0);
        assert_eq!(
            ConnRsp::decode_accept(&b, 0).unwrap_err().field_name(),
            Some("max_io_size")
        );
        let mut b = good;
        put_u16(&mut b, 6, 4096); // 12 + 17 > 28
        assert!(ConnRsp::decode_accept(&b, 0).is_err());
        let mut b = good;
        put_u32(&mut b, 8, u32::MAX); // chunk size overflows 32 bits
        assert!(ConnRsp::decode_accept(&b, 0).is_err());
        let mut b = good;
        put_u32(&mut b, 16, 0xffff_fffd); // unknown flags ignored, NEW_RKEY clear
        assert!(!ConnRsp::decode_accept(&b, 0).unwrap().new_rkey);
        let mut b = good;
        put_u16(&mut b, 4, (-104i16) as u16);
        let e = ConnRsp::decode_accept(&b, 0).unwrap_err();
        assert_eq!(e.to_string(), "conn_rsp.errno: -104, expected 0");
        assert!(ConnRsp::accept(0, 1, 4096, false).to_bytes().is_err());
    }

    #[test]
    fn conn_rsp_reject_forms() {
        let b = ConnRsp::reject(104).to_bytes().unwrap();
        assert_eq!(ConnRsp::reject_errno(&b), -104);
        assert_eq!(ConnRsp::decode(&b), Ok(ConnRsp::reject(-104)));
        assert_eq!(ConnRsp::reject_errno(&b[..55]), -libc::ECONNRESET);
        let mut bad = b;
        bad[0] = 0;
        assert_eq!(ConnRsp::reject_errno(&bad), -libc::ECONNRESET);
        let mut pos = b;
        put_u16(&mut pos, 4, 5);
        assert_eq!(ConnRsp::reject_errno(&pos), -libc::ECONNRESET);
        assert!(ConnRsp::decode(&pos).is_err());
        assert_eq!(
            ConnRsp::reject_errno(&ConnRsp::reject(-6).to_bytes().unwrap()),
            -6
        );
        assert!(ConnRsp::reject(0).to_bytes().is_err());
        assert!(ConnRsp::reject(40000).to_bytes().is_err());
        // The same, typed.
        assert_eq!(
            ConnRsp::reject_with(Errno::ECONNRESET),
            ConnRsp::reject(-104)
        );
        assert_eq!(ConnRsp::refusal(&b), Errno::ECONNRESET);
        assert_eq!(ConnRsp::refusal(&pos), Errno::ECONNRESET);
        let enxio = ConnRsp::reject_with(Errno::ENXIO).to_bytes().unwrap();
        assert_eq!(ConnRsp::refusal(&enxio), Errno::ENXIO);
        assert_eq!(ConnReject { errno: -6 }.reason(), Some(Errno::ENXIO));
        assert_eq!(ConnReject { errno: 0 }.reason(), None);
    }
}
