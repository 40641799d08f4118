//! Whole-object operations for the command line, eviction and tests: listing, batched
//! deletes, checked reads, writes with the checksum recorded.

use super::read::{read_body, Sink};
use super::*;

/// What [`Store::check_object`] read: an object's length and checksums, as a load sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectCheck {
    /// Bytes read.
    pub bytes: u64,
    /// The checksum recorded with the object (object metadata, or the local store's
    /// extended attribute), if any.
    pub recorded: Option<u32>,
    /// The checksum of the bytes read.
    pub computed: u32,
}

impl ObjectCheck {
    /// Whether the bytes read disagree with the recorded checksum.
    pub fn checksum_mismatch(&self) -> bool {
        self.recorded.is_some_and(|r| r != self.computed)
    }
}

/// One object of a [`Store::list`]ing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectInfo {
    /// The object's name (`/`-separated).
    pub name: String,
    pub bytes: u64,
    /// When it was last written.
    pub modified: SystemTime,
    /// What it is, by its name.
    pub kind: ObjectKind,
}

impl Store {
    /// Writes `body` at `path` as a store job does (overwriting), its checksum recorded
    /// beside it where a load looks for it: for tools that check a store end to end.
    pub async fn put_block(&self, path: &Path, body: Bytes) -> Result<()> {
        self.write_block(path, PutPayload::from_bytes(body), true, false, Lane::ALONE)
            .await
            .map(|_| ())
    }

    /// Reads the object at `path` whole through the store client, checksumming its bytes
    /// as they arrive, with the checksum recorded beside it, where a load finds it. A
    /// missing object fails with [`Status::NotFound`].
    pub async fn check_object(&self, path: &Path) -> Result<ObjectCheck> {
        let got = answered(self.client.get_opts(path, GetOptions::default()))
            .await
            .map_err(|e| op_error("verify", path, &e))?;
        let read = read_body("verify", path, got, Sink::Count, true).await?;
        Ok(ObjectCheck {
            bytes: read.bytes,
            recorded: read.recorded,
            computed: read.computed,
        })
    }

    /// Reads the object at `path` whole into memory, checksummed as
    /// [`check_object`](Self::check_object) does: its bytes and what the read found.
    pub async fn read_checked_object(&self, path: &Path) -> Result<(Vec<u8>, ObjectCheck)> {
        let got = answered(self.client.get_opts(path, GetOptions::default()))
            .await
            .map_err(|e| op_error("verify", path, &e))?;
        let len = usize::try_from(got.meta.size).map_err(|_| {
            Error::new(
                Status::Io,
                format!("verify {path}: too large to read whole"),
            )
        })?;
        // A buffer the slot keeps alive, as a load's own buffers are: a blocking read
        // outlives this future if it is dropped.
        let buffer = OwnedBuffer::new(len);
        let memory = BlockMemory::new(vec![buffer.piece()]);
        // SAFETY: the slot's only piece is `buffer`, which it keeps alive.
        let slot = unsafe { BlockSlot::with_buffers(&memory, std::slice::from_ref(&buffer)) };
        let read = read_body("verify", path, got, Sink::Block(slot), true).await?;
        if read.bytes != len as u64 {
            return Err(Error::new(
                Status::Io,
                format!("verify {path}: the object changed while it was read (listed {len} bytes, read {})", read.bytes),
            ));
        }
        let check = ObjectCheck {
            bytes: read.bytes,
            recorded: read.recorded,
            computed: read.computed,
        };
        let bytes =
            OwnedBuffer::into_vec(buffer).expect("the read is over: no slot holds the buffer");
        Ok((bytes, check))
    }

    /// Deletes the object at `path`.
    pub async fn delete(&self, path: &Path) -> Result<()> {
        if let Backend::Local { files } = &self.backend {
            // On a file I/O thread: an unlink can hang with its file system, and a load's
            // task (which deletes a corrupt block) must never block in the kernel.
            let (files, name) = (files.clone(), path.to_string());
            return tokio::task::spawn_blocking(move || files.delete(&name))
                .await
                .map_err(|e| Error::join(&format!("delete {path}"), &e))?;
        }
        answered(self.client.delete(path))
            .await
            .map_err(|e| op_error("delete", path, &e))
    }

    /// The objects whose names start with `prefix` (a `/`-separated path; "" for the whole
    /// store), in the store's order. An error's message is the store's answer alone: the
    /// caller says what was listed.
    pub fn list(&self, prefix: &str) -> BoxStream<'static, Result<ObjectInfo>> {
        use futures::StreamExt;
        let prefix = (!prefix.is_empty()).then(|| object_path(prefix));
        let listing = self.client.list(prefix.as_ref());
        futures::stream::unfold(listing, |mut listing| async move {
            // Each page is asked for while the stream is polled: observed there.
            let (item, answer) = answer::observed(listing.next()).await;
            let item = item?.map_err(|error| {
                let failed = Failed { error, answer };
                Error::new(classify(&failed), failed.chain())
            });
            let info = item.map(|meta| {
                let name = meta.location.to_string();
                ObjectInfo {
                    kind: ObjectKind::of(&name),
                    name,
                    bytes: meta.size,
                    modified: meta.last_modified.into(),
                }
            });
            Some((info, listing))
        })
        .boxed()
    }

    /// Deletes the objects named `names`, many per request where the store takes batches
    /// (S3's DeleteObjects, Azure's blob batch), and answers for each name, in their order,
    /// whether it is gone: deleted now, or not there ("not found" counts as gone). A store
    /// that refuses a whole batch (a server without DeleteObjects) is asked one object at a
    /// time, then and from then on.
    pub async fn delete_objects(&self, names: &[String]) -> Vec<(String, Result<()>)> {
        use futures::StreamExt;
        /// Objects per batch: S3's DeleteObjects takes up to 1000 keys.
        const BATCH: usize = 1000;
        /// Single deletes in flight at once where batches are refused.
        const SINGLE_DELETES_IN_FLIGHT: usize = 16;
        let gone = |name: &str, failed: Option<Failed>| -> Result<()> {
            match failed {
                None => Ok(()),
                Some(f) if matches!(f.error, object_store::Error::NotFound { .. }) => Ok(()),
                Some(f) => Err(op_error("delete", &object_path(name), &f)),
            }
        };
        let mut outcomes = Vec::with_capacity(names.len());
        for chunk in names.chunks(BATCH) {
            if !self.batch_delete_refused.load(Ordering::Relaxed) {
                let paths: Vec<_> = chunk.iter().map(|n| Ok(object_path(n))).collect();
                let (results, answer) = answer::observed(
                    self.client
                        .delete_stream(futures::stream::iter(paths).boxed())
                        .collect::<Vec<_>>(),
                )
                .await;
                let any_gone = results
                    .iter()
                    .any(|r| matches!(r, Ok(_) | Err(object_store::Error::NotFound { .. })));
                if results.len() == chunk.len() && (any_gone || results.iter().all(|r| r.is_ok())) {
                    // One result per object, in the order asked.
                    for (name, result) in chunk.iter().zip(results) {
                        let failed = result.err().map(Failed::unanswered);
                        outcomes.push((name.clone(), gone(name, failed)));
                    }
                    continue;
                }
                if !any_gone {
                    let why: Vec<String> = results
                        .into_iter()
                        .filter_map(|r| r.err())
                        .map(|error| {
                            Failed {
                                error,
                                answer: answer.clone(),
                            }
                            .chain()
                        })
                        .collect();
                    log::warn!(
                        "{}: a batch delete was refused ({}); deleting one object at a time",
                        self.describe,
                        why.join("; ")
                    );
                    self.batch_delete_refused.store(true, Ordering::Relaxed);
                }
                // Else some of the batch is gone, but which is not known for each name:
                // the batch is asked again one at a time (a name already gone is not found).
            }
            let singles: Vec<(String, Result<()>)> = futures::stream::iter(chunk)
                .map(|name| async move {
                    let outcome = answered(self.client.delete(&object_path(name))).await;
                    (name.clone(), gone(name, outcome.err()))
                })
                .buffered(SINGLE_DELETES_IN_FLIGHT)
                .collect()
                .await;
            outcomes.extend(singles);
        }
        outcomes
    }

    /// Reads the object at `path` whole, as it is stored (no checksum is looked for).
    pub async fn read_object(&self, path: &Path) -> Result<Bytes> {
        let got = answered(self.client.get(path))
            .await
            .map_err(|e| op_error("read", path, &e))?;
        answered(got.bytes())
            .await
            .map_err(|e| op_error("read", path, &e))
    }

    /// Writes `body` at `path` as it is (overwriting; no checksum is recorded).
    pub async fn write_object(&self, path: &Path, body: Bytes) -> Result<()> {
        answered(self.client.put(path, PutPayload::from_bytes(body)))
            .await
            .map(|_| ())
            .map_err(|e| op_error("write", path, &e))
    }
}
