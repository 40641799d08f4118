//! CRC32C throughput on this machine: the `crc32c` crate (kvtier's) vs `crc-fast`
//! (VPCLMULQDQ/AVX-512 where present), on 2 MiB blocks, cache-hot (one block again and
//! again) and cache-cold (walking a 512 MiB pool, as a store of a host pool does).
use std::time::Instant;

fn main() {
    let block = 2 << 20;
    let pool_len = 512 << 20;
    let pool: Vec<u8> = (0..pool_len).map(|i| (i as u32).wrapping_mul(2654435761) as u8).collect();
    for (label, cold) in [("hot", false), ("cold", true)] {
        for name in ["crc32c", "crc-fast"] {
            let mut best = f64::MAX;
            let mut check = 0u64;
            for _ in 0..3 {
                let t = Instant::now();
                let mut bytes = 0usize;
                for i in 0..256 {
                    let off = if cold { (i * block) % pool_len } else { 0 };
                    let b = &pool[off..off + block];
                    check ^= match name {
                        "crc32c" => crc32c::crc32c(b) as u64,
                        _ => crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, b),
                    };
                    bytes += block;
                }
                let gbs = bytes as f64 / t.elapsed().as_secs_f64() / 1e9;
                best = best.min(1.0 / gbs);
            }
            println!("{{\"crc\":\"{name}\",\"cache\":\"{label}\",\"gb_s\":{:.2},\"cpu_s_per_gib\":{:.4},\"check\":{check}}}", 1.0 / best, best * (1u64 << 30) as f64 / 1e9);
        }
    }
    assert_eq!(crc32c::crc32c(&pool[..block]) as u64, crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &pool[..block]));
}
