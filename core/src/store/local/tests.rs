//! The local store's file code: atomic publication, reads into the block, batched
//! existence checks, O_DIRECT and fsync policies, directories removed under its feet.

#[test]
fn short_lived_files_are_temporary_objects() {
    use super::super::ObjectKind;
    for prefix in [super::TEMP_PREFIX, super::WRITE_PROBE_PREFIX] {
        assert_eq!(
            ObjectKind::of(&format!("kv/ns/{prefix}12-0")),
            ObjectKind::Temporary
        );
        assert_eq!(
            ObjectKind::of(&format!("{prefix}1-2")),
            ObjectKind::Temporary
        );
    }
}

use super::*;

fn files(dir: &FsPath, o_direct: bool, fsync: FsyncPolicy) -> Arc<LocalFiles> {
    let config = LocalConfig {
        path: dir.to_path_buf(),
        o_direct,
        fsync,
    };
    open(&config).unwrap().1
}

/// Pieces of every size (thousands of small ones, and one larger than PIECE)
/// land in order, checksummed in order.
#[test]
fn fill_writes_many_pieces_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut parts: Vec<bytes::Bytes> = (0..2500u32)
        .map(|i| bytes::Bytes::from(vec![(i % 251) as u8; 1 + (i as usize % 97)]))
        .collect();
    parts.insert(1200, bytes::Bytes::from(vec![7u8; PIECE * 2 + 3]));
    let body: PutPayload = parts.iter().cloned().collect();
    let whole: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    let path = dir.path().join("f");
    let file = File::create(&path).unwrap();
    let crc = fill(
        &file,
        &body,
        true,
        false,
        &CallerMemoryFence::default(),
        "f",
    )
    .unwrap();
    assert_eq!(crc, Some(integrity::checksum(&whole)));
    assert!(std::fs::read(&path).unwrap() == whole);
}

#[test]
fn write_read_exists_delete() {
    let dir = tempfile::tempdir().unwrap();
    for (o_direct, fsync) in [
        (false, FsyncPolicy::None),
        (true, FsyncPolicy::Full),
        (false, FsyncPolicy::Data),
    ] {
        let f = files(dir.path(), o_direct, fsync);
        let body: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let name = format!("a/b/c-{o_direct}-{fsync:?}.bin");
        assert!(!f.exists(&name).unwrap());
        let crc = integrity::checksum(&body);
        assert_eq!(
            write(&f, &name, &body, true, false).unwrap(),
            (WriteOutcome::Stored, Some(crc))
        );
        assert!(f.exists(&name).unwrap());
        let mut dest = vec![0u8; body.len()];
        let read = read_whole(&f, &name, &mut dest, true).unwrap();
        assert_eq!(dest, body);
        assert_eq!(read.computed, Some(crc));
        let mut short = vec![0u8; body.len() + 1];
        assert_eq!(
            read_whole(&f, &name, &mut short, true).unwrap_err().status,
            Status::LengthMismatch
        );
        f.delete(&name).unwrap();
        assert!(!f.exists(&name).unwrap());
        assert_eq!(
            read_whole(&f, &name, &mut dest, true).unwrap_err().status,
            Status::NotFound
        );
    }
    // No temporary file is left behind.
    assert_no_temporary_files(dir.path());
}

#[test]
fn create_publishes_once_and_overwrite_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path(), false, FsyncPolicy::None);
    assert_eq!(
        write(&f, "k/x", b"first", false, true).unwrap().0,
        WriteOutcome::Stored
    );
    assert_eq!(
        write(&f, "k/x", b"second", false, true).unwrap().0,
        WriteOutcome::AlreadyStored
    );
    assert_eq!(std::fs::read(dir.path().join("k/x")).unwrap(), b"first");
    assert_eq!(
        write(&f, "k/x", b"third", false, false).unwrap().0,
        WriteOutcome::Stored
    );
    assert_eq!(std::fs::read(dir.path().join("k/x")).unwrap(), b"third");
    assert_no_temporary_files(dir.path());
}

#[test]
fn a_directory_removed_under_the_cache_is_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path(), false, FsyncPolicy::None);
    write(&f, "d/e/one", b"1", false, false).unwrap();
    std::fs::remove_dir_all(dir.path().join("d")).unwrap();
    write(&f, "d/e/two", b"2", false, false).unwrap();
    assert_eq!(std::fs::read(dir.path().join("d/e/two")).unwrap(), b"2");
    // A new directory under a cached parent that was removed: made top-down first,
    // which finds the parent gone, then the whole chain.
    std::fs::remove_dir_all(dir.path().join("d")).unwrap();
    write(&f, "d/f/three", b"3", false, false).unwrap();
    assert_eq!(std::fs::read(dir.path().join("d/f/three")).unwrap(), b"3");
    // A file where a layout directory should be fails the store, never overwrites it.
    std::fs::write(dir.path().join("g"), b"not a directory").unwrap();
    assert!(write(&f, "g/h/four", b"4", false, false).is_err());
    assert_eq!(
        std::fs::read(dir.path().join("g")).unwrap(),
        b"not a directory"
    );
}

#[test]
fn stores_succeed_while_another_process_removes_emptied_directories() {
    // gc and eviction delete objects and then their emptied directories, at any moment
    // between a store's mkdir, its check and its open: every store still succeeds.
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path(), false, FsyncPolicy::None);
    // A few removals of the emptied directories race each store (as gc deletions do),
    // wherever they land in it.
    const STORES: u64 = 2_000;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    // The store during which the remover last finished a pass: each store waits for one
    // pass at its start, so that removals happen however the threads are scheduled (on
    // a busy machine the remover could otherwise never run while a store does).
    let passed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let remover = {
        let (root, done, passed) = (dir.path().to_path_buf(), done.clone(), passed.clone());
        std::thread::spawn(move || {
            let mut removed = 0u64;
            let mut seen = 0;
            while seen < STORES {
                // Up to three removals during one store, wherever they land in it.
                let mut this_store = 0;
                while done.load(Ordering::Acquire) == seen {
                    for d in ["s/t", "s"] {
                        // Only empty directories go, as object_store's cleanup does.
                        if this_store < 3 && std::fs::remove_dir(root.join(d)).is_ok() {
                            this_store += 1;
                        }
                    }
                    passed.store(seen, Ordering::Release);
                }
                removed += this_store;
                seen = done.load(Ordering::Acquire);
            }
            removed
        })
    };
    for i in 0..STORES {
        let name = format!("s/t/k{i}");
        write(&f, &name, b"x", false, false).unwrap_or_else(|e| panic!("store {i}: {}", e.message));
        std::fs::remove_file(dir.path().join(&name)).unwrap();
        done.store(i + 1, Ordering::Release);
        while i + 1 < STORES && passed.load(Ordering::Acquire) < i + 1 {
            std::thread::yield_now();
        }
    }
    assert!(
        remover.join().unwrap() > 0,
        "the remover never raced the stores"
    );
}

#[test]
fn a_temporary_name_already_taken_costs_another_name_not_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path(), false, FsyncPolicy::None);
    let g = files(dir.path(), false, FsyncPolicy::None);
    assert_ne!(f.temp_stem, g.temp_stem, "two stores of one process");
    // Files where the next temporary names of `f` would go (left by a crash, say).
    std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
    for n in 0..3 {
        std::fs::write(dir.path().join(format!("a/b/{}{n}", f.temp_stem)), b"left").unwrap();
    }
    assert_eq!(
        write(&f, "a/b/block", b"block", true, true).unwrap().0,
        WriteOutcome::Stored
    );
    assert_eq!(
        std::fs::read(dir.path().join("a/b/block")).unwrap(),
        b"block"
    );
    for n in 0..3 {
        let left = dir.path().join(format!("a/b/{}{n}", f.temp_stem));
        assert_eq!(std::fs::read(left).unwrap(), b"left", "never overwritten");
    }
}

#[test]
fn a_batch_of_checks_answers_as_single_checks_do() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path(), false, FsyncPolicy::None);
    // Namespaces of several levels, of none (blocks at the root), and names with fewer
    // levels than the layout's.
    let stored = [
        "kv/m_1_r0/abc/de_g0/abcdef.bin",
        "kv/m_1_r0/abc/df_g0/abcdff.bin",
        "deep/er/still/m_2/012/34_g1/01234.bin",
        "f00/ba_g0/f00ba.bin",
        "flat.bin",
        "one/two.bin",
    ];
    for name in stored {
        write(&f, name, b"block", false, false).unwrap();
    }
    let absent = [
        "kv/m_1_r0/abc/de_g0/abcdee.bin", // beside a stored block
        "kv/m_1_r0/fff/ff_g0/ffffff.bin", // its shard directory missing
        "kv/m_9_r0/abc/de_g0/abcdef.bin", // its namespace directory missing
        "f00/ba_g0/missing.bin",
        "two.bin",
        "one/three.bin",
    ];
    let mut checks = f.existence_checks();
    for name in stored {
        assert!(checks.exists(name).unwrap(), "{name}");
        assert!(f.exists(name).unwrap(), "{name}");
    }
    for name in absent {
        assert!(!checks.exists(name).unwrap(), "{name}");
        assert!(!f.exists(name).unwrap(), "{name}");
    }
    // A directory where a block should be is not a block.
    assert!(!checks.exists("kv/m_1_r0/abc/de_g0").unwrap());
    // A file where a layout directory should be: the check fails, in the batch as alone.
    std::fs::write(dir.path().join("kv/m_3_r0"), b"not a directory").unwrap();
    let damaged = "kv/m_3_r0/abc/de_g0/abcdef.bin";
    assert!(f.exists(damaged).is_err());
    assert!(checks.exists(damaged).is_err());
    std::fs::write(dir.path().join("kv/m_1_r0/abc/de_g0/x"), b"file").unwrap();
    assert!(checks.exists("kv/m_1_r0/abc/de_g0/x/y/z.bin").is_err());
}

#[test]
fn a_namespace_removed_and_made_again_is_seen_by_the_next_batch() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path(), false, FsyncPolicy::None);
    let name = "kv/m_1_r0/abc/de_g0/abcdef.bin";
    write(&f, name, b"block", false, false).unwrap();
    assert!(f.existence_checks().exists(name).unwrap());
    std::fs::remove_dir_all(dir.path().join("kv/m_1_r0")).unwrap();
    assert!(!f.existence_checks().exists(name).unwrap());
    write(&f, name, b"block", false, false).unwrap();
    // A batch opened after the directory was made again finds the block: directories
    // are opened per batch, never kept.
    assert!(f.existence_checks().exists(name).unwrap());
}

/// A one-piece write, as a pool block's.
fn write(
    f: &LocalFiles,
    name: &str,
    body: &[u8],
    checksum: bool,
    create: bool,
) -> Result<(WriteOutcome, Option<u32>)> {
    f.write(name, &PutPayload::from(body.to_vec()), checksum, create)
}

/// A read into one buffer, as into a pool block.
fn read_whole(f: &LocalFiles, name: &str, dest: &mut [u8], checksum: bool) -> Result<ReadBlock> {
    f.read(name, &mut BlockSlot::of_buffer(dest), checksum)
}

#[test]
fn an_object_written_in_pieces_is_the_object_written_whole() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path(), false, FsyncPolicy::None);
    let whole: Vec<u8> = (0..3 * PIECE + 17).map(|i| (i * 7 % 251) as u8).collect();
    let (a, b) = (PIECE / 3, 2 * PIECE + 5);
    let pieces: PutPayload = [&whole[..a], &whole[a..b], &whole[b..]]
        .into_iter()
        .map(bytes::Bytes::copy_from_slice)
        .collect();
    let (_, crc_pieces) = f.write("p/pieces", &pieces, true, false).unwrap();
    let (_, crc_whole) = write(&f, "p/whole", &whole, true, false).unwrap();
    assert_eq!(crc_pieces, crc_whole);
    assert_eq!(std::fs::read(dir.path().join("p/pieces")).unwrap(), whole);
    // Read back into pieces split elsewhere than they were written.
    let mut first = vec![0u8; PIECE + 1];
    let mut second = vec![0u8; whole.len() - first.len()];
    let memory = crate::memory::BlockMemory::new(vec![
        crate::memory::Piece {
            addr: first.as_mut_ptr() as usize,
            len: first.len(),
        },
        crate::memory::Piece {
            addr: second.as_mut_ptr() as usize,
            len: second.len(),
        },
    ]);
    // SAFETY: both buffers are this test's and are not touched while the slot is used.
    let mut slot = unsafe { BlockSlot::new(&memory) };
    let got = f.read("p/pieces", &mut slot, true).unwrap();
    assert_eq!(got.computed, crc_whole);
    assert_eq!(got.recorded, crc_whole);
    assert_eq!(slot.checksum(), crc_whole.unwrap());
    drop(slot);
    assert_eq!([first, second].concat(), whole);
}

/// Once the tier's fence on caller memory is closed (shutdown), a read copies nothing into
/// the block and a write copies nothing out of it: both fail `Cancelled`, the block keeps
/// its bytes and no object or temporary file is left.
#[test]
fn a_closed_fence_stops_reads_and_writes_of_caller_memory() {
    let dir = tempfile::tempdir().unwrap();
    for o_direct in [false, true] {
        let f = files(dir.path(), o_direct, FsyncPolicy::None);
        let body = vec![9u8; 2 * PIECE];
        let name = format!("f/stored-{o_direct}");
        write(&f, &name, &body, true, false).unwrap();
        f.caller_memory_fence().close();
        let mut block = vec![1u8; body.len()];
        let memory = crate::memory::BlockMemory::new(vec![crate::memory::Piece {
            addr: block.as_mut_ptr() as usize,
            len: block.len(),
        }]);
        // SAFETY: the buffer is this test's and is not touched while the slot is used.
        let mut slot = unsafe { BlockSlot::new(&memory) }.fenced(f.caller_memory_fence());
        let read = f.read(&name, &mut slot, true).unwrap_err();
        assert_eq!(read.status, Status::Cancelled, "{}", read.message);
        drop(slot);
        assert!(block.iter().all(|&b| b == 1), "the read wrote the block");
        let refused = write(&f, &format!("f/refused-{o_direct}"), &body, true, false).unwrap_err();
        assert_eq!(refused.status, Status::Cancelled, "{}", refused.message);
        assert!(!dir.path().join(format!("f/refused-{o_direct}")).exists());
    }
    assert_no_temporary_files(dir.path());
}

fn assert_no_temporary_files(dir: &FsPath) {
    let leftovers: Vec<_> = walk(dir)
        .into_iter()
        .filter(|p| p.contains(TEMP_PREFIX))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn walk(dir: &FsPath) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path.display().to_string());
        }
    }
    out
}
