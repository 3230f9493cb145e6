//! Driver-side test helpers (placeholder).
