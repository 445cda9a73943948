//! The heartbeat as pure logic: the kernel's `hb_work` / `rtrs_start_hb` /
//! `rtrs_stop_hb` and the `hb_missed_cnt` / `hb_cur_latency` fields of `struct
//! rtrs_path` (docs/PROTOCOL.md §5). The caller arms a periodic timer of
//! [`Heartbeat::interval_ns`] on the path's home core, calls [`Heartbeat::on_tick`] from it
//! and acts on the answer (post HB_MSG on cid 0, or declare the path dead); it calls
//! [`Heartbeat::on_traffic`] for every receive completion on any connection of the path
//! and [`Heartbeat::on_ack`] for an HB_ACK.

use std::time::Duration;

use crate::proto::constants::{HB_INTERVAL_MS, HB_MISSED_MAX};

/// Heartbeat parameters. Defaults are the kernel's numbers: every 5 s, 5 missed.
///
/// The kernel declares a path dead on the tick that finds *more than* `missed_max` missed,
/// which is up to `(missed_max + 2) × interval` after traffic stops (35 s by default).
/// Here the path is dead on the tick that finds `missed_max - 1` ticks missed after the
/// probe (at least one), so a silent path is declared dead within
/// `interval × missed_max` of going silent (25 s by default). The wire is unchanged: one
/// HB_MSG per silence, answered by HB_ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HbConfig {
    /// Time between ticks.
    pub interval: Duration,
    /// A path silent for this many intervals is dead (see the type's doc).
    pub missed_max: u32,
}

impl Default for HbConfig {
    fn default() -> Self {
        HbConfig {
            interval: Duration::from_millis(HB_INTERVAL_MS),
            missed_max: HB_MISSED_MAX,
        }
    }
}

impl HbConfig {
    /// The interval in nanoseconds (at least 1).
    pub fn interval_ns(&self) -> u64 {
        u64::try_from(self.interval.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// What a tick asks the caller to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HbAction {
    /// Nothing (a heartbeat is already outstanding in this silence).
    Nothing,
    /// Post an HB_MSG (`RDMA_WRITE_WITH_IMM` 0x80000000, no data) on cid 0.
    SendHb,
    /// Too many ticks without traffic: the path is dead (client: error recovery;
    /// server: close the path).
    Dead,
}

/// The heartbeat state of one path.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    interval_ns: u64,
    missed_max: u32,
    missed: u32,
    last_sent: Option<u64>,
    cur_latency: u64,
}

impl Heartbeat {
    /// A stopped-state heartbeat (missed count 0, no latency yet).
    pub fn new(interval_ns: u64, missed_max: u32) -> Heartbeat {
        Heartbeat {
            interval_ns: interval_ns.max(1),
            missed_max,
            missed: 0,
            last_sent: None,
            cur_latency: 0,
        }
    }

    /// From a [`HbConfig`].
    pub fn from_config(cfg: &HbConfig) -> Heartbeat {
        Heartbeat::new(cfg.interval_ns(), cfg.missed_max)
    }

    /// Period of the caller's timer.
    pub fn interval_ns(&self) -> u64 {
        self.interval_ns
    }

    /// The timer fired at `now`. With no tick missed, count one and send a heartbeat (the
    /// probe); with some missed, count one more, unless the probe has already gone
    /// unanswered for `missed_max - 1` ticks (at least one): then the path is dead. A
    /// healthy idle path answers every probe within one interval, so it never gets there.
    pub fn on_tick(&mut self, now: u64) -> HbAction {
        if self.missed >= self.missed_max.saturating_sub(1).max(1) {
            return HbAction::Dead;
        }
        let was = self.missed;
        self.missed += 1;
        if was != 0 {
            HbAction::Nothing
        } else {
            self.last_sent = Some(now);
            HbAction::SendHb
        }
    }

    /// Any receive on the path: the peer is alive.
    pub fn on_traffic(&mut self) {
        self.missed = 0;
    }

    /// An HB_ACK arrived at `now`: resets the missed count and returns the round-trip
    /// time of the last heartbeat sent, which becomes [`Heartbeat::cur_latency`].
    pub fn on_ack(&mut self, now: u64) -> Option<u64> {
        self.missed = 0;
        let sent = self.last_sent?;
        let lat = now.saturating_sub(sent);
        self.cur_latency = lat;
        Some(lat)
    }

    /// Ticks since traffic was last seen.
    pub fn missed(&self) -> u32 {
        self.missed
    }

    /// Latest heartbeat round-trip time in ns (0 until the first ack).
    pub fn cur_latency(&self) -> u64 {
        self.cur_latency
    }

    /// Back to the initial counters (`rtrs_stop_hb`); the latency is kept.
    pub fn reset(&mut self) {
        self.missed = 0;
        self.last_sent = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_kernels() {
        let c = HbConfig::default();
        assert_eq!(c.interval, Duration::from_secs(5));
        assert_eq!(c.missed_max, 5);
        assert_eq!(Heartbeat::from_config(&c).interval_ns(), 5_000_000_000);
    }

    #[test]
    fn silence_is_dead_within_missed_max_intervals_with_one_hb_sent() {
        // Traffic last seen just after tick 0: the probe goes at tick 1, death at tick 5,
        // so no more than 5 intervals of silence.
        let mut hb = Heartbeat::new(10, 5);
        let acts: Vec<_> = (1..=5).map(|t| hb.on_tick(t * 10)).collect();
        assert_eq!(acts[0], HbAction::SendHb);
        assert!(
            acts[1..4].iter().all(|&a| a == HbAction::Nothing),
            "{acts:?}"
        );
        assert_eq!(acts[4], HbAction::Dead);
        assert_eq!(hb.on_tick(60), HbAction::Dead);
    }

    #[test]
    fn a_healthy_idle_path_never_dies() {
        // Nothing but heartbeats: every probe is answered within its interval.
        let mut hb = Heartbeat::new(10, 2);
        for t in 1..100 {
            assert_eq!(hb.on_tick(t * 10), HbAction::SendHb, "tick {t}");
            assert_eq!(hb.on_ack(t * 10 + 3), Some(3));
        }
    }

    #[test]
    fn traffic_resets_and_next_tick_sends_again() {
        let mut hb = Heartbeat::new(10, 5);
        assert_eq!(hb.on_tick(10), HbAction::SendHb);
        assert_eq!(hb.on_tick(20), HbAction::Nothing);
        hb.on_traffic();
        assert_eq!(hb.missed(), 0);
        assert_eq!(hb.on_tick(30), HbAction::SendHb);
        for t in 4..=6 {
            assert_eq!(hb.on_tick(t * 10), HbAction::Nothing);
        }
        hb.on_traffic();
        assert_eq!(hb.on_tick(90), HbAction::SendHb);
    }

    #[test]
    fn ack_gives_latency_of_last_sent() {
        let mut hb = Heartbeat::new(10, 5);
        assert_eq!(hb.on_ack(5), None);
        assert_eq!(hb.cur_latency(), 0);
        assert_eq!(hb.on_tick(100), HbAction::SendHb);
        assert_eq!(hb.on_ack(130), Some(30));
        assert_eq!(hb.cur_latency(), 30);
        assert_eq!(hb.missed(), 0);
        hb.reset();
        assert_eq!(hb.on_ack(200), None);
        assert_eq!(hb.cur_latency(), 30);
    }

    #[test]
    fn small_missed_max_still_probes_once() {
        let mut hb = Heartbeat::new(1, 0);
        assert_eq!(hb.on_tick(1), HbAction::SendHb);
        assert_eq!(hb.on_tick(2), HbAction::Dead);
        let mut hb = Heartbeat::new(1, 2);
        assert_eq!(hb.on_tick(1), HbAction::SendHb);
        assert_eq!(hb.on_tick(2), HbAction::Dead);
    }
}
