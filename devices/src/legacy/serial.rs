//! 8250 UART (placeholder).
