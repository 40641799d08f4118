//! What the tests move: host pools of blocks, their deterministic random contents, and
//! vLLM-style keys.

use kvtier_core::key::make_key;
use kvtier_core::{KeyBatch, Tier};

/// A host pool. Once registered with a tier, its memory is never freed: tests declare
/// the pool after the tier, so it is dropped first, and a test that fails with jobs in
/// flight would otherwise drop the memory those jobs still write into.
pub struct Pool {
    pub mem: Vec<u8>,
    pub blocks: u64,
    pub block_bytes: usize,
    registered: bool,
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.registered {
            std::mem::forget(std::mem::take(&mut self.mem));
        }
    }
}

impl Pool {
    pub fn new(blocks: u64, block_bytes: usize) -> Self {
        Pool {
            mem: vec![0u8; blocks as usize * block_bytes],
            blocks,
            block_bytes,
            registered: false,
        }
    }
    /// A pool of `blocks` blocks of random bytes (`seed`), registered with `tier`.
    pub fn random_registered(tier: &Tier, blocks: u64, block_bytes: usize, seed: u64) -> Self {
        let mut pool = Pool::new(blocks, block_bytes);
        pool.fill_random(seed);
        pool.register(tier);
        pool
    }
    pub fn block(&self, i: u64) -> &[u8] {
        &self.mem[i as usize * self.block_bytes..(i as usize + 1) * self.block_bytes]
    }
    pub fn block_mut(&mut self, i: u64) -> &mut [u8] {
        &mut self.mem[i as usize * self.block_bytes..(i as usize + 1) * self.block_bytes]
    }
    pub fn fill_random(&mut self, seed: u64) {
        fill_random(&mut self.mem, seed);
    }
    pub fn register(&mut self, tier: &Tier) {
        self.registered = true;
        unsafe {
            tier.register_memory(self.mem.as_mut_ptr(), self.blocks, self.block_bytes)
                .unwrap()
        }
    }
}

pub fn fill_random(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 24) as u8;
    }
}

pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_random(&mut v, seed);
    v
}

/// A 36-byte vLLM key (SHA-256-sized hash + group) derived from `i`.
pub fn key(i: u64) -> Vec<u8> {
    let mut hash = [0u8; 32];
    hash[..8].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
    hash[8..16].copy_from_slice(&i.to_le_bytes());
    make_key(&hash, (i % 3) as u32)
}

pub fn keys(ids: &[u64]) -> KeyBatch {
    KeyBatch::from_keys(&ids.iter().map(|&i| key(i)).collect::<Vec<_>>()).unwrap()
}
