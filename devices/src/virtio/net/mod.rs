//! virtio-net (placeholder).
