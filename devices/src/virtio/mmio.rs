//! virtio-MMIO transport (placeholder).
