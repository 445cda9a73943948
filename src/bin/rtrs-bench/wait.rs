//! The main thread waiting for core 0 to map the device, saying at once why not when
//! waiting cannot help: the device refused, the session refused on every path, every
//! path closed for good, or (before any path came up) every path's attempts failing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rtrs_spdk::client::{ClientSession, PathState};
use rtrs_spdk::rnbd::client::DeviceInfo;
use rtrs_spdk::sync::lock;

use crate::run::Setup;
use crate::{failed, Failure, EXIT_INTERRUPTED};

/// Waits for core 0 to map the device: its limits, or why not (refused, unreachable,
/// no answer in time, interrupted).
pub fn device(
    setup: &Setup,
    session: &ClientSession,
    stop: &AtomicBool,
    targets: &str,
    connect_timeout: Duration,
) -> Result<DeviceInfo, Failure> {
    let limit = Instant::now() + connect_timeout + Duration::from_secs(5);
    // A path was connected at some point: the target is there, waiting may help.
    let mut seen_up = false;
    loop {
        if stop.load(Ordering::Acquire) {
            return Err((String::from("interrupted"), EXIT_INTERRUPTED));
        }
        if let Some(r) = lock(&setup.opened).take() {
            return r.map_err(|e| failed(format!("{e} (on {targets})")));
        }
        if let Some(r) = session.refusal() {
            // Every path was refused for good: the OPEN fails with this too, but the
            // paths may give up before core 0 has seen it.
            return Err(failed(format!(
                "open of device '{}': {r} (on {targets})",
                setup.device
            )));
        }
        seen_up |= session.paths_up() > 0;
        let paths = session.paths();
        let closed = paths
            .iter()
            .all(|(_, s)| matches!(s, PathState::Closed | PathState::Dead));
        // Every path failed its first attempts (paths retry meanwhile, but nothing says
        // the target is there): an unreachable target is reported at once.
        // A target that refused for good is there: its refusal is reported above, at
        // the control loop's next pass.
        let unreachable = !seen_up
            && session.paths_up() == 0
            && session.path_errors().len() == paths.len()
            && !session.refused_by_target();
        if closed || unreachable {
            // A path refused for good (authentication failed) says why.
            let failures: Vec<String> = paths
                .iter()
                .filter_map(|(a, _)| session.path_failure(*a))
                .collect();
            if !failures.is_empty() {
                return Err(failed(format!(
                    "cannot connect to {targets}: {}",
                    failures.join("; ")
                )));
            }
            let why: Vec<String> = session
                .path_errors()
                .iter()
                .map(|(p, e)| format!("{p}: {e}"))
                .collect();
            return Err(failed(format!(
                "cannot connect to {targets}: {} (is rtrs-target running there?)",
                if why.is_empty() {
                    "connection failed".to_string()
                } else {
                    why.join("; ")
                }
            )));
        }
        if Instant::now() > limit {
            return Err(failed(format!(
                "no answer from {targets} within {connect_timeout:?}: the device '{}' was not mapped",
                setup.device
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
