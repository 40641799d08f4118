//! The layout of an encrypted block object, and sealing and opening it.
//!
//! ```text
//! header   64 bytes   magic "KVTENC01" (8) | key id, zero-padded (24) | salt (32)
//! body     n bytes    the block's bytes, encrypted, in segments of 64 KiB (the last shorter)
//! tags     16 bytes a segment, in segment order
//! ```
//!
//! Each object has a key of its own, derived from the keyring's key and the object's
//! random salt (HKDF-SHA256), so nonces are a segment counter and can never repeat under
//! one key however many objects a keyring key writes. Each segment is sealed with
//! AES-256-GCM; its associated data is the object's full name, the block's length, the
//! segment's index and the header, so a segment moved within the object, an object cut
//! short or grown, and an object copied under another name all fail to open.
//!
//! Segments let both directions work piece by piece while the bytes are in cache, from and
//! into the caller's memory: a store encrypts each segment straight from the block into the
//! request body, and a load lands the body in the block and decrypts each segment in place.
//! The overhead is fixed for a block length: 64 bytes and 16 per 64 KiB (0.03% of a 2 MiB
//! block).

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::hkdf;

use crate::error::{Error, Status};

use super::keyring::{KeyId, Keyring, Secret, KEY_BYTES, KEY_ID_MAX};

/// The first bytes of every encrypted object (the format's version is its last two).
pub(crate) const MAGIC: &[u8; 8] = b"KVTENC01";
pub(crate) const SALT_BYTES: usize = 32;
pub(crate) const HEADER_BYTES: usize = MAGIC.len() + KEY_ID_MAX + SALT_BYTES;
pub(crate) const SEGMENT_BYTES: usize = 64 * 1024;
pub(crate) const TAG_BYTES: usize = 16;
const OBJECT_KEY_INFO: &[u8] = b"kvtier object key v1";

/// Segments of a block of `len` bytes: at least one, so that an empty block still carries
/// a tag.
pub(crate) fn segments(len: usize) -> usize {
    len.div_ceil(SEGMENT_BYTES).max(1)
}

/// Bytes of the object that holds a block of `len` bytes.
pub(crate) fn sealed_len(len: usize) -> usize {
    HEADER_BYTES + len + TAG_BYTES * segments(len)
}

/// The block's length held by an object of `len` bytes, if an object can have that length.
pub(crate) fn block_len(object_len: usize) -> Option<usize> {
    let rest = object_len.checked_sub(HEADER_BYTES)?;
    // `rest` is the block plus a tag a segment; the number of segments is within one of
    // this estimate.
    let estimate = rest.div_ceil(SEGMENT_BYTES + TAG_BYTES).max(1);
    (estimate.saturating_sub(1).max(1)..=estimate + 1).find_map(|count| {
        let len = rest.checked_sub(TAG_BYTES * count)?;
        (segments(len) == count).then_some(len)
    })
}

/// Why an object did not open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OpenError {
    /// The object does not start with the format's magic: not an encrypted object (or
    /// one of a format this version does not read).
    NotEncrypted,
    /// Its key id is not in the keyring.
    UnknownKey(String),
    /// A segment failed its authentication tag: tampered with, copied under another name,
    /// or damaged.
    TagMismatch,
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::NotEncrypted => f.write_str("it is not an encrypted object"),
            OpenError::UnknownKey(id) => write!(f, "its key {id:?} is not in the keyring"),
            OpenError::TagMismatch => f.write_str(
                "it failed authentication (tampered with, copied under another name, or \
                 sealed with another key of the same id)",
            ),
        }
    }
}

/// A header for a new object under the keyring's write key, with a fresh salt. Fails
/// (`Status::Io`) when the system's random source does: an environment failure, reported as
/// the store's error, never a panic.
pub(crate) fn new_header(id: &KeyId) -> Result<[u8; HEADER_BYTES], Error> {
    let mut header = [0u8; HEADER_BYTES];
    header[..MAGIC.len()].copy_from_slice(MAGIC);
    header[MAGIC.len()..MAGIC.len() + KEY_ID_MAX].copy_from_slice(&id.padded());
    aws_lc_rs::rand::fill(&mut header[MAGIC.len() + KEY_ID_MAX..]).map_err(|_| {
        Error::new(
            Status::Io,
            "encryption: the system's random source failed; the block was not stored",
        )
    })?;
    Ok(header)
}

/// The key id a header names, if it is a header of this format.
pub(crate) fn header_key_id(header: &[u8]) -> Result<KeyId, OpenError> {
    if header.len() < HEADER_BYTES || &header[..MAGIC.len()] != MAGIC {
        return Err(OpenError::NotEncrypted);
    }
    let padded = &header[MAGIC.len()..MAGIC.len() + KEY_ID_MAX];
    KeyId::from_padded(padded).ok_or(OpenError::NotEncrypted)
}

/// The AES-256-GCM key of one object: HKDF-SHA256 of the keyring key with its salt.
fn object_key(master: &[u8; KEY_BYTES], header: &[u8; HEADER_BYTES]) -> LessSafeKey {
    let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, &header[MAGIC.len() + KEY_ID_MAX..]);
    // Zeroed when dropped, as the keyring's keys are.
    let mut key = Secret([0u8; KEY_BYTES]);
    salt.extract(master)
        .expand(&[OBJECT_KEY_INFO], &AES_256_GCM)
        .and_then(|okm| okm.fill(&mut key.0))
        .expect("HKDF output of an AEAD key's length");
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key.0).expect("a 32-byte key"))
}

/// The associated data of each segment: the name, the block's length, the header, and
/// (last) the segment's index, which [`Aad::set_segment`] rewrites.
struct SegmentAad(Vec<u8>);

impl SegmentAad {
    fn new(name: &str, block_len: usize, header: &[u8; HEADER_BYTES]) -> Self {
        let mut aad = Vec::with_capacity(8 + name.len() + 8 + HEADER_BYTES + 8);
        aad.extend_from_slice(&(name.len() as u64).to_be_bytes());
        aad.extend_from_slice(name.as_bytes());
        aad.extend_from_slice(&(block_len as u64).to_be_bytes());
        aad.extend_from_slice(header);
        aad.extend_from_slice(&0u64.to_be_bytes());
        SegmentAad(aad)
    }

    fn for_segment(&mut self, index: usize) -> Aad<&[u8]> {
        let at = self.0.len() - 8;
        self.0[at..].copy_from_slice(&(index as u64).to_be_bytes());
        Aad::from(&self.0[..])
    }
}

fn nonce(index: usize) -> Nonce {
    let mut bytes = [0u8; NONCE_LEN];
    bytes[NONCE_LEN - 8..].copy_from_slice(&(index as u64).to_be_bytes());
    Nonce::assume_unique_for_key(bytes)
}

/// The block's bytes, in pieces, as a store reads them.
pub(crate) trait Plaintext {
    fn len(&self) -> usize;
    /// Copies the bytes from `at` into `out` (`out.len()` of them).
    fn copy_to(&self, at: usize, out: &mut [u8]);
    /// The bytes from `at` on, when `len` of them lie in one piece.
    fn contiguous(&self, at: usize, len: usize) -> Option<&[u8]>;
}

/// Seals a block into a new object under `name` with the keyring's write key.
#[cfg(test)]
pub(crate) fn seal(keyring: &Keyring, name: &str, block: &impl Plaintext) -> Vec<u8> {
    let mut object = vec![0u8; sealed_len(block.len())];
    seal_into(keyring, name, block, &mut object).expect("the random source works in tests");
    object
}

/// Seals a block into `object`, which must be [`sealed_len`] bytes; every byte of it is
/// written. Fails only when the system's random source does.
pub(crate) fn seal_into(
    keyring: &Keyring,
    name: &str,
    block: &impl Plaintext,
    object: &mut [u8],
) -> Result<(), Error> {
    let (id, master) = keyring.write_key();
    let len = block.len();
    assert_eq!(
        object.len(),
        sealed_len(len),
        "an object buffer of the sealed length"
    );
    let header = new_header(id)?;
    let key = object_key(master, &header);
    let mut aad = SegmentAad::new(name, len, &header);
    object[..HEADER_BYTES].copy_from_slice(&header);
    let (body, tags) = object[HEADER_BYTES..].split_at_mut(len);
    let mut scratch = Vec::new();
    for (index, tag) in tags.chunks_exact_mut(TAG_BYTES).enumerate() {
        let at = index * SEGMENT_BYTES;
        let n = SEGMENT_BYTES.min(len - at);
        let plain = match block.contiguous(at, n) {
            Some(plain) => plain,
            None => {
                scratch.resize(n, 0);
                block.copy_to(at, &mut scratch);
                &scratch[..]
            }
        };
        key.seal_out_of_place_scatter(
            nonce(index),
            aad.for_segment(index),
            plain,
            &mut body[at..at + n],
            &[],
            tag,
        )
        .expect("buffers of the segment's length");
    }
    Ok(())
}

/// The object's bytes after the header, landed in caller memory, as a load opens them.
pub(crate) trait Ciphertext {
    fn len(&self) -> usize;
    /// The bytes from `at`, when `len` of them lie in one piece.
    fn contiguous_mut(&mut self, at: usize, len: usize) -> Option<&mut [u8]>;
    fn copy_to(&mut self, at: usize, out: &mut [u8]);
    fn copy_from(&mut self, at: usize, data: &[u8]);
}

/// Opens an object whose header and tags were read into `header` and `tags` and whose
/// body is in `block`, decrypting the body in place. On an error the block holds
/// unspecified bytes.
pub(crate) fn open(
    keyring: &Keyring,
    name: &str,
    header: &[u8; HEADER_BYTES],
    tags: &[u8],
    block: &mut impl Ciphertext,
) -> Result<KeyId, OpenError> {
    let id = header_key_id(header)?;
    let master = keyring
        .key(&id)
        .ok_or_else(|| OpenError::UnknownKey(id.as_str().to_string()))?;
    let len = block.len();
    if tags.len() != TAG_BYTES * segments(len) {
        return Err(OpenError::TagMismatch);
    }
    let key = object_key(master, header);
    let mut aad = SegmentAad::new(name, len, header);
    let mut scratch = Vec::new();
    for (index, tag) in tags.chunks_exact(TAG_BYTES).enumerate() {
        let at = index * SEGMENT_BYTES;
        let n = SEGMENT_BYTES.min(len - at);
        let opened = match block.contiguous_mut(at, n) {
            Some(bytes) => key
                .open_in_place_separate_tag(nonce(index), aad.for_segment(index), tag, bytes)
                .is_ok(),
            None => {
                scratch.resize(n, 0);
                block.copy_to(at, &mut scratch);
                let ok = key
                    .open_in_place_separate_tag(
                        nonce(index),
                        aad.for_segment(index),
                        tag,
                        &mut scratch,
                    )
                    .is_ok();
                if ok {
                    block.copy_from(at, &scratch);
                }
                ok
            }
        };
        if !opened {
            return Err(OpenError::TagMismatch);
        }
    }
    Ok(id)
}

/// Plain slices as a block (a whole object read into memory, and tests).
pub(crate) struct Pieces<'a>(pub(crate) Vec<&'a mut [u8]>);

impl Pieces<'_> {
    fn locate(&self, at: usize) -> (usize, usize) {
        let mut start = 0;
        for (i, piece) in self.0.iter().enumerate() {
            if at < start + piece.len() {
                return (i, at - start);
            }
            start += piece.len();
        }
        (self.0.len(), 0)
    }
}

impl Plaintext for Pieces<'_> {
    fn len(&self) -> usize {
        self.0.iter().map(|p| p.len()).sum()
    }
    fn copy_to(&self, mut at: usize, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            let (i, skip) = self.locate(at);
            let n = (self.0[i].len() - skip).min(out.len() - done);
            out[done..done + n].copy_from_slice(&self.0[i][skip..skip + n]);
            done += n;
            at += n;
        }
    }
    fn contiguous(&self, at: usize, len: usize) -> Option<&[u8]> {
        let (i, skip) = self.locate(at);
        let piece = self.0.get(i)?;
        (piece.len() - skip >= len).then(|| &piece[skip..skip + len])
    }
}

impl Ciphertext for Pieces<'_> {
    fn len(&self) -> usize {
        Plaintext::len(self)
    }
    fn contiguous_mut(&mut self, at: usize, len: usize) -> Option<&mut [u8]> {
        let (i, skip) = self.locate(at);
        let piece = self.0.get_mut(i)?;
        (piece.len() - skip >= len).then(move || &mut piece[skip..skip + len])
    }
    fn copy_to(&mut self, at: usize, out: &mut [u8]) {
        Plaintext::copy_to(self, at, out)
    }
    fn copy_from(&mut self, mut at: usize, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let (i, skip) = self.locate(at);
            let n = (self.0[i].len() - skip).min(data.len() - done);
            self.0[i][skip..skip + n].copy_from_slice(&data[done..done + n]);
            done += n;
            at += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(text: &str) -> Keyring {
        Keyring::parse(text.as_bytes()).unwrap()
    }

    fn two_keys() -> Keyring {
        ring(
            r#"{"write": "b", "keys": {"a": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", "b": "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="}}"#,
        )
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Splits a whole object into header, body and tags, and opens the body in `cuts`
    /// pieces.
    fn open_object(
        keyring: &Keyring,
        name: &str,
        object: &[u8],
        cuts: &[usize],
    ) -> Result<Vec<u8>, OpenError> {
        let len = block_len(object.len()).expect("an object length of the format");
        let header: [u8; HEADER_BYTES] = object[..HEADER_BYTES].try_into().unwrap();
        let mut body = object[HEADER_BYTES..HEADER_BYTES + len].to_vec();
        let tags = &object[HEADER_BYTES + len..];
        let mut pieces = Vec::new();
        let mut rest = &mut body[..];
        let mut last = 0;
        for &cut in cuts {
            let (piece, tail) = rest.split_at_mut(cut - last);
            pieces.push(piece);
            rest = tail;
            last = cut;
        }
        pieces.push(rest);
        open(keyring, name, &header, tags, &mut Pieces(pieces))?;
        Ok(body)
    }

    #[test]
    fn lengths_round_trip() {
        for len in [
            0,
            1,
            15,
            16,
            17,
            SEGMENT_BYTES - 1,
            SEGMENT_BYTES,
            SEGMENT_BYTES + 1,
            2 << 20,
            (2 << 20) + 5,
        ] {
            let object = sealed_len(len);
            assert_eq!(block_len(object), Some(len), "block of {len}");
            assert_eq!(object - len, HEADER_BYTES + TAG_BYTES * segments(len));
        }
        assert_eq!(sealed_len(2 << 20) - (2 << 20), 64 + 32 * 16);
        assert_eq!(block_len(HEADER_BYTES), None);
        assert_eq!(
            block_len(HEADER_BYTES + SEGMENT_BYTES + TAG_BYTES + 3),
            None
        );
        assert_eq!(block_len(3), None);
    }

    #[test]
    fn round_trips_contiguous_and_in_pieces() {
        let keyring = two_keys();
        for len in [0, 1, 1000, SEGMENT_BYTES, 3 * SEGMENT_BYTES + 77] {
            let mut block = pattern(len, 7);
            let original = block.clone();
            let object = seal(&keyring, "ns/abc", &Pieces(vec![&mut block[..]]));
            assert_eq!(object.len(), sealed_len(len));
            assert_eq!(header_key_id(&object).unwrap().as_str(), "b");
            if len > 64 {
                assert_ne!(&object[HEADER_BYTES..HEADER_BYTES + 64], &original[..64]);
            }
            assert_eq!(
                open_object(&keyring, "ns/abc", &object, &[]).unwrap(),
                original
            );
            if len > 10 {
                // Pieces that cut segments anywhere open the same bytes.
                let cuts = [1, len / 3, len / 3 + 1, len - 2];
                assert_eq!(
                    open_object(&keyring, "ns/abc", &object, &cuts).unwrap(),
                    original
                );
                // ...and seal from pieces to an object that opens whole.
                let mut block = original.clone();
                let (a, rest) = block.split_at_mut(len / 3);
                let (b, c) = rest.split_at_mut(1);
                let object = seal(&keyring, "ns/abc", &Pieces(vec![a, b, c]));
                assert_eq!(
                    open_object(&keyring, "ns/abc", &object, &[]).unwrap(),
                    original
                );
            }
        }
    }

    #[test]
    fn the_same_block_never_seals_to_the_same_bytes() {
        let keyring = two_keys();
        let mut block = pattern(5000, 1);
        let a = seal(&keyring, "n", &Pieces(vec![&mut block[..]]));
        let b = seal(&keyring, "n", &Pieces(vec![&mut block[..]]));
        assert_ne!(a[HEADER_BYTES..], b[HEADER_BYTES..]);
    }

    #[test]
    fn any_change_fails_to_open() {
        let keyring = two_keys();
        let len = 2 * SEGMENT_BYTES + 100;
        let mut block = pattern(len, 3);
        let object = seal(&keyring, "prefix/ns/key", &Pieces(vec![&mut block[..]]));
        // Another name: the object copied under another key's name.
        assert_eq!(
            open_object(&keyring, "prefix/ns/kez", &object, &[]),
            Err(OpenError::TagMismatch)
        );
        // A flipped bit anywhere after the magic and key id: salt, body, tags.
        for at in [
            HEADER_BYTES - 1,
            HEADER_BYTES,
            HEADER_BYTES + SEGMENT_BYTES + 5,
            object.len() - 1,
        ] {
            let mut bad = object.clone();
            bad[at] ^= 0x10;
            assert_eq!(
                open_object(&keyring, "prefix/ns/key", &bad, &[]),
                Err(OpenError::TagMismatch),
                "byte {at}"
            );
        }
        // Two segments swapped, with their tags.
        let mut swapped = object.clone();
        let (h, s) = (HEADER_BYTES, SEGMENT_BYTES);
        let first = object[h..h + s].to_vec();
        swapped.copy_within(h + s..h + 2 * s, h);
        swapped[h + s..h + 2 * s].copy_from_slice(&first);
        let tags = h + len;
        swapped.copy_within(tags + TAG_BYTES..tags + 2 * TAG_BYTES, tags);
        swapped[tags + TAG_BYTES..tags + 2 * TAG_BYTES]
            .copy_from_slice(&object[tags..tags + TAG_BYTES]);
        assert_eq!(
            open_object(&keyring, "prefix/ns/key", &swapped, &[]),
            Err(OpenError::TagMismatch)
        );
        // A key id rewritten to the other key of the ring.
        let mut other = object.clone();
        other[MAGIC.len()] = b'a';
        assert_eq!(
            open_object(&keyring, "prefix/ns/key", &other, &[]),
            Err(OpenError::TagMismatch)
        );
        // The last segment and its tag cut off: another block length, other tags.
        let short = [&object[..h + 2 * s], &object[tags..tags + 2 * TAG_BYTES]].concat();
        assert_eq!(
            open_object(&keyring, "prefix/ns/key", &short, &[]),
            Err(OpenError::TagMismatch)
        );
    }

    #[test]
    fn unknown_key_ids_and_plain_objects_are_named() {
        let writer = two_keys();
        let mut block = pattern(100, 9);
        let object = seal(&writer, "n", &Pieces(vec![&mut block[..]]));
        let reader = ring(
            r#"{"write": "a", "keys": {"a": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}}"#,
        );
        assert_eq!(
            open_object(&reader, "n", &object, &[]),
            Err(OpenError::UnknownKey("b".into()))
        );
        let mut plain = object.clone();
        plain[0] = b'x';
        assert_eq!(
            open_object(&writer, "n", &plain, &[]),
            Err(OpenError::NotEncrypted)
        );
    }
}
