//! An open disk following its device (see the [`disk`](super) module doc): the re-open
//! after a reconnect and `bdev_rtrs_remap` bring the target's size now, handed to the
//! bdev layer on home's thread (`spdk_bdev_notify_blockcnt_change`); a device lost after
//! the session's loss timeout unregisters its bdev.

use std::sync::Arc;

use rtrs_spdk::rnbd::client::DeviceInfo;
use rtrs_spdk::spdk::sys;
use rtrs_spdk::sync::lock;

use super::{errno_str, Disk, OnRemap};

impl Disk {
    /// Waits for the answer of a remap the caller is about to ask the admin for.
    pub fn add_remap(&self, done: OnRemap) {
        lock(&self.remaps).push(done);
    }

    /// Whether a remap waits for its answer.
    pub fn remapping(&self) -> bool {
        !lock(&self.remaps).is_empty()
    }

    /// Answers the waiting remaps (on home's thread).
    pub(super) fn remap_done(&self, r: &Result<DeviceInfo, String>) {
        let waiting = std::mem::take(&mut *lock(&self.remaps));
        for f in waiting {
            f(r.clone());
        }
    }

    /// A re-open (after a reconnect: `remap` false; or a `bdev_rtrs_remap`) gave `info`:
    /// on home's thread, the bdev follows a new size (a shrink of an open bdev is
    /// refused by SPDK, -EBUSY: said, and the old size kept) and the waiting remaps are
    /// answered.
    pub fn reopened(self: &Arc<Self>, info: DeviceInfo, remap: bool) {
        let d = Arc::clone(self);
        let post = self.sess.home.thread().send(move || {
            let r = d.apply_info(info);
            if let Err(e) = &r {
                tracing::error!("rtrs bdev {}: {e}", d.name());
            }
            if remap {
                d.remap_done(&r.map(|()| info));
            }
        });
        if post.is_err() {
            tracing::error!(
                "rtrs bdev {}: could not post its re-open to home",
                self.name()
            );
        }
    }

    /// A remap failed (the target refused the OPEN, or it could not be sent).
    pub fn remap_failed(self: &Arc<Self>, why: String) {
        let d = Arc::clone(self);
        let post = self
            .sess
            .home
            .thread()
            .send(move || d.remap_done(&Err(why)));
        if post.is_err() {
            tracing::error!("rtrs bdev {}: could not post a remap's answer", self.name());
        }
    }

    /// Takes `info` as the device's and gives the bdev its new block count (home's
    /// thread).
    ///
    /// # Errors
    /// SPDK refused the new size (a shrink while the bdev is open).
    fn apply_info(&self, info: DeviceInfo) -> Result<(), String> {
        let old = lock(&self.info).replace(info);
        let bs = u64::from(info.logical_block_size);
        let blocks = info.size / bs;
        let Some(bdev) = *lock(&self.bdev) else {
            return Ok(());
        };
        // SAFETY: the registered bdev (see BdevPtr), read on home's thread.
        let now = unsafe { (*bdev.0).blockcnt };
        if now == blocks {
            return Ok(());
        }
        // SAFETY: as above; SPDK takes the bdev's lock and tells its descriptors.
        let rc = unsafe { sys::spdk_bdev_notify_blockcnt_change(bdev.0, blocks) };
        if rc != 0 {
            // The device keeps the size the bdev has: IO beyond the target's end fails
            // there, with the target's error.
            if let Some(o) = old {
                *lock(&self.info) = Some(DeviceInfo {
                    size: o.size,
                    ..info
                });
            }
            return Err(format!(
                "the target's device '{}' is now {blocks} blocks, the bdev {now}: SPDK refuses \
                 to shrink a bdev that is open ({}); IO beyond the new end fails; close the \
                 bdev's users (or delete and create it) to take the new size",
                self.params.device,
                errno_str(rc)
            ));
        }
        tracing::info!(
            "rtrs bdev {}: size {now} -> {blocks} blocks of {bs} B (the target's device '{}')",
            self.name(),
            self.params.device
        );
        Ok(())
    }

    /// The session had no path for its loss timeout: the device's IO fails, and the
    /// bdev is unregistered (on home's thread) so the layers above can act.
    pub fn lost(self: &Arc<Self>) {
        let d = Arc::clone(self);
        let post = self.sess.home.thread().send(move || {
            if !d.is_open() {
                return;
            }
            tracing::warn!(
                "rtrs bdev {}: no path to the target for loss_timeout_sec ({} s): its IO \
                 fails and the bdev is unregistered",
                d.name(),
                d.sess.live().loss_timeout_sec
            );
            match d.unregister.get() {
                Some(unregister) => unregister(&d),
                None => tracing::error!(
                    "rtrs bdev {}: lost before its bdev was registered",
                    d.name()
                ),
            }
        });
        if post.is_err() {
            tracing::error!("rtrs bdev {}: could not post its loss to home", self.name());
        }
    }
}
