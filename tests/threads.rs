//! A tier keeps a bounded number of threads whatever the load: its own binary, so that no
//! other test's tier shares the process while threads are counted.

use kvtier_core::key::make_key;
use kvtier_core::{JobKind, KeyBatch, Status, Tier};

const BLOCK: usize = 64 * 1024;
const BLOCKS: u64 = 512;

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end().starts_with(prefix))
        .count()
}

#[test]
fn file_io_threads_bound_the_tier_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "store": {"type": "local", "path": dir.path()},
        "runtime_threads": 2,
        "file_io_threads": 3,
        "max_inflight_transfers": 512,
    });
    let tier = Tier::from_json(&config.to_string()).unwrap();
    let mut mem = vec![7u8; BLOCKS as usize * BLOCK];
    unsafe {
        tier.register_memory(mem.as_mut_ptr(), BLOCKS, BLOCK)
            .unwrap()
    };
    let key = |i: u64| make_key(&i.to_be_bytes().repeat(4), 0);
    let mut peak = 0;
    for (kind, base) in [(JobKind::Store, 0), (JobKind::Load, 1000)] {
        // Every block in flight at once: 512 file operations competing for 3 threads.
        for i in 0..BLOCKS {
            let keys = KeyBatch::from_keys(&[key(i)]).unwrap();
            tier.submit(kind, base + i, &[i], keys).unwrap();
        }
        let mut done = 0;
        while done < BLOCKS {
            peak = peak.max(threads_named("kvtier-io"));
            for r in tier.poll(usize::MAX) {
                assert_eq!(r.status, Status::Ok, "{}", r.message);
                done += 1;
            }
            if done < BLOCKS {
                // Wait for the next result on the tier's ready fd (no sleep).
                let mut fds = libc::pollfd {
                    fd: tier.ready_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                unsafe { libc::poll(&mut fds, 1, 10_000) };
            }
        }
    }
    peak = peak.max(threads_named("kvtier-io"));
    assert!(peak >= 1, "the tier's threads are named kvtier-io");
    assert!(
        peak <= 2 + 3,
        "{peak} kvtier-io threads: more than runtime_threads + file_io_threads"
    );
    tier.shutdown();
    drop(tier);
    drop(mem);
}
