//! Reactors, pollers, timers and cross-core mailboxes.
