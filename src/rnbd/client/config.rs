//! How the RNBD client carries write-zeroes ([`WriteZeroesMode`]), a per-device option
//! the kernel's `rnbd-clt` does not have, because it deals with servers of other kernel
//! versions. Each device is opened with its own mode
//! ([`RnbdAdmin::open`](super::RnbdAdmin::open)); the device keeps it.
//!
//! RNBD op 5 and byte 20 of OPEN_RSP meant WRITE_SAME (`max_write_same_sectors`) before
//! Linux 5.18, nothing from 5.18 to 6.7, and WRITE_ZEROES (`max_write_zeroes_sectors`)
//! from 6.8 on; the protocol version cannot tell them apart. A data-less op 5 is safe
//! only with a 6.8+ server or this project's (which reads op 5 without data as
//! WRITE_ZEROES): a pre-5.18 server runs it as a WRITE_SAME of an empty buffer, one
//! from 5.18 to 6.7 warns and runs it as a READ. So write-zeroes go out as zero-filled
//! WRITEs unless configured otherwise.

use std::fmt;
use std::str::FromStr;

/// How the client carries a write-zeroes request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WriteZeroesMode {
    /// RNBD op 5 without data, within the server's `max_write_zeroes_sectors` (0: the
    /// device has no write-zeroes). Only for servers known to be Linux 6.8+ or this
    /// project's.
    Native,
    /// WRITEs of zeros from one shared zero buffer, each at most the device's
    /// `max_io_size`: correct with every server version (the default).
    #[default]
    Emulate,
}

impl WriteZeroesMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteZeroesMode::Native => "native",
            WriteZeroesMode::Emulate => "emulate",
        }
    }
}

impl fmt::Display for WriteZeroesMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A write-zeroes mode that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad write-zeroes mode {0:?} (expected native or emulate)")]
pub struct WriteZeroesParseError(pub String);

impl FromStr for WriteZeroesMode {
    type Err = WriteZeroesParseError;

    fn from_str(s: &str) -> Result<WriteZeroesMode, WriteZeroesParseError> {
        match s {
            "native" => Ok(WriteZeroesMode::Native),
            "emulate" => Ok(WriteZeroesMode::Emulate),
            _ => Err(WriteZeroesParseError(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in [WriteZeroesMode::Native, WriteZeroesMode::Emulate] {
            assert_eq!(m.to_string().parse::<WriteZeroesMode>(), Ok(m));
        }
        assert_eq!(WriteZeroesMode::default(), WriteZeroesMode::Emulate);
        let e = "zero".parse::<WriteZeroesMode>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "bad write-zeroes mode \"zero\" (expected native or emulate)"
        );
    }
}
