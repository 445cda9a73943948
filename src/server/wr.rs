//! Work request ids of the server's connections: what a completion belongs to. The
//! kind sits in the top byte; a request's LOCAL_INV also carries the request's slot in
//! the op table and 24 bits of the slot's generation, so a late completion for a slot
//! reused since is recognised (docs/ARCHITECTURE.md, "The server's core poller").

/// What a work request was posted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WrId {
    /// A receive for a request's WRITE_WITH_IMM (or a heartbeat imm).
    Recv,
    /// The receive of a path's INFO_REQ (cid 0).
    InfoReq,
    /// A request's LOCAL_INV of its chunk key: slot `op`, generation `gen24`.
    Inv { op: u32, gen24: u32 },
    /// The signaled SEND of INFO_RSP.
    InfoRsp,
    /// A response chain (or the REG_MRs of INFO_RSP): unsignaled.
    Rsp,
    /// A heartbeat or its ack.
    Hb,
    /// An id no server work request carries.
    Unknown,
}

const SHIFT: u32 = 56;
const RECV: u64 = 1;
const INFO_REQ: u64 = 2;
const INV: u64 = 3;
const INFO_RSP: u64 = 4;
const RSP: u64 = 5;
const HB: u64 = 6;
const GEN_MASK: u32 = 0xff_ffff;

impl WrId {
    /// The 64-bit id to post with.
    pub(crate) const fn encode(self) -> u64 {
        match self {
            WrId::Recv => RECV << SHIFT,
            WrId::InfoReq => INFO_REQ << SHIFT,
            WrId::Inv { op, gen24 } => INV << SHIFT | ((gen24 & GEN_MASK) as u64) << 32 | op as u64,
            WrId::InfoRsp => INFO_RSP << SHIFT,
            WrId::Rsp => RSP << SHIFT,
            WrId::Hb => HB << SHIFT,
            WrId::Unknown => 0,
        }
    }

    /// The work request an id of a completion was posted as.
    pub(crate) const fn decode(id: u64) -> WrId {
        match id >> SHIFT {
            RECV => WrId::Recv,
            INFO_REQ => WrId::InfoReq,
            INV => WrId::Inv {
                op: id as u32,
                gen24: (id >> 32) as u32 & GEN_MASK,
            },
            INFO_RSP => WrId::InfoRsp,
            RSP => WrId::Rsp,
            HB => WrId::Hb,
            _ => WrId::Unknown,
        }
    }

    /// The LOCAL_INV id of op table slot `op` in generation `gen` (its low 24 bits).
    pub(crate) const fn inv(op: u32, gen: u32) -> WrId {
        WrId::Inv {
            op,
            gen24: gen & GEN_MASK,
        }
    }

    /// Whether the generation `gen` of a slot is the one this LOCAL_INV was posted in.
    pub(crate) const fn same_gen(gen24: u32, gen: u32) -> bool {
        gen & GEN_MASK == gen24
    }

    /// The top-byte kind, for logs.
    pub(crate) const fn kind(id: u64) -> u64 {
        id >> SHIFT
    }
}

#[cfg(test)]
mod tests {
    use super::WrId;

    #[test]
    fn ids_round_trip() {
        for w in [
            WrId::Recv,
            WrId::InfoReq,
            WrId::Inv {
                op: 7,
                gen24: 0xab_cdef,
            },
            WrId::InfoRsp,
            WrId::Rsp,
            WrId::Hb,
        ] {
            assert_eq!(WrId::decode(w.encode()), w);
        }
        // The kinds keep the values they had on the wire of the fabric's ids.
        assert_eq!(WrId::Recv.encode(), 1 << 56);
        assert_eq!(WrId::Hb.encode(), 6 << 56);
        assert_eq!(
            WrId::inv(3, 0x1ff_ffff).encode(),
            3 << 56 | 0xff_ffff << 32 | 3
        );
        assert!(WrId::same_gen(0xff_ffff, 0x1ff_ffff));
        assert!(!WrId::same_gen(0, 1));
        assert_eq!(WrId::decode(0), WrId::Unknown);
        assert_eq!(WrId::decode(9 << 56), WrId::Unknown);
    }
}
