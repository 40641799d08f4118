//! Encryption at rest: every block sealed with AES-256-GCM under a key of the tier's
//! keyring, bound to its object's name ([`format`]); keyrings and where they come from
//! ([`keyring`]).
//!
//! The AEAD's tags, not the CRC32C, are what prove an encrypted block's bytes: a load that
//! opens is the block that was sealed under that name. The CRC32C is still recorded and
//! checked over the object's bytes as stored, where it tells damage in transit (read
//! again) from an object that does not open (never read again, never deleted: the tier
//! may merely lack its key).

pub(crate) mod format;
pub(crate) mod keyring;

use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;

use crate::config::{EncryptionConfig, TierConfig};
use crate::error::{Error, Result};
use crate::memory::{BlockMemory, BlockSlot};
pub(crate) use format::{sealed_len, OpenError, HEADER_BYTES, TAG_BYTES};
use keyring::{CommandStop, KeySource, Keyring};

/// A tier's encryption: its keyring (re-read every `refresh_s` where the source can
/// change) and the source it comes from.
pub(crate) struct Encryption {
    source: KeySource,
    keyring: RwLock<Arc<Keyring>>,
    refresh: Option<Duration>,
    spares: Arc<Spares>,
    /// Ends a refresh's keyring command at shutdown.
    command_stop: CommandStop,
}

impl std::fmt::Debug for Encryption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encryption")
            .field("source", &self.source)
            .field("keyring", &self.keyring())
            .field("refresh", &self.refresh)
            .finish_non_exhaustive()
    }
}

/// Parses and checks a tier configuration as `Tier::new` does before it opens the store:
/// the JSON, its keys and their limits ([`TierConfig::from_json`]), and with encryption on,
/// the keyring read and parsed from its source as the tier's start reads it (the same
/// reads, bounds and messages). What `kvt_config_check` and `kvtier config check` answer;
/// the store is neither opened nor probed.
pub fn check_config(json: &str) -> Result<TierConfig> {
    let config = TierConfig::from_json(json)?;
    if let Some(encryption) = &config.encryption {
        read_keyring(encryption)?;
    }
    Ok(config)
}

/// The keyring the configuration names, and its source; a configuration error if it
/// cannot be read.
fn read_keyring(config: &EncryptionConfig) -> Result<(KeySource, Keyring)> {
    let source = if let Some(path) = &config.keyring_file {
        KeySource::File(path.clone())
    } else if let Some(name) = &config.keyring_env {
        KeySource::Env(name.clone())
    } else if let Some(argv) = &config.keyring_command {
        KeySource::Command(argv.clone())
    } else {
        return Err(Error::config(
            "encryption needs exactly one of keyring_file, keyring_env and keyring_command",
        ));
    };
    let keyring = source
        .load()
        .map_err(|e| Error::config(format!("encryption: {e}")))?;
    Ok((source, keyring))
}

impl Encryption {
    /// Reads the keyring the configuration names; a configuration error if it cannot.
    pub(crate) fn open(config: &EncryptionConfig) -> Result<Encryption> {
        let (source, keyring) = read_keyring(config)?;
        log::info!(
            "encryption at rest: {} keys from the {}, writing with {:?}",
            keyring.ids().len(),
            source.describe(),
            keyring.write_key().0
        );
        let refresh = (config.refresh_s > 0 && source.can_change())
            .then(|| Duration::from_secs(config.refresh_s));
        Ok(Encryption {
            source,
            keyring: RwLock::new(Arc::new(keyring)),
            refresh,
            spares: Arc::default(),
            command_stop: CommandStop::default(),
        })
    }

    /// The keyring as it is now.
    pub(crate) fn keyring(&self) -> Arc<Keyring> {
        self.keyring
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How often [`refresh`](Self::refresh) should run, if at all.
    pub(crate) fn refresh_interval(&self) -> Option<Duration> {
        self.refresh
    }

    /// Reads the keyring again; a failure keeps the one the tier has. Blocking (a file
    /// read or a command): run it off the I/O threads.
    pub(crate) fn refresh(&self) {
        match self.source.load_unless_stopped(&self.command_stop) {
            Ok(keyring) => {
                let old = self.keyring();
                if old.ids() != keyring.ids() || old.write_key().0 != keyring.write_key().0 {
                    log::info!(
                        "encryption: keyring from the {} now has keys {:?}, writing with {:?}",
                        self.source.describe(),
                        keyring.ids(),
                        keyring.write_key().0
                    );
                }
                *self.keyring.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keyring);
            }
            Err(e) => log::warn!("encryption: keeping the keyring the tier has: {e}"),
        }
    }

    /// Ends a refresh's keyring command if one runs, and every later one as it starts (the
    /// tier shuts down).
    pub(crate) fn stop_refreshing(&self) {
        self.command_stop.stop();
    }

    /// Seals a block held by a store job into the object to upload under `name`, in a
    /// buffer that returns to the tier's spares when the upload drops it.
    /// Fails (`Status::Io`) only when the system's random source does.
    pub(crate) fn seal(&self, name: &str, block: &BlockMemory) -> Result<Bytes> {
        let mut buffer = self.spares.take(sealed_len(block.len()));
        format::seal_into(&self.keyring(), name, &HeldBlock(block), &mut buffer)?;
        Ok(Bytes::from_owner(Spare {
            buffer,
            spares: Arc::downgrade(&self.spares),
        }))
    }

    /// Opens, in place, a block whose object's header and tags were read beside it.
    pub(crate) fn open_block(
        &self,
        name: &str,
        header: &[u8; HEADER_BYTES],
        tags: &[u8],
        block: &mut BlockSlot,
    ) -> std::result::Result<(), OpenError> {
        format::open(&self.keyring(), name, header, tags, block).map(|_| ())
    }
}

/// Sealed-object buffers the uploads are done with, kept for the next stores: a fresh
/// allocation of a block's size costs a page fault a page on first write, which at 2 MiB
/// blocks is a third of the cost of sealing.
#[derive(Default)]
struct Spares(Mutex<Vec<Vec<u8>>>);

/// Spare buffers kept at most.
const MAX_SPARES: usize = 16;

impl Spares {
    /// A buffer of `len` bytes: a spare of that length, or a new one.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut spares = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match spares.iter().position(|b| b.len() == len) {
            Some(i) => spares.swap_remove(i),
            None => vec![0u8; len],
        }
    }

    fn give_back(&self, buffer: Vec<u8>) {
        let mut spares = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if spares.len() < MAX_SPARES {
            spares.push(buffer);
        }
    }
}

/// A sealed object being uploaded; its buffer goes back to the spares when dropped.
struct Spare {
    buffer: Vec<u8>,
    spares: Weak<Spares>,
}

impl AsRef<[u8]> for Spare {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        if let Some(spares) = self.spares.upgrade() {
            spares.give_back(std::mem::take(&mut self.buffer));
        }
    }
}

/// Whether `object_start`, an object's first bytes (at least [`HEADER_BYTES`] of them),
/// is an encrypted object's header: the format's magic and a key id. Such an object can
/// be judged only with the keyring: its bytes and length are not the block's.
pub fn is_encrypted_object(object_start: &[u8]) -> bool {
    format::header_key_id(object_start).is_ok()
}

/// The length of the block an encrypted object of `object_len` bytes holds, if an
/// encrypted object can have that length.
pub fn encrypted_block_len(object_len: u64) -> Option<u64> {
    let len = usize::try_from(object_len).ok()?;
    format::block_len(len).map(|len| len as u64)
}

/// The length of the encrypted object that holds a block of `block_len` bytes: the
/// block's and the format's overhead.
pub fn encrypted_object_len(block_len: u64) -> u64 {
    let segments = block_len.div_ceil(format::SEGMENT_BYTES as u64).max(1);
    HEADER_BYTES as u64 + block_len + TAG_BYTES as u64 * segments
}

/// Opens encrypted objects outside a tier, with the keyring an `encryption` configuration
/// names: what `kvtier verify` checks them with.
#[derive(Debug)]
pub struct ObjectOpener {
    encryption: Encryption,
}

impl ObjectOpener {
    /// Reads the keyring the configuration names (a configuration error if it cannot).
    pub fn new(config: &EncryptionConfig) -> Result<ObjectOpener> {
        Ok(ObjectOpener {
            encryption: Encryption::open(config)?,
        })
    }

    /// Opens `object`, the whole object stored under `name`, decrypting its body in place:
    /// the block's length, or why it does not open (never with key material).
    pub fn open(&self, name: &str, object: &mut [u8]) -> std::result::Result<usize, String> {
        let len = format::block_len(object.len()).ok_or_else(|| {
            format!(
                "its length, {} bytes, is no encrypted block's",
                object.len()
            )
        })?;
        let (header, rest) = object.split_at_mut(HEADER_BYTES);
        let header: &[u8; HEADER_BYTES] = (&*header).try_into().expect("the header's length");
        let (body, tags) = rest.split_at_mut(len);
        format::open(
            &self.encryption.keyring(),
            name,
            header,
            tags,
            &mut format::Pieces(vec![body]),
        )
        .map(|_| len)
        .map_err(|e| e.to_string())
    }
}

/// A block a store job holds: read only, for as long as the job runs.
struct HeldBlock<'a>(&'a BlockMemory);

impl HeldBlock<'_> {
    /// The piece holding byte `at`, and where in it.
    fn locate(&self, at: usize) -> Option<(&[u8], usize)> {
        let mut start = 0;
        for piece in self.0.pieces() {
            if at < start + piece.len {
                // SAFETY: the memory was checked against its pool or region at submit,
                // and the store job that holds it reads it until its result is polled;
                // no load may write it meanwhile (JobTable::hold).
                let bytes =
                    unsafe { std::slice::from_raw_parts(piece.addr as *const u8, piece.len) };
                return Some((bytes, at - start));
            }
            start += piece.len;
        }
        None
    }
}

impl format::Plaintext for HeldBlock<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn copy_to(&self, mut at: usize, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            let (piece, skip) = self.locate(at).expect("within the block");
            let n = (piece.len() - skip).min(out.len() - done);
            out[done..done + n].copy_from_slice(&piece[skip..skip + n]);
            done += n;
            at += n;
        }
    }

    fn contiguous(&self, at: usize, len: usize) -> Option<&[u8]> {
        let (piece, skip) = self.locate(at)?;
        (piece.len() - skip >= len).then(|| &piece[skip..skip + len])
    }
}

impl format::Ciphertext for BlockSlot {
    fn len(&self) -> usize {
        BlockSlot::len(self)
    }

    fn contiguous_mut(&mut self, at: usize, len: usize) -> Option<&mut [u8]> {
        let bytes = self.rest_at(at, len);
        (bytes.len() == len).then_some(bytes)
    }

    fn copy_to(&mut self, mut at: usize, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            let bytes = self.rest_at(at, out.len() - done);
            let n = bytes.len();
            assert!(n > 0, "read past the end of the block");
            out[done..done + n].copy_from_slice(bytes);
            done += n;
            at += n;
        }
    }

    fn copy_from(&mut self, at: usize, data: &[u8]) {
        assert!(self.write_at(at, data), "write past the end of the block");
    }
}

#[cfg(test)]
mod length_tests {
    #[test]
    fn object_and_block_lengths_are_inverse_and_the_format_s() {
        for len in [0u64, 1, 4096, 65_535, 65_536, 65_537, 100_000, 2 << 20] {
            let object = super::encrypted_object_len(len);
            assert_eq!(object, super::sealed_len(len as usize) as u64, "{len}");
            assert_eq!(super::encrypted_block_len(object), Some(len), "{len}");
        }
        assert_eq!(super::encrypted_block_len(10), None);
        let header = super::format::new_header(&super::keyring::KeyId::new("v1").unwrap()).unwrap();
        assert!(super::is_encrypted_object(&header));
        assert!(!super::is_encrypted_object(&[0u8; super::HEADER_BYTES]));
        assert!(!super::is_encrypted_object(b"KVTENC01"));
    }
}
