//! What a job is, as a caller sees it: its kind, its keys and the one result it yields.

use std::sync::Arc;

use crate::error::{Error, Result, Status};

/// Most keys one job may carry.
pub const MAX_KEYS_PER_JOB: usize = 1 << 20;

/// Direction of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobKind {
    /// Host pool to store.
    Store = 0,
    /// Store to host pool.
    Load = 1,
}

/// The keys of one job, stored back to back (every key has the same length).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyBatch {
    bytes: Arc<[u8]>,
    key_len: usize,
}

impl KeyBatch {
    /// `bytes` holds `bytes.len() / key_len` keys of `key_len` bytes each.
    pub fn new(bytes: &[u8], key_len: usize) -> Result<Self> {
        if key_len == 0 || !bytes.len().is_multiple_of(key_len) {
            return Err(Error::invalid(format!(
                "{} key bytes do not divide into keys of {key_len} bytes",
                bytes.len()
            )));
        }
        Ok(KeyBatch {
            bytes: bytes.into(),
            key_len,
        })
    }

    pub fn from_keys<K: AsRef<[u8]>>(keys: &[K]) -> Result<Self> {
        let key_len = keys.first().map(|k| k.as_ref().len()).unwrap_or(1);
        let mut bytes = Vec::with_capacity(key_len * keys.len());
        for k in keys {
            if k.as_ref().len() != key_len {
                return Err(Error::invalid(
                    "all keys of a job must have the same length",
                ));
            }
            bytes.extend_from_slice(k.as_ref());
        }
        Self::new(&bytes, key_len)
    }

    /// A batch of no keys (a job rejected before its keys could be read).
    pub(crate) fn empty() -> Self {
        KeyBatch {
            bytes: Arc::from(&[][..]),
            key_len: 1,
        }
    }

    pub fn len(&self) -> usize {
        self.bytes.len() / self.key_len
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn key_len(&self) -> usize {
        self.key_len
    }

    pub fn get(&self, i: usize) -> &[u8] {
        &self.bytes[i * self.key_len..(i + 1) * self.key_len]
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.bytes.chunks_exact(self.key_len)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The one result of a submitted job.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct JobResult {
    pub job_id: u64,
    pub kind: JobKind,
    /// `Ok` only if every key succeeded; otherwise the first failing key's status.
    pub status: Status,
    /// Bytes moved by the keys that succeeded.
    pub bytes: u64,
    /// Seconds from submission to completion.
    pub seconds: f64,
    /// Outcome of each key, in submission order.
    pub key_status: Vec<Status>,
    /// The job's keys, in submission order.
    pub keys: KeyBatch,
    /// Why the job failed; empty on success.
    pub message: String,
}

impl JobResult {
    pub fn succeeded(&self) -> bool {
        self.status.is_ok()
    }

    /// Keys whose own outcome is `Ok`.
    pub fn successful_keys(&self) -> impl Iterator<Item = &[u8]> {
        self.keys
            .iter()
            .zip(&self.key_status)
            .filter(|(_, s)| s.is_ok())
            .map(|(k, _)| k)
    }
}
