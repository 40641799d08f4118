//! The read path: an object's body into the block (the direct path, or the general client
//! streaming into it), its checksum computed as the bytes land.

use super::*;

/// What a block read found, beside the bytes now in the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadBlock {
    /// The checksum recorded with the object, if any.
    pub(crate) recorded: Option<u32>,
    /// The checksum of the bytes read, when asked for.
    pub(crate) computed: Option<u32>,
}

impl Store {
    /// Reads the object at `path` into `slot`, which it must fill exactly. `checksum`
    /// computes the CRC32C of the bytes read; `allow_direct` lets a plain-http S3 endpoint
    /// answer on the direct path (falling back to the client on anything unexpected), which
    /// reads the object whole or in ranged parts as the link and `lane` (the transfer lane
    /// as the transfer found it) make it worth (`load_part_bytes`, `link.rs`).
    /// On error the slot may hold partial data.
    pub(crate) async fn read_block(
        &self,
        path: &Path,
        slot: &mut BlockSlot,
        checksum: bool,
        allow_direct: bool,
        lane: Lane,
    ) -> Result<ReadBlock> {
        if let Backend::Local { files } = &self.backend {
            let (files, name, mut dest) = (files.clone(), path.to_string(), slot.reborrow());
            // The slot is used by the blocking task alone until it is awaited here.
            return tokio::task::spawn_blocking(move || files.read(&name, &mut dest, checksum))
                .await
                .map_err(|e| Error::join(&format!("load {path}"), &e))?;
        }
        let read = self.read_block_remotely(path, slot, checksum, allow_direct, lane);
        budget::within(self.retry.budget, read).await
    }

    async fn read_block_remotely(
        &self,
        path: &Path,
        slot: &mut BlockSlot,
        checksum: bool,
        allow_direct: bool,
        lane: Lane,
    ) -> Result<ReadBlock> {
        if let (Some(direct), true) = (&self.direct, allow_direct) {
            self.direct_requests.fetch_add(1, Ordering::Relaxed);
            let block_bytes = slot.len();
            match direct
                .get_into(path.as_ref(), slot, checksum, &self.link, lane)
                .await
            {
                Ok((recorded, computed)) => {
                    return Ok(ReadBlock {
                        recorded,
                        computed: checksum.then_some(computed),
                    })
                }
                Err(DirectError::Final(status, detail)) => {
                    return Err(Error::new(status, format!("load {path}: {detail}")))
                }
                Err(DirectError::WrongLength(size)) => {
                    return Err(length_mismatch(path, size, block_bytes))
                }
                Err(DirectError::Fallback(why)) => {
                    self.direct_fallbacks.fetch_add(1, Ordering::Relaxed);
                    log::debug!("load {path}: direct GET failed ({why}); repeating it through the store client");
                }
            }
        }
        self.read_block_through_client(path, slot, checksum).await
    }

    async fn read_block_through_client(
        &self,
        path: &Path,
        slot: &mut BlockSlot,
        checksum: bool,
    ) -> Result<ReadBlock> {
        let block_bytes = slot.len();
        // The whole object, without Range: servers that ignore Range answer 200 either way,
        // and the size in the answer's head settles the length before any byte is read.
        let got = answered(self.client.get_opts(path, GetOptions::default()))
            .await
            .map_err(|e| op_error("load", path, &e))?;
        if got.meta.size != block_bytes as u64 {
            return Err(length_mismatch(path, got.meta.size, block_bytes));
        }
        let read = read_body("load", path, got, Sink::Block(slot.reborrow()), checksum).await?;
        if read.bytes != block_bytes as u64 {
            return Err(length_mismatch(path, read.bytes, block_bytes));
        }
        Ok(ReadBlock {
            recorded: read.recorded,
            computed: checksum.then_some(read.computed),
        })
    }
}

/// Where the bytes of an object's body go as they are read.
pub(super) enum Sink {
    /// Into the block, which is never written past its end. (For a blocking thread: the
    /// caller awaits [`read_body`] before it uses the slot again.)
    Block(BlockSlot),
    /// Nowhere: the bytes are only counted and checksummed.
    Count,
}

/// What [`read_body`] read.
pub(super) struct BodyRead {
    /// Bytes read (for a block: at most its length, or one piece past it when the body
    /// is longer).
    pub(super) bytes: u64,
    /// The checksum recorded with the object, if any.
    pub(super) recorded: Option<u32>,
    /// The CRC32C of the bytes read, if asked for (else 0).
    pub(super) computed: u32,
}

/// Reads an object's body, a local file or an HTTP stream, into `sink`, with the CRC32C
/// of each piece computed while it is still in cache (when `checksum`). The one read
/// loop of loads through the store client and of `check_object`.
pub(super) async fn read_body(
    what: &str,
    path: &Path,
    got: GetResult,
    sink: Sink,
    checksum: bool,
) -> Result<BodyRead> {
    /// Bytes read from a local file at a time when they go nowhere.
    const FILE_PIECE: usize = 1 << 20;
    match got.payload {
        GetResultPayload::File(file, _) => {
            let read = tokio::task::spawn_blocking(move || {
                use std::os::unix::fs::FileExt;
                let recorded = integrity::file_checksum(&file);
                let (mut sink, mut scratch) = match sink {
                    Sink::Block(slot) => (Some(slot), Vec::new()),
                    Sink::Count => (None, vec![0u8; FILE_PIECE]),
                };
                let (mut bytes, mut crc) = (0u64, 0u32);
                loop {
                    let buf = match &mut sink {
                        // A block is read up to its end: the caller settled the length.
                        Some(slot) => match slot.rest_at(bytes as usize, usize::MAX) {
                            [] => break,
                            rest => rest,
                        },
                        None => &mut scratch[..],
                    };
                    match file.read_at(buf, bytes) {
                        Ok(0) => break,
                        Ok(n) => {
                            if checksum {
                                crc = integrity::checksum_append(crc, &buf[..n]);
                            }
                            bytes += n as u64;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(BodyRead {
                    bytes,
                    recorded,
                    computed: crc,
                })
            })
            .await
            .map_err(|e| Error::join(&format!("{what} {path}"), &e))?;
            read.map_err(|e| Error::new(Status::Io, format!("{what} {path}: {e}")))
        }
        GetResultPayload::Stream(mut stream) => {
            use futures::StreamExt;
            let recorded = integrity::recorded_checksum(&got.attributes);
            let mut sink = sink;
            let (mut bytes, mut crc) = (0u64, 0u32);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| op_error(what, path, &Failed::unanswered(e)))?;
                if let Sink::Block(slot) = &mut sink {
                    if !slot.write_at(bytes as usize, &chunk) {
                        // Longer than the block: report how far the body went.
                        return Ok(BodyRead {
                            bytes: bytes + chunk.len() as u64,
                            recorded,
                            computed: crc,
                        });
                    }
                }
                if checksum {
                    crc = integrity::checksum_append(crc, &chunk);
                }
                bytes += chunk.len() as u64;
            }
            Ok(BodyRead {
                bytes,
                recorded,
                computed: crc,
            })
        }
    }
}

fn length_mismatch(path: &Path, got: u64, want: usize) -> Error {
    Error::new(
        Status::LengthMismatch,
        format!("load {path}: object holds {got} bytes but blocks are {want} bytes"),
    )
}
