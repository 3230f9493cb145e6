//! i8042 keyboard controller (placeholder).
