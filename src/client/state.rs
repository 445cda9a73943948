//! The client path state machine: the kernel's `enum rtrs_clt_state` and
//! `rtrs_clt_change_state` (docs/PROTOCOL.md §6.1), as a pure type plus an atomic cell.
//!
//! A path's state is written only by its home core (the core driving its connection
//! manager, heartbeat and reconnect) and read by every core that picks a path for IO,
//! hence the atomic cell. Transitions not in the kernel's table are refused.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

/// State of one client path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PathState {
    /// Connections and the INFO exchange are being set up.
    Connecting = 0,
    /// Setting up failed; the connect sequence cleans up and schedules a reconnect.
    ConnectingErr = 1,
    /// Down; a reconnect is scheduled (or the path waits for a manual one).
    Reconnecting = 2,
    /// Every connection is up and IO may use the path.
    Connected = 3,
    /// Being torn down for good (disconnect, remove, no attempts left).
    Closing = 4,
    /// Torn down; only a manual reconnect or removal follows.
    Closed = 5,
    /// Removed from the session.
    Dead = 6,
}

impl PathState {
    const ALL: [PathState; 7] = [
        PathState::Connecting,
        PathState::ConnectingErr,
        PathState::Reconnecting,
        PathState::Connected,
        PathState::Closing,
        PathState::Closed,
        PathState::Dead,
    ];

    /// Whether the kernel allows `self -> to` (docs/PROTOCOL.md §6.1 table).
    pub const fn can_become(self, to: PathState) -> bool {
        use PathState::*;
        matches!(
            (self, to),
            (Reconnecting, Connecting)
                | (Connected | ConnectingErr | Closed, Reconnecting)
                | (Connecting, Connected)
                | (Connecting, ConnectingErr)
                | (
                    Connecting | ConnectingErr | Reconnecting | Connected,
                    Closing
                )
                | (Closing, Closed)
                | (Closed, Dead)
        )
    }

    /// The kernel's sysfs `state` text: `connected` or `disconnected`.
    pub const fn sysfs(self) -> &'static str {
        if matches!(self, PathState::Connected) {
            "connected"
        } else {
            "disconnected"
        }
    }

    /// Lower-case name, for logs and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            PathState::Connecting => "connecting",
            PathState::ConnectingErr => "connecting_err",
            PathState::Reconnecting => "reconnecting",
            PathState::Connected => "connected",
            PathState::Closing => "closing",
            PathState::Closed => "closed",
            PathState::Dead => "dead",
        }
    }

    fn from_u8(v: u8) -> PathState {
        Self::ALL[usize::from(v).min(Self::ALL.len() - 1)]
    }
}

impl fmt::Display for PathState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A refused transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("path state change {from} -> {to} is not allowed")]
pub struct StateError {
    pub from: PathState,
    pub to: PathState,
}

/// A path state shared between cores: written by the home core, read by all.
#[derive(Debug)]
pub struct PathStateCell(AtomicU8);

impl PathStateCell {
    pub fn new(state: PathState) -> PathStateCell {
        PathStateCell(AtomicU8::new(state as u8))
    }

    pub fn get(&self) -> PathState {
        PathState::from_u8(self.0.load(Ordering::Acquire))
    }

    /// Moves to `to` if the table allows it from the current state; returns the old state.
    ///
    /// # Errors
    /// [`StateError`] naming both states; the state is unchanged.
    pub fn change(&self, to: PathState) -> Result<PathState, StateError> {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let from = PathState::from_u8(cur);
            if !from.can_become(to) {
                return Err(StateError { from, to });
            }
            match self
                .0
                .compare_exchange(cur, to as u8, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(from),
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_machine_follows_the_kernel_table() {
        use PathState::*;
        let all = [
            Connecting,
            ConnectingErr,
            Reconnecting,
            Connected,
            Closing,
            Closed,
            Dead,
        ];
        let allowed = [
            (Reconnecting, Connecting),
            (Connected, Reconnecting),
            (ConnectingErr, Reconnecting),
            (Closed, Reconnecting),
            (Connecting, Connected),
            (Connecting, ConnectingErr),
            (Connecting, Closing),
            (ConnectingErr, Closing),
            (Reconnecting, Closing),
            (Connected, Closing),
            (Closing, Closed),
            (Closed, Dead),
        ];
        for from in all {
            for to in all {
                assert_eq!(
                    from.can_become(to),
                    allowed.contains(&(from, to)),
                    "{from} -> {to}"
                );
            }
        }
        let cell = PathStateCell::new(Connecting);
        assert_eq!(cell.change(Connected), Ok(Connecting));
        let err = cell.change(Connecting).unwrap_err();
        assert_eq!((err.from, err.to), (Connected, Connecting));
        assert!(err.to_string().contains("connected -> connecting"));
        assert_eq!(cell.get(), Connected, "a refused change leaves the state");
        assert_eq!(cell.change(Reconnecting), Ok(Connected));
        assert_eq!(cell.get(), Reconnecting);
        assert_eq!(Connected.sysfs(), "connected");
        assert_eq!(Reconnecting.sysfs(), "disconnected");
    }
}
