//! What the admin does beyond the kernel's client (see the [`admin`](super) module doc):
//! re-opens on request ([`RnbdAdmin::remap`]), devices the server closed (reported by the
//! queues, decided here after the link events), and the loss timeout.

use super::{
    Admin, ClientEvent, DevHandle, DevState, DeviceError, RnbdAdmin, RnbdQueue, SessionHandle,
};

impl RnbdAdmin {
    /// Gives the devices up once the session has had no connected path for `timeout`
    /// (`None`: never, the default): each becomes [`DevState::Lost`], its waiting and
    /// later IO fails at once, and [`ClientEvent::Lost`] tells the owner (who unmaps
    /// it). Takes effect at the next [`poll`](Self::poll), counting from when the last
    /// path went, also when that was before this call.
    pub fn set_loss_timeout(&mut self, timeout: Option<std::time::Duration>) {
        self.loss_timeout = timeout.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// The loss timeout in force.
    pub fn loss_timeout(&self) -> Option<std::time::Duration> {
        self.loss_timeout.map(std::time::Duration::from_nanos)
    }

    /// Sends OPEN again for `dev` (the kernel's `remap_device`): a mapped device learns
    /// its size and geometry as the server has them now, one the server closed is mapped
    /// again if the server's host list and access rules allow it.
    /// [`ClientEvent::Remapped`] or [`ClientEvent::OpenFailed`] tells the outcome; a
    /// failure leaves the device as it was.
    ///
    /// # Errors
    /// [`DeviceError::NotMapped`] for a device neither mapped nor closed by the server
    /// (one whose session has no path is re-opened by the reconnect),
    /// [`DeviceError::Opening`] while an OPEN of it is out.
    pub fn remap<S: SessionHandle>(
        &mut self,
        q: &mut RnbdQueue<S>,
        now: u64,
        dev: DevHandle,
    ) -> Result<(), DeviceError> {
        let d = self
            .devices
            .get_mut(dev.0)
            .filter(|d| !d.gone)
            .ok_or_else(|| DeviceError::NotMapped {
                name: String::new(),
                state: DevState::Unmapped,
            })?;
        if d.opening {
            return Err(DeviceError::Opening {
                name: d.dev.name().to_string(),
            });
        }
        if !matches!(d.dev.state(), DevState::Mapped | DevState::ServerClosed) {
            return Err(DeviceError::NotMapped {
                name: d.dev.name().to_string(),
                state: d.dev.state(),
            });
        }
        d.opening = true;
        d.remapping = true;
        self.queued.push_back(Admin::Open(dev.0));
        self.pump(q, now);
        Ok(())
    }

    /// Devices the queues saw answered −ENOTCONN while mapped, at the table version
    /// still published: the server closed them (see [`table`](super::table)).
    pub(super) fn take_closed_reports(&mut self) {
        let version = self.table.version();
        let mut changed = false;
        for (dev, v) in self.table.take_closed() {
            let Some(d) = self.devices.get_mut(dev.index()) else {
                continue;
            };
            if v != version || d.gone || d.dev.state() != DevState::Mapped {
                continue;
            }
            d.dev.server_closed();
            tracing::warn!(
                "rnbd: the server closed device '{}' (its operator's forced close): IO \
                 fails until it is re-opened",
                d.dev.name()
            );
            self.events.push_back(ClientEvent::ServerClosed { dev });
            changed = true;
        }
        if changed {
            self.publish();
        }
    }

    /// Gives every device up once the session has had no path for the loss timeout.
    pub(super) fn check_loss(&mut self, now: u64) {
        if self.link_down && self.down_since.is_none() {
            self.down_since = Some(now);
        }
        let (Some(timeout), Some(since)) = (self.loss_timeout, self.down_since) else {
            return;
        };
        if now.saturating_sub(since) < timeout {
            return;
        }
        let mut lost = Vec::new();
        for (i, d) in self.devices.iter_mut().enumerate() {
            if d.gone || matches!(d.dev.state(), DevState::Lost | DevState::Unmapped) {
                continue;
            }
            d.dev.lose();
            lost.push(i);
        }
        if lost.is_empty() {
            return;
        }
        tracing::warn!(
            "rnbd: no path for {} s (the loss timeout): {} device(s) given up, their IO fails",
            timeout / 1_000_000_000,
            lost.len()
        );
        self.publish();
        for i in lost {
            self.events
                .push_back(ClientEvent::Lost { dev: DevHandle(i) });
        }
    }
}
