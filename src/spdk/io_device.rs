//! SPDK io_devices whose channel contexts are Rust values ([`IoDevice`], [`IoChannel`]).
//!
//! SPDK gives every thread that asks one channel per io_device and calls the device's
//! create and destroy callbacks with the channel's context memory. Here that memory holds
//! a `T: ChannelCtx`, made by [`ChannelCtx::create`] on the channel's thread and dropped
//! there by SPDK's destroy callback; the io_device's key is the address of an `Arc<D>`
//! the registration holds until SPDK says the last channel is gone
//! ([`ChannelCtx::device_gone`]). A channel taken here ([`IoDevice::channel`]) is put when
//! its [`IoChannel`] is dropped, on its thread (it is neither `Send` nor `Sync`).

use std::ffi::{c_int, c_void, CStr};
use std::marker::PhantomData;
use std::mem::{size_of, ManuallyDrop};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use super::sys;
use crate::Errno;

/// The context of each channel of an [`IoDevice`], on the channel's thread.
pub trait ChannelCtx: Sized + 'static {
    /// What the io_device stands for (its key is this value's address).
    type Device: Send + Sync + 'static;

    /// Makes the context of a new channel on the calling SPDK thread.
    ///
    /// # Errors
    /// The channel cannot be had: SPDK's `spdk_get_io_channel` returns null.
    fn create(dev: &Arc<Self::Device>) -> Result<Self, Errno>;

    /// Called once the context lies where it stays (SPDK's channel memory) and before any
    /// other use: a context that needs its own address (for a poller of its) takes it here.
    /// The context is dropped again on an error.
    ///
    /// # Errors
    /// The channel cannot be had, as for [`ChannelCtx::create`].
    fn placed(&self) -> Result<(), Errno> {
        Ok(())
    }

    /// The io_device was unregistered and its last channel is gone (SPDK's unregister
    /// callback, on the unregistering thread); `dev` is the registration's reference.
    fn device_gone(dev: Arc<Self::Device>) {
        drop(dev);
    }
}

/// A registered io_device whose channels' contexts are `T`s.
pub struct IoDevice<T: ChannelCtx> {
    /// `Arc::into_raw` of the registration's reference: the io_device's key.
    key: NonNull<T::Device>,
    _ctx: PhantomData<fn() -> T>,
}

// SAFETY: the key is an `Arc<T::Device>` (Send + Sync) held by the registration; SPDK's
// io_device calls are made for any thread (a channel is got on, and is the calling
// thread's; the device is unregistered once, by `unregister` taking the value).
unsafe impl<T: ChannelCtx> Send for IoDevice<T> {}
// SAFETY: as Send: `&IoDevice` only gets the calling thread's own channels.
unsafe impl<T: ChannelCtx> Sync for IoDevice<T> {}

impl<T: ChannelCtx> IoDevice<T> {
    /// Registers `dev` as an io_device named `name` (SPDK copies the name).
    pub fn register(dev: &Arc<T::Device>, name: &CStr) -> IoDevice<T> {
        let key = Arc::into_raw(Arc::clone(dev)).cast_mut();
        // SAFETY: the key is a live allocation held until `device_gone_cb` (or the value's
        // `forget_unregistered`); the callbacks are this type's; the context size is T's.
        unsafe {
            sys::spdk_io_device_register(
                key.cast(),
                Some(create_cb::<T>),
                Some(destroy_cb::<T>),
                ctx_size::<T>(),
                name.as_ptr(),
            );
        }
        IoDevice {
            // SAFETY: Arc::into_raw is never null.
            key: unsafe { NonNull::new_unchecked(key) },
            _ctx: PhantomData,
        }
    }

    /// The io_device's key (what SPDK knows it by).
    pub fn key(&self) -> *mut c_void {
        self.key.as_ptr().cast()
    }

    /// The calling SPDK thread's channel of this io_device, made at its first call.
    ///
    /// # Errors
    /// Not on an SPDK thread, or SPDK could not make the channel (its create failed).
    pub fn channel(&self) -> Result<IoChannel<T>, Errno> {
        // SAFETY: a registered io_device (registered until `self` is consumed); the
        // channel is put by the IoChannel's Drop, on this thread.
        let ch = unsafe { sys::spdk_get_io_channel(self.key()) };
        NonNull::new(ch)
            .map(|ch| IoChannel {
                ch,
                _ctx: PhantomData,
            })
            .ok_or(Errno::ENOMEM)
    }

    /// Unregisters the io_device: once its last channel is gone, SPDK calls
    /// [`ChannelCtx::device_gone`] with the registration's reference. (Dropping the value
    /// unregisters it too, but only lets the reference go.)
    pub fn unregister(self) {
        let key = ManuallyDrop::new(self).key();
        // SAFETY: registered by `register`, unregistered once (the value is consumed, its
        // Drop does not run); the callback gives the registration's reference back.
        unsafe { sys::spdk_io_device_unregister(key, Some(device_gone_cb::<T>)) };
    }

    /// The key, with the registration left in place for [`IoDevice::from_key`] (for an
    /// io_device SPDK's callbacks know only by its key, as a bdev's `ctxt`).
    pub fn into_key(self) -> *mut c_void {
        ManuallyDrop::new(self).key()
    }

    /// The registration [`IoDevice::into_key`] left.
    ///
    /// # Safety
    /// `key` must come from `into_key` of an `IoDevice<T>` and be taken back once.
    pub unsafe fn from_key(key: *mut c_void) -> IoDevice<T> {
        IoDevice {
            // SAFETY: per the contract, an Arc's address, never null.
            key: unsafe { NonNull::new_unchecked(key.cast()) },
            _ctx: PhantomData,
        }
    }

    /// Runs `f` on the registration [`IoDevice::into_key`] left, leaving it in place.
    ///
    /// # Safety
    /// `key` must come from `into_key` of an `IoDevice<T>` not yet taken back.
    pub unsafe fn with_key<R>(key: *mut c_void, f: impl FnOnce(&IoDevice<T>) -> R) -> R {
        // SAFETY: per the contract; not dropped, so the registration stays.
        let dev = ManuallyDrop::new(unsafe { IoDevice::<T>::from_key(key) });
        f(&dev)
    }
}

impl<T: ChannelCtx> Drop for IoDevice<T> {
    fn drop(&mut self) {
        // SAFETY: registered by `register`, unregistered once (here, or by `unregister`,
        // which skips this Drop); the callback lets the registration's reference go.
        unsafe { sys::spdk_io_device_unregister(self.key(), Some(release_cb::<T>)) };
    }
}

/// One of the calling thread's channels of an [`IoDevice<T>`], put when dropped.
pub struct IoChannel<T: ChannelCtx> {
    ch: NonNull<sys::spdk_io_channel>,
    /// Neither Send nor Sync: a channel is its thread's.
    _ctx: PhantomData<*mut T>,
}

impl<T: ChannelCtx> IoChannel<T> {
    /// The channel for SPDK, which takes it over and puts it itself (a bdev's
    /// `get_io_channel`).
    pub fn into_raw(self) -> *mut sys::spdk_io_channel {
        ManuallyDrop::new(self).ch.as_ptr()
    }
}

impl<T: ChannelCtx> std::ops::Deref for IoChannel<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: a live channel of an IoDevice<T> (held until Drop), used on its thread
        // (the value cannot leave it): its context is the T written by `create_cb`.
        unsafe { &*io_channel_ctx::<T>(self.ch) }
    }
}

impl<T: ChannelCtx> Drop for IoChannel<T> {
    fn drop(&mut self) {
        // SAFETY: got by `IoDevice::channel` on this thread, put once.
        unsafe { sys::spdk_put_io_channel(self.ch.as_ptr()) };
    }
}

/// The context of a channel SPDK hands the module (a bdev's `submit_request`).
///
/// # Safety
/// `ch` must be a live channel (so not null) of an [`IoDevice<T>`], and the caller on its
/// thread: the context lives until SPDK's destroy callback, which runs on that thread.
pub unsafe fn channel_ctx<'a, T: ChannelCtx>(ch: *mut sys::spdk_io_channel) -> &'a T {
    // SAFETY: per the contract, `ch` is not null and has a T for a context.
    unsafe { &*io_channel_ctx::<T>(NonNull::new_unchecked(ch)) }
}

/// The context of an I/O channel: the bytes SPDK allocates after the channel's header
/// for the io_device's context size (what `spdk_io_channel_get_ctx`, a static inline the
/// bindings lack, computes). Only an address: reading it is the caller's to justify.
fn io_channel_ctx<T>(ch: NonNull<sys::spdk_io_channel>) -> *mut T {
    ch.as_ptr()
        .cast::<u8>()
        .wrapping_add(sys::SPDK_IO_CHANNEL_STRUCT_SIZE as usize)
        .cast::<T>()
}

fn ctx_size<T>() -> u32 {
    u32::try_from(size_of::<T>()).unwrap_or(u32::MAX)
}

unsafe extern "C" fn create_cb<T: ChannelCtx>(
    io_device: *mut c_void,
    ctx_buf: *mut c_void,
) -> c_int {
    // SAFETY: the key of an IoDevice<T>: the registration's Arc, alive while SPDK makes
    // channels of it; borrowed here, not released.
    let dev =
        ManuallyDrop::new(unsafe { Arc::from_raw(io_device.cast_const().cast::<T::Device>()) });
    let ctx = match T::create(&dev) {
        Ok(ctx) => ctx,
        Err(e) => return e.neg(),
    };
    let place = ctx_buf.cast::<T>();
    // SAFETY: SPDK gives `ctx_size::<T>()` bytes, aligned for any context, ours until
    // `destroy_cb` (or dropped below when SPDK will not call it).
    unsafe { ptr::write(place, ctx) };
    // SAFETY: just written; on this thread.
    if let Err(e) = unsafe { (*place).placed() } {
        // SAFETY: written above and not shared; SPDK calls no destroy for a failed create.
        unsafe { ptr::drop_in_place(place) };
        return e.neg();
    }
    0
}

unsafe extern "C" fn destroy_cb<T: ChannelCtx>(_io_device: *mut c_void, ctx_buf: *mut c_void) {
    // SAFETY: the context `create_cb` wrote, destroyed once by SPDK, on its thread.
    unsafe { ptr::drop_in_place(ctx_buf.cast::<T>()) };
}

unsafe extern "C" fn device_gone_cb<T: ChannelCtx>(io_device: *mut c_void) {
    // SAFETY: the key of an IoDevice<T> that was unregistered: the registration's
    // reference, given back once, here.
    let dev = unsafe { Arc::from_raw(io_device.cast_const().cast::<T::Device>()) };
    T::device_gone(dev);
}

unsafe extern "C" fn release_cb<T: ChannelCtx>(io_device: *mut c_void) {
    // SAFETY: the key of an IoDevice<T> that was dropped: the registration's reference,
    // let go once, here.
    drop(unsafe { Arc::from_raw(io_device.cast_const().cast::<T::Device>()) });
}
