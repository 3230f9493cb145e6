// SPDX-License-Identifier: Apache-2.0
//! MMDS V2 session tokens.
//!
//! A token is a slot number and 32 bytes from `getrandom(2)` (the kernel's
//! CSPRNG), written as 68 hex digits. The authority keeps, per slot, the
//! secret and its expiry; checking a token reads its slot and compares the
//! secret in constant time, so the cost of a check does not depend on how
//! many bytes of a guessed token are right, nor on how many tokens live.
//! The table is bounded ([`TOKEN_SLOTS`]): a guest asking for more tokens
//! than that replaces the one closest to expiry, its own earlier one.

use std::time::{Duration, Instant};

/// Shortest lifetime a token may be asked for, in seconds.
pub const MIN_TTL_SECONDS: u32 = 1;
/// Longest lifetime a token may be asked for (6 hours), in seconds.
pub const MAX_TTL_SECONDS: u32 = 21600;
/// Tokens alive at once.
pub const TOKEN_SLOTS: usize = 256;
const SECRET_LEN: usize = 32;
/// Hex digits of a token: 4 for the slot, 64 for the secret.
pub const TOKEN_LEN: usize = 4 + 2 * SECRET_LEN;

/// Why no token was issued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The lifetime asked for is outside 1 to 21600 seconds.
    #[error(
        "Invalid time to live value provided for token: {0}. Please provide a value between \
         {MIN_TTL_SECONDS} and {MAX_TTL_SECONDS}."
    )]
    InvalidTtl(u32),
    /// `getrandom(2)` failed.
    #[error("Cannot generate a session token: the kernel's random source failed.")]
    Random,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    secret: [u8; SECRET_LEN],
    expires: Instant,
}

/// The live tokens of one store.
#[derive(Debug, Default)]
pub struct TokenAuthority {
    slots: Vec<Slot>,
}

impl TokenAuthority {
    /// Issues a token living `ttl_seconds` from `now`.
    pub fn issue(&mut self, ttl_seconds: u32, now: Instant) -> Result<String, TokenError> {
        if !(MIN_TTL_SECONDS..=MAX_TTL_SECONDS).contains(&ttl_seconds) {
            return Err(TokenError::InvalidTtl(ttl_seconds));
        }
        let mut secret = [0u8; SECRET_LEN];
        crate::virtio::iov::fill_random(&mut secret).map_err(|_| TokenError::Random)?;
        let slot = Slot {
            secret,
            expires: now + Duration::from_secs(u64::from(ttl_seconds)),
        };
        let index = self.free_slot(now);
        if index == self.slots.len() {
            self.slots.push(slot);
        } else {
            self.slots[index] = slot;
        }
        let mut text = format!("{index:04x}");
        for b in secret {
            text.push_str(&format!("{b:02x}"));
        }
        Ok(text)
    }

    /// An expired slot, a new one while the table has room, or the slot
    /// that expires first.
    fn free_slot(&self, now: Instant) -> usize {
        if let Some(i) = self.slots.iter().position(|s| s.expires <= now) {
            return i;
        }
        if self.slots.len() < TOKEN_SLOTS {
            return self.slots.len();
        }
        self.slots
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| s.expires)
            .map_or(0, |(i, _)| i)
    }

    /// Whether `token` is one issued here that has not expired at `now`.
    pub fn is_valid(&self, token: &str, now: Instant) -> bool {
        let Some((index, secret)) = parse(token) else {
            return false;
        };
        let Some(slot) = self.slots.get(index) else {
            return false;
        };
        // Both checks always run, so a token's timing says nothing of
        // which failed.
        let same = constant_time_eq(&slot.secret, &secret);
        let alive = now < slot.expires;
        same & alive
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn parse(token: &str) -> Option<(usize, [u8; SECRET_LEN])> {
    let t = token.as_bytes();
    if t.len() != TOKEN_LEN {
        return None;
    }
    let mut index = 0usize;
    for &c in &t[..4] {
        index = index * 16 + usize::from(hex(c)?);
    }
    let mut secret = [0u8; SECRET_LEN];
    for (i, pair) in t[4..].chunks_exact(2).enumerate() {
        secret[i] = hex(pair[0])? << 4 | hex(pair[1])?;
    }
    Some((index, secret))
}

/// Compares two secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8; SECRET_LEN], b: &[u8; SECRET_LEN]) -> bool {
    let mut diff = 0u8;
    for i in 0..SECRET_LEN {
        diff |= std::hint::black_box(a[i] ^ b[i]);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_token_valid_until_its_ttl_only() {
        let mut a = TokenAuthority::default();
        let t0 = Instant::now();
        let tok = a.issue(5, t0).expect("token");
        assert_eq!(tok.len(), TOKEN_LEN);
        assert!(a.is_valid(&tok, t0));
        assert!(a.is_valid(&tok, t0 + Duration::from_millis(4999)));
        assert!(!a.is_valid(&tok, t0 + Duration::from_secs(5)));
        // One changed digit of the secret, of the slot, or a short token.
        let mut bad = tok.clone().into_bytes();
        bad[40] = if bad[40] == b'0' { b'1' } else { b'0' };
        assert!(!a.is_valid(std::str::from_utf8(&bad).expect("ascii"), t0));
        assert!(!a.is_valid(&format!("0001{}", &tok[4..]), t0));
        assert!(!a.is_valid(&tok[..60], t0));
        assert!(!a.is_valid(&format!("zz{}", &tok[2..]), t0));
        // Upper-case hex is the same token.
        assert!(a.is_valid(&tok.to_uppercase(), t0));
    }

    #[test]
    fn test_ttl_bounds() {
        let mut a = TokenAuthority::default();
        let now = Instant::now();
        assert_eq!(a.issue(0, now), Err(TokenError::InvalidTtl(0)));
        assert_eq!(a.issue(21601, now), Err(TokenError::InvalidTtl(21601)));
        assert!(a.issue(1, now).is_ok());
        assert!(a.issue(21600, now).is_ok());
    }

    #[test]
    fn test_table_is_bounded_and_reuses_expired_slots() {
        let mut a = TokenAuthority::default();
        let now = Instant::now();
        let first = a.issue(10, now).expect("token");
        let later = a.issue(100, now).expect("token");
        for _ in 0..TOKEN_SLOTS + 10 {
            a.issue(200, now).expect("token");
        }
        assert_eq!(a.slots.len(), TOKEN_SLOTS);
        // The closest to expiry went first.
        assert!(!a.is_valid(&first, now));
        assert!(!a.is_valid(&later, now));
        // An expired slot is reused before any other.
        let mut b = TokenAuthority::default();
        let x = b.issue(1, now).expect("token");
        let _y = b.issue(100, now).expect("token");
        let z = b.issue(5, now + Duration::from_secs(2)).expect("token");
        assert_eq!(&z[..4], &x[..4]);
        assert_eq!(b.slots.len(), 2);
    }

    #[test]
    fn test_constant_time_eq() {
        let a = [7u8; SECRET_LEN];
        let mut b = a;
        assert!(constant_time_eq(&a, &b));
        b[SECRET_LEN - 1] ^= 1;
        assert!(!constant_time_eq(&a, &b));
        b = a;
        b[0] ^= 0x80;
        assert!(!constant_time_eq(&a, &b));
    }
}
