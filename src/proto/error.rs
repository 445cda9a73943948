//! Errors of the wire codecs.
//!
//! [`DecodeError`] says why bytes from a peer were refused: which message, which field,
//! the value found and what was expected (the kernel's equivalent is a rate-limited
//! `rtrs_err()` followed by closing the path or rejecting the connection).
//! [`EncodeError`] says why one of our own values cannot be put on the wire.
//! Both are `Copy` and allocation-free, so the IO path can return them cheaply.

use core::fmt;

/// The constraint a field failed, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Expected {
    /// Exactly this value.
    Eq(u64),
    /// Strictly below this limit.
    Below(u64),
    /// At most this value.
    AtMost(u64),
    /// At least this value.
    AtLeast(u64),
    /// Inside this inclusive range.
    Range(u64, u64),
    /// Not zero.
    NonZero,
    /// A power of two inside this inclusive range.
    PowerOfTwo(u64, u64),
    /// A multiple of this value.
    MultipleOf(u64),
    /// One of these values.
    OneOf(&'static [u64]),
    /// A rule stated in words.
    Rule(&'static str),
}

/// Shows a number in decimal, with its hexadecimal form when that helps.
#[derive(Clone, Copy)]
pub(crate) struct Num(pub(crate) i64);

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if (0..10).contains(&self.0) || self.0 < 0 {
            write!(f, "{}", self.0)
        } else {
            write!(f, "{} ({:#x})", self.0, self.0)
        }
    }
}

fn unum(v: u64) -> Num {
    Num(i64::try_from(v).unwrap_or(i64::MAX))
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Expected::Eq(v) => write!(f, "{}", unum(v)),
            Expected::Below(v) => write!(f, "< {}", unum(v)),
            Expected::AtMost(v) => write!(f, "<= {}", unum(v)),
            Expected::AtLeast(v) => write!(f, ">= {}", unum(v)),
            Expected::Range(a, b) => write!(f, "{}..={}", unum(a), unum(b)),
            Expected::NonZero => f.write_str("non-zero"),
            Expected::PowerOfTwo(a, b) => {
                write!(f, "a power of two in {}..={}", unum(a), unum(b))
            }
            Expected::MultipleOf(v) => write!(f, "a multiple of {}", unum(v)),
            Expected::OneOf(vs) => {
                f.write_str("one of ")?;
                for (i, v) in vs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                Ok(())
            }
            Expected::Rule(s) => f.write_str(s),
        }
    }
}

/// A name in a fixed-size string field that is malformed (received) or cannot be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{msg}.{field}: {problem} (byte {pos})")]
pub struct BadString {
    /// Message name, e.g. `"info_req"`.
    pub msg: &'static str,
    /// Field name, e.g. `"pathname"`.
    pub field: &'static str,
    /// What is wrong, e.g. `"contains '/'"`.
    pub problem: &'static str,
    /// Offset inside the field where the problem was found.
    pub pos: usize,
}

impl BadString {
    pub(crate) fn new(
        msg: &'static str,
        field: &'static str,
        problem: &'static str,
        pos: usize,
    ) -> Self {
        BadString {
            msg,
            field,
            problem,
            pos,
        }
    }
}

/// Why bytes received from a peer were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input is shorter than the message needs.
    #[error("{msg}: {have} bytes received, need at least {need}")]
    Truncated {
        /// Message name, e.g. `"conn_req"`.
        msg: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A field holds a value the protocol does not allow.
    #[error("{msg}.{field}: {}, expected {expected}", Num(*value))]
    BadField {
        /// Message name, e.g. `"conn_req"`.
        msg: &'static str,
        /// Field name, e.g. `"magic"`.
        field: &'static str,
        /// The value found (sign-extended where the field is signed).
        value: i64,
        /// What the field must satisfy.
        expected: Expected,
    },
    /// A field of one entry of a descriptor array is bad.
    #[error("{msg}.desc[{index}].{field}: {}, expected {expected}", Num(*value))]
    BadDesc {
        /// Message name, e.g. `"info_rsp"`.
        msg: &'static str,
        /// Index of the descriptor.
        index: u16,
        /// Field name, e.g. `"len"`.
        field: &'static str,
        /// The value found.
        value: i64,
        /// What the field must satisfy.
        expected: Expected,
    },
    /// A fixed-size string field is malformed.
    #[error(transparent)]
    BadString(#[from] BadString),
}

impl DecodeError {
    pub(crate) fn field(
        msg: &'static str,
        field: &'static str,
        value: impl Into<i64>,
        expected: Expected,
    ) -> Self {
        DecodeError::BadField {
            msg,
            field,
            value: value.into(),
            expected,
        }
    }

    /// The message the error is about, e.g. `"conn_rsp"`.
    pub fn msg(&self) -> &'static str {
        match *self {
            DecodeError::Truncated { msg, .. }
            | DecodeError::BadField { msg, .. }
            | DecodeError::BadDesc { msg, .. }
            | DecodeError::BadString(BadString { msg, .. }) => msg,
        }
    }

    /// The failing field, or `None` for a truncated input.
    pub fn field_name(&self) -> Option<&'static str> {
        match *self {
            DecodeError::Truncated { .. } => None,
            DecodeError::BadField { field, .. }
            | DecodeError::BadDesc { field, .. }
            | DecodeError::BadString(BadString { field, .. }) => Some(field),
        }
    }
}

/// Why one of our values cannot be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The output buffer is too small.
    #[error("{msg}: output buffer has {have} bytes, need {need}")]
    BufferTooSmall {
        /// Message name.
        msg: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A value does not fit the field or would be refused by the peer.
    #[error("{msg}.{field}: {} cannot be sent, expected {expected}", Num(*value))]
    BadValue {
        /// Message name.
        msg: &'static str,
        /// Field name.
        field: &'static str,
        /// The offending value.
        value: i64,
        /// What the field must satisfy.
        expected: Expected,
    },
    /// A string value cannot be sent.
    #[error(transparent)]
    BadString(#[from] BadString),
}

impl EncodeError {
    pub(crate) fn value(
        msg: &'static str,
        field: &'static str,
        value: impl Into<i64>,
        expected: Expected,
    ) -> Self {
        EncodeError::BadValue {
            msg,
            field,
            value: value.into(),
            expected,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_field_value_and_expectation() {
        let e = DecodeError::field("conn_req", "magic", 0x1234, Expected::Eq(0x1bbd));
        assert_eq!(
            e.to_string(),
            "conn_req.magic: 4660 (0x1234), expected 7101 (0x1bbd)"
        );
        let e = DecodeError::field("conn_rsp", "errno", -104, Expected::Eq(0));
        assert_eq!(e.to_string(), "conn_rsp.errno: -104, expected 0");
        let e = DecodeError::Truncated {
            msg: "info_req",
            need: 272,
            have: 10,
        };
        assert_eq!(
            e.to_string(),
            "info_req: 10 bytes received, need at least 272"
        );
        assert_eq!(e.msg(), "info_req");
        assert_eq!(e.field_name(), None);
        let e = DecodeError::BadDesc {
            msg: "info_rsp",
            index: 3,
            field: "len",
            value: 0,
            expected: Expected::NonZero,
        };
        assert_eq!(e.to_string(), "info_rsp.desc[3].len: 0, expected non-zero");
        let e = DecodeError::field("rnbd_msg_io", "op", 9, Expected::OneOf(&[0, 1, 2]));
        assert_eq!(e.to_string(), "rnbd_msg_io.op: 9, expected one of 0, 1, 2");
        let e = EncodeError::value("imm", "errno", 600, Expected::AtMost(511));
        assert_eq!(
            e.to_string(),
            "imm.errno: 600 (0x258) cannot be sent, expected <= 511 (0x1ff)"
        );
    }
}
