//! Hash maps whose keys callers choose, seeded per map so that no key set can be prepared that
//! collides in every cache.
//!
//! * Sequence and pin ids ([`IdMap`]) come from engines, which derive them from request ids that
//!   clients pick. A fixed, invertible hash let anyone compute ids that all land in one bucket
//!   (10,000 such ids made begin/free 62x slower; 40,000 took 25.8 s to begin). `IdMap` uses
//!   std's `RandomState`: SipHash-1-3 under a random 128-bit key per map, so the bucket of an id
//!   cannot be predicted without the key. Expected probe lengths are those of random keys.
//! * Prefix digests ([`DigestMap`]) are xxh3-128 values of token pages, uniform but computable by
//!   anyone: folding them with a fixed function lets a client grind prompts whose digests share
//!   their low bits (2^17 tries per page for a 2^17-bucket table). [`SeededDigest`] mixes both
//!   halves with two random 64-bit keys per map through a full 64x64→128 multiply whose halves are
//!   folded (foldhash's core step): one multiply per lookup, and, the keys being unknown, which
//!   digests collide cannot be known either.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// A map keyed by sequence or pin ids, SipHash-1-3 keyed randomly per map.
pub type IdMap<V> = HashMap<u64, V, RandomState>;

/// A map keyed by 128-bit prefix digests, seeded per map (see the module doc).
pub type DigestMap<V> = HashMap<u128, V, SeededDigest>;

/// Builds [`DigestHasher`]s with this map's two random keys.
#[derive(Debug, Clone)]
pub struct SeededDigest {
    k0: u64,
    k1: u64,
}

impl Default for SeededDigest {
    /// Fresh keys from the process's random source (std's `RandomState`).
    fn default() -> Self {
        let s = RandomState::new();
        SeededDigest {
            k0: s.hash_one(0x6b76_7368_6172_6530_u64),
            k1: s.hash_one(0x6b76_7368_6172_6531_u64) | 1,
        }
    }
}

impl BuildHasher for SeededDigest {
    type Hasher = DigestHasher;
    fn build_hasher(&self) -> DigestHasher {
        DigestHasher {
            k0: self.k0,
            k1: self.k1,
            h: 0,
        }
    }
}

/// One digest's hash: `fold((lo ^ k0) * (hi ^ k1))`, where `fold` xors the two halves of the
/// 128-bit product.
#[derive(Debug)]
pub struct DigestHasher {
    k0: u64,
    k1: u64,
    h: u64,
}

fn folded_multiply(a: u64, b: u64) -> u64 {
    let m = u128::from(a) * u128::from(b);
    (m as u64) ^ ((m >> 64) as u64)
}

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.h
    }
    fn write(&mut self, bytes: &[u8]) {
        // Not used by `u128` keys; kept correct for any other caller.
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.h = folded_multiply(self.h ^ self.k0 ^ u64::from_le_bytes(w), self.k1);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.h = folded_multiply((v as u64) ^ self.k0, ((v >> 64) as u64) ^ self.k1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_get_different_keys() {
        let (a, b) = (SeededDigest::default(), SeededDigest::default());
        assert!(a.k0 != b.k0 || a.k1 != b.k1);
        assert_ne!(a.hash_one(5u128), b.hash_one(5u128));
        let (x, y) = (RandomState::new(), RandomState::new());
        assert_ne!(x.hash_one(5u64), y.hash_one(5u64));
    }
}
