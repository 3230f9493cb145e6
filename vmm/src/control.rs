// SPDX-License-Identifier: Apache-2.0
//! What the API may change on a running virtio device, whatever its kind:
//! [`DeviceControl`], which the registry holds for each device that has
//! something to change and the API's run-time side looks up by kind and id.
//!
//! A device offers two kinds of change, both optional: its rate limiters,
//! each under the name of its field in Firecracker's `PATCH` body
//! (`rx_rate_limiter`, `tx_rate_limiter` for a network interface,
//! `rate_limiter` for a drive), and the image it reads and writes
//! (`path_on_host`, a drive's). The run-time side parses the body, works out
//! the new buckets and, for an image, has the API thread open it
//! (`api::command`); the device then puts the change in force between two
//! of its passes, on the event loop's thread. The balloon's control is the
//! device itself ([`DeviceControl::balloon`]): its target, statistics and
//! hinting runs, which `api::balloon` reads and sets. A device with nothing
//! to change (the entropy device) has no control and is only attached.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use devices::rate_limiter::RateLimiterConfig;
use devices::virtio::balloon::Balloon;
use devices::virtio::block::{Block, BlockError, FileId};
use devices::virtio::net::{Net, NetBackend};

use crate::api::command::OpenedImage;
use crate::config::DeviceKind;

/// A rate limiter under the API's name for it.
pub type NamedLimiter = (&'static str, RateLimiterConfig);

/// The image under a device, as the API sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInUse {
    /// Its path, as last given.
    pub path: PathBuf,
    /// Whether the device opened it read-only (a new one is opened alike).
    pub read_only: bool,
    /// Which file it is (two devices may not share one).
    pub file: FileId,
}

/// What the API changes on a running device (see the module doc). Called on
/// the event loop's thread with the device locked, between its passes.
pub trait DeviceControl: Send {
    /// The device's rate limiters by name, with the buckets in force.
    fn rate_limiters(&self) -> Vec<NamedLimiter>;

    /// Puts each of `new` in force, whole (the limiters not named stay);
    /// `Err` is a one-line reason.
    fn set_rate_limiters(&mut self, new: &[NamedLimiter]) -> Result<(), String>;

    /// The image the API may replace, if the device has one.
    fn image(&self) -> Option<ImageInUse> {
        None
    }

    /// Puts the image the API thread opened at `path` under the device:
    /// a new file, or its own file again, whose size the guest is then
    /// told. `Err` is a one-line reason, and then nothing changed.
    fn take_image(&mut self, image: OpenedImage, path: &Path) -> Result<(), String> {
        let _ = (image, path);
        Err("this device has no image to replace".into())
    }

    /// The balloon, for the API's balloon requests (its target, its
    /// statistics, its hinting runs); none for any other device.
    fn balloon(&mut self) -> Option<&mut Balloon> {
        None
    }
}

impl DeviceControl for Balloon {
    /// The balloon has no rate limiter.
    fn rate_limiters(&self) -> Vec<NamedLimiter> {
        Vec::new()
    }

    fn set_rate_limiters(&mut self, new: &[NamedLimiter]) -> Result<(), String> {
        match new.first() {
            Some((name, _)) => Err(format!("the balloon device has no {name}")),
            None => Ok(()),
        }
    }

    fn balloon(&mut self) -> Option<&mut Balloon> {
        Some(self)
    }
}

impl<B: NetBackend + Send + 'static> DeviceControl for Net<B> {
    fn rate_limiters(&self) -> Vec<NamedLimiter> {
        let (rx, tx) = self.rate_limits();
        vec![("rx_rate_limiter", rx), ("tx_rate_limiter", tx)]
    }

    fn set_rate_limiters(&mut self, new: &[NamedLimiter]) -> Result<(), String> {
        let find = |name: &str| new.iter().find(|(n, _)| *n == name).map(|(_, l)| l);
        self.set_rate_limits(find("rx_rate_limiter"), find("tx_rate_limiter"))
            .map_err(|e| crate::error_line(&e))
    }
}

impl DeviceControl for Block {
    fn rate_limiters(&self) -> Vec<NamedLimiter> {
        vec![("rate_limiter", self.config().rate_limiter)]
    }

    fn set_rate_limiters(&mut self, new: &[NamedLimiter]) -> Result<(), String> {
        match new.iter().find(|(n, _)| *n == "rate_limiter") {
            Some((_, l)) => self
                .set_rate_limiter(l)
                .map_err(|e| crate::one_line(e.to_string())),
            None => Ok(()),
        }
    }

    fn image(&self) -> Option<ImageInUse> {
        Some(ImageInUse {
            path: self.config().path.clone(),
            read_only: self.config().read_only,
            file: self.backend().id(),
        })
    }

    fn take_image(&mut self, image: OpenedImage, path: &Path) -> Result<(), String> {
        match image {
            OpenedImage::Failed(msg) => Err(msg),
            OpenedImage::Locked { id, size, .. } if id == self.backend().id() => {
                // This drive's own image, which it holds locked: the host
                // resized it, and the guest is to see the new size.
                self.resize(size);
                Ok(())
            }
            OpenedImage::Locked { error, .. } => Err(error),
            OpenedImage::Image(mut backend) => {
                backend.probe();
                self.swap_backend(backend, path.to_path_buf())
                    .map_err(|e| match e {
                        BlockError::Config { msg, .. } => msg,
                        e => crate::one_line(e.to_string()),
                    })
            }
        }
    }
}

/// A device's control under its kind and id.
pub type ControlHandle = (DeviceKind, String, Arc<Mutex<dyn DeviceControl>>);

/// The controls of a VM's devices, as the API's run-time side looks them
/// up: by kind and id.
#[derive(Clone, Default)]
pub struct Controls(Vec<ControlHandle>);

impl Controls {
    /// No control.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the control of the device `kind` `id`.
    pub fn add(&mut self, kind: DeviceKind, id: &str, control: Arc<Mutex<dyn DeviceControl>>) {
        self.0.push((kind, id.to_string(), control));
    }

    /// The control of the device `kind` `id`.
    pub fn get(&self, kind: DeviceKind, id: &str) -> Option<&Arc<Mutex<dyn DeviceControl>>> {
        self.0
            .iter()
            .find(|(k, i, _)| *k == kind && i == id)
            .map(|(_, _, c)| c)
    }

    /// Every control, in attach order.
    pub fn iter(&self) -> impl Iterator<Item = &ControlHandle> {
        self.0.iter()
    }

    /// Forgets every control (tests of a device that is gone).
    #[cfg(test)]
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

impl std::fmt::Debug for Controls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, i, _)| (k, i)))
            .finish()
    }
}
