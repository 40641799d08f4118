//! Transfers: one job's blocks moved between caller memory and the store, with dedup on
//! the way out and checksum verification on the way in.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use object_store::path::Path;
use object_store::PutPayload;

use super::job::{JobKind, JobResult, KeyBatch};
use super::TierState;
use crate::config::{DedupMode, OnCorrupt};
use crate::encryption::format::segments;
use crate::encryption::{sealed_len, OpenError, HEADER_BYTES, TAG_BYTES};
use crate::error::{Error, Result, Status};
use crate::memory::{BlockMemory, BlockSlot, MemoryLease, OwnedBuffer};
use crate::store::{object_path, WriteOutcome};

/// Runs one job to its result: every key is attempted, concurrently, within the tier's
/// transfer permits.
pub(crate) async fn run_job(
    shared: Arc<TierState>,
    kind: JobKind,
    job_id: u64,
    memory: Vec<BlockMemory>,
    keys: KeyBatch,
    submitted: Instant,
) -> JobResult {
    // Keys were validated at submit; names are built from validated segments, so
    // `Path::parse` takes them without re-encoding.
    let names: Vec<Path> = keys
        .iter()
        .map(|key| {
            object_path(
                &shared
                    .layout
                    .object_name(key)
                    .expect("keys are validated at submit"),
            )
        })
        .collect();
    let lease = MemoryLease::new();
    let outcomes: Vec<Result<()>> = {
        let lease = &lease;
        let shared = &shared;
        futures::future::join_all(memory.iter().zip(&names).zip(keys.iter()).map(
            |((block, name), key)| async move {
                match kind {
                    JobKind::Store => store_deduplicated(shared, key, name, block, lease).await,
                    JobKind::Load => {
                        let _permit = shared.transfer_permit().await?;
                        let loaded = load_block(shared, key, name, block).await;
                        if let Err(e) = &loaded {
                            if matches!(
                                e.status,
                                Status::NotFound
                                    | Status::Corrupt
                                    | Status::LengthMismatch
                                    | Status::Undecryptable
                            ) {
                                shared.dedup.forget(key);
                            }
                        }
                        loaded
                    }
                }
            },
        ))
        .await
    };
    // Every operation has returned; wait until no HTTP body still points into the pool.
    lease.released().await;

    let key_status: Vec<Status> = outcomes
        .iter()
        .map(|o| o.as_ref().err().map_or(Status::Ok, |e| e.status))
        .collect();
    let ok_keys = key_status.iter().filter(|s| s.is_ok()).count();
    let ok_bytes: usize = memory
        .iter()
        .zip(&key_status)
        .filter(|(_, s)| s.is_ok())
        .map(|(m, _)| m.len())
        .sum();
    let stats = &shared.stats;
    let (keys_counter, bytes_counter) = match kind {
        JobKind::Store => (&stats.keys_stored, &stats.bytes_stored),
        JobKind::Load => (&stats.keys_loaded, &stats.bytes_loaded),
    };
    keys_counter.fetch_add(ok_keys as u64, Ordering::Relaxed);
    for (block, _) in memory.iter().zip(&key_status).filter(|(_, s)| s.is_ok()) {
        shared.metrics.object_moved(block.len());
    }
    bytes_counter.fetch_add(ok_bytes as u64, Ordering::Relaxed);
    stats
        .keys_failed
        .fetch_add((keys.len() - ok_keys) as u64, Ordering::Relaxed);
    let first_error = outcomes.iter().find_map(|o| o.as_ref().err());
    let message = match first_error {
        Some(e) => {
            let failed = keys.len() - ok_keys;
            format!(
                "{failed} of {} keys failed; first: {}",
                keys.len(),
                e.message
            )
        }
        None => String::new(),
    };
    JobResult {
        job_id,
        kind,
        status: first_error.map_or(Status::Ok, |e| e.status),
        bytes: ok_bytes as u64,
        seconds: submitted.elapsed().as_secs_f64(),
        key_status,
        keys,
        message,
    }
}

/// Stores one block unless the store is known to hold it or an upload of the same key
/// is already running, in which case the outcome of that upload is shared.
async fn store_deduplicated(
    shared: &TierState,
    key: &[u8],
    name: &Path,
    block: &BlockMemory,
    lease: &MemoryLease,
) -> Result<()> {
    let dedup = &shared.dedup;
    let repair = dedup.is_corrupt(key);
    if dedup.mode == DedupMode::Off {
        let _permit = shared.transfer_permit().await?;
        return store_block(shared, key, name, block, lease, repair).await;
    }
    if !repair && dedup.is_known(key) {
        shared.stats.dedup_known.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    if let Some(waiter) = dedup.begin_upload(key) {
        shared.stats.dedup_joined.fetch_add(1, Ordering::Relaxed);
        return waiter.await.unwrap_or_else(|_| {
            Err(Error::new(
                Status::Cancelled,
                "the shared upload was abandoned",
            ))
        });
    }
    let outcome = match shared.transfer_permit().await {
        Ok(_permit) => store_block(shared, key, name, block, lease, repair).await,
        Err(e) => Err(e),
    };
    if outcome.is_ok() {
        dedup.remember(key);
    }
    dedup.end_upload(key, &outcome);
    outcome
}

/// Uploads one block; `repair` overwrites whatever the store holds under the name (an
/// object found corrupt), also in `conditional` mode.
async fn store_block(
    shared: &TierState,
    key: &[u8],
    name: &Path,
    block: &BlockMemory,
    lease: &MemoryLease,
    repair: bool,
) -> Result<()> {
    // Encrypted blocks upload a sealed copy (encrypted from the block, segment by
    // segment); plain ones a view of the caller's memory.
    let body = match &shared.encryption {
        Some(encryption) => PutPayload::from(encryption.seal(name.as_ref(), block)?),
        None => lease.payload(block),
    };
    let create = shared.dedup.mode == DedupMode::Conditional && !repair;
    let (written, crc) = shared
        .store
        .write_block(
            name,
            body,
            shared.config.checksums,
            create,
            shared.transfer_lane(),
        )
        .await?;
    match written {
        WriteOutcome::Stored => {
            if repair {
                shared.dedup.repaired(key);
            }
            if let Some(crc) = crc {
                shared.dedup.remember_upload(key, crc);
            }
        }
        WriteOutcome::AlreadyStored => {
            shared
                .stats
                .dedup_already_stored
                .fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Loads one block. A checksum mismatch is read again through the general client before
/// anything is concluded: corruption in transit (a bad link, middlebox or NIC) reads clean
/// the second time, and the load succeeds with the verified bytes. A second mismatch fails
/// the key: it turns MISS for every later lookup of this tier and its next store overwrites
/// the object. `fail_and_delete` deletes the object only when both reads returned the same
/// bytes (corrupt in the store); two different wrong reads are corruption in transit.
async fn load_block(
    shared: &TierState,
    key: &[u8],
    name: &Path,
    block: &BlockMemory,
) -> Result<()> {
    let Some(encryption) = &shared.encryption else {
        return load_object(shared, key, name, block, &[]).await;
    };
    // An encrypted object lands as it is stored: its header and tags in buffers of their
    // own, its body straight in the block, which it then decrypts in place.
    let header = OwnedBuffer::new(HEADER_BYTES);
    let tags = OwnedBuffer::new(TAG_BYTES * segments(block.len()));
    let object = BlockMemory::new(
        std::iter::once(header.piece())
            .chain(block.pieces().iter().copied())
            .chain(std::iter::once(tags.piece()))
            .collect(),
    );
    let buffers = [header.clone(), tags.clone()];
    // A failed tag is read once more before anything is concluded: with no checksum to
    // tell it, damage in transit looks like tampering.
    let mut reads_left = 2;
    loop {
        reads_left -= 1;
        load_object(shared, key, name, &object, &buffers)
            .await
            .map_err(|e| {
                if e.status != Status::LengthMismatch {
                    return e;
                }
                // Most likely a plain object in a namespace that took encryption on: MISS
                // from now on, and the next store rewrites it (even a conditional one).
                shared.dedup.mark_corrupt(key);
                Error::new(
                    e.status,
                    format!(
                        "{}; with encryption on, a block of {} bytes is an object of {} (an \
                         object written without encryption is refused)",
                        e.message,
                        block.len(),
                        sealed_len(block.len())
                    ),
                )
            })?;
        // SAFETY: `load_object` awaited every read of the object: nothing writes the
        // buffers now. The block: as in `load_object`, this load job holds it alone.
        let (header_bytes, tag_bytes) = unsafe { (header.bytes(), tags.bytes()) };
        let header_bytes: &[u8; HEADER_BYTES] = header_bytes
            .try_into()
            .expect("a header of the format's length");
        let mut slot = unsafe { BlockSlot::new(block) };
        let failed = match encryption.open_block(name.as_ref(), header_bytes, tag_bytes, &mut slot)
        {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if failed == OpenError::TagMismatch && reads_left > 0 {
            log::warn!("block {name} failed authentication; reading it again");
            continue;
        }
        shared
            .stats
            .undecryptable_blocks
            .fetch_add(1, Ordering::Relaxed);
        shared.dedup.mark_corrupt(key);
        log::warn!("block {name} does not open: {failed}");
        return Err(Error::new(
            Status::Undecryptable,
            format!("load {name}: the object does not open: {failed}"),
        ));
    }
}

/// Reads an object into `memory`, verified against its checksum (see `load_block`).
async fn load_object(
    shared: &TierState,
    key: &[u8],
    name: &Path,
    memory: &BlockMemory,
    buffers: &[Arc<OwnedBuffer>],
) -> Result<()> {
    // SAFETY: the memory was checked against its pool or region at submit, and this load
    // job holds it alone until its result is polled (JobTable::hold); the engine's own
    // `buffers` among its pieces are kept alive by the slot.
    let mut slot =
        unsafe { BlockSlot::with_buffers(memory, buffers) }.fenced(shared.caller_memory.clone());
    let first = match read_verified(shared, key, name, &mut slot, true).await {
        Err(e) if e.status == Status::Corrupt => e,
        other => return other,
    };
    log::warn!(
        "{}; reading it again to tell corruption in the store from corruption in transit",
        first.message
    );
    // The bytes of each read are in the block when it reports a mismatch.
    let first_crc = slot.checksum();
    match read_verified(shared, key, name, &mut slot, false).await {
        Ok(()) => {
            log::warn!(
                "block {name} read clean the second time: the first read was corrupted in transit"
            );
            Ok(())
        }
        Err(second) if second.status == Status::Corrupt => {
            shared.stats.corrupt_blocks.fetch_add(1, Ordering::Relaxed);
            shared.dedup.mark_corrupt(key);
            // The same wrong bytes twice: the object itself is corrupt. Two different wrong
            // reads are corruption in transit (or an object being rewritten): never deleted.
            let same_bytes = slot.checksum() == first_crc;
            log::warn!(
                "block {name}: two reads failed its checksum{}",
                if same_bytes {
                    ", with the same bytes: corrupt in the store"
                } else {
                    ", with different bytes"
                }
            );
            if shared.config.on_corrupt == OnCorrupt::FailAndDelete && same_bytes {
                match shared.store.delete(name).await {
                    Ok(()) => super::eviction::emit_removed(shared, &[key.to_vec()]),
                    Err(e) => log::warn!("could not delete corrupt block {name}: {}", e.message),
                }
            }
            Err(second)
        }
        Err(second) => Err(Error::new(
            first.status,
            format!(
                "{}; reading it again failed too: {}",
                first.message, second.message
            ),
        )),
    }
}

/// One read of a block into its slot, checked against the checksum the object records,
/// or else the one this tier uploaded under the key.
async fn read_verified(
    shared: &TierState,
    key: &[u8],
    name: &Path,
    slot: &mut BlockSlot,
    allow_direct: bool,
) -> Result<()> {
    let verify = shared.config.checksums;
    let read = shared
        .store
        .read_block(name, slot, verify, allow_direct, shared.transfer_lane())
        .await?;
    if !verify {
        return Ok(());
    }
    match (
        read.recorded.or_else(|| shared.dedup.uploaded_crc(key)),
        read.computed,
    ) {
        (Some(want), Some(got)) if want != got => Err(Error::new(
            Status::Corrupt,
            format!("load {name}: checksum {got:08x} does not match the recorded {want:08x}"),
        )),
        _ => Ok(()),
    }
}
