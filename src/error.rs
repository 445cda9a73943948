//! The crate's error type: every layer's own error, so an application can use one
//! `Result` across set-up calls. Each layer keeps its precise type (which field of which
//! message, which post of which chain, which system call); this only gathers them.

use crate::engine::{CpuMaskError, EngineError};
use crate::fabric::{FabricError, PostError};
use crate::proto::{DecodeError, EncodeError};
use crate::rnbd::backend::{OpenError, SpecError};

/// Any error of this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A peer's message failed validation.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A value cannot be put on the wire.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// Fabric set-up: registration, listen, connect, accept.
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// A work request was refused.
    #[error(transparent)]
    Post(#[from] PostError),
    /// Reactor threads.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A bad core mask.
    #[error(transparent)]
    CpuMask(#[from] CpuMaskError),
    /// A block backend could not be opened.
    #[error(transparent)]
    BackendOpen(#[from] OpenError),
    /// A bad export specification.
    #[error(transparent)]
    ExportSpec(#[from] SpecError),
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_errors_convert_and_keep_their_message() {
        let e: Error = crate::engine::CpuMask::parse("0xZ").unwrap_err().into();
        assert!(matches!(e, Error::CpuMask(_)));
        assert!(e.to_string().contains('Z'), "{e}");
        let e: Error = crate::fabric::PrivateData::new(&[0; 60])
            .unwrap_err()
            .into();
        assert!(e.to_string().contains("60 bytes"), "{e}");
    }
}
