//! Key layout: vLLM's OffloadKey and the object name it maps to.
//!
//! A key is the block hash bytes followed by the KV-cache group index as 4 bytes,
//! big-endian. Its object name is
//! `<prefix>/<namespace>/<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin`, with empty
//! segments dropped and no leading slash: the name vLLM's object tier ends up with
//! on the server once the S3 client has collapsed its doubled slashes.

use object_store::path::Path;

use crate::error::{Error, Result};

/// Bytes of the group index at the end of every key.
pub const GROUP_BYTES: usize = 4;
/// Longest block hash accepted (covers every hash vLLM can be configured with).
pub const MAX_HASH_BYTES: usize = 64;
/// Shortest hash accepted: vLLM's `make_offload_key` takes a hash of any length (its own
/// tests use 1-byte hashes); an empty hash has no name in vLLM's layout.
pub const MIN_HASH_BYTES: usize = 1;
/// Shortest key: the shortest hash plus the group index.
pub const MIN_KEY_BYTES: usize = MIN_HASH_BYTES + GROUP_BYTES;
/// Longest key: the longest hash plus the group index.
pub const MAX_KEY_BYTES: usize = MAX_HASH_BYTES + GROUP_BYTES;

/// Checks a key length that came from a caller before any memory is sized by it.
pub fn check_key_len(key_len: usize) -> Result<()> {
    if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&key_len) {
        return Err(Error::invalid(format!(
            "key_len is {key_len}; a key is a {MIN_HASH_BYTES}..={MAX_HASH_BYTES} byte block hash followed by a {GROUP_BYTES}-byte group index ({MIN_KEY_BYTES}..={MAX_KEY_BYTES} bytes)"
        )));
    }
    Ok(())
}

/// Splits a key into (hash, group index).
pub fn split_key(key: &[u8]) -> Result<(&[u8], u32)> {
    if key.len() < MIN_KEY_BYTES || key.len() > MAX_KEY_BYTES {
        return Err(Error::invalid(format!(
            "key is {} bytes; a key is a {}..={} byte block hash followed by a 4-byte group index",
            key.len(),
            MIN_HASH_BYTES,
            MAX_HASH_BYTES
        )));
    }
    let (hash, group) = key.split_at(key.len() - GROUP_BYTES);
    let group = u32::from_be_bytes([group[0], group[1], group[2], group[3]]);
    Ok((hash, group))
}

/// Builds a key from a block hash and group index (the inverse of [`split_key`]).
pub fn make_key(hash: &[u8], group: u32) -> Vec<u8> {
    let mut key = Vec::with_capacity(hash.len() + GROUP_BYTES);
    key.extend_from_slice(hash);
    key.extend_from_slice(&group.to_be_bytes());
    key
}

pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0xf) as usize] as char);
    }
    out
}

/// Maps keys to object names under a fixed prefix and namespace.
#[derive(Debug, Clone)]
pub struct KeyLayout {
    /// `prefix/namespace` with empty segments removed; empty when both are empty.
    base: String,
}

impl KeyLayout {
    pub fn new(prefix: &str, namespace: &str) -> Result<Self> {
        let mut segments = Vec::new();
        for (what, value) in [("prefix", prefix), ("namespace", namespace)] {
            for segment in value.split('/').filter(|s| !s.is_empty()) {
                validate_segment(what, segment)?;
                segments.push(segment);
            }
        }
        Ok(KeyLayout {
            base: segments.join("/"),
        })
    }

    /// The joined prefix and namespace, without trailing slash.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The object name for `key`.
    pub fn object_name(&self, key: &[u8]) -> Result<String> {
        let (hash, group) = split_key(key)?;
        let hex = to_hex(hash);
        let mut name = String::with_capacity(self.base.len() + hex.len() * 2 + 24);
        if !self.base.is_empty() {
            name.push_str(&self.base);
            name.push('/');
        }
        // vLLM's shards are hex[:3] and hex[3:5], shorter (hex[3:5] empty) for hashes of
        // under 3 bytes; neither segment is ever empty as a whole.
        name.push_str(&hex[..hex.len().min(3)]);
        name.push('/');
        name.push_str(&hex[hex.len().min(3)..hex.len().min(5)]);
        name.push_str("_g");
        name.push_str(&group.to_string());
        name.push('/');
        name.push_str(&hex);
        name.push_str(".bin");
        Ok(name)
    }

    /// The key whose object name is `name`, if `name` is a block of this layout (the
    /// inverse of [`object_name`](Self::object_name)).
    pub fn key_of(&self, name: &str) -> Option<Vec<u8>> {
        let rest = if self.base.is_empty() {
            name
        } else {
            name.strip_prefix(&self.base)?.strip_prefix('/')?
        };
        let mut parts = rest.split('/');
        let (first, second, file) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let hex = file.strip_suffix(".bin")?;
        let (shard, group) = second.rsplit_once("_g")?;
        if hex.len() % 2 != 0
            || first != &hex[..hex.len().min(3)]
            || shard != &hex[hex.len().min(3)..hex.len().min(5)]
        {
            return None;
        }
        let group: u32 = group.parse().ok()?;
        let hash = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        let key = make_key(&hash, group);
        (self.object_name(&key).ok()? == name).then_some(key)
    }

    /// The key of `name` if it is a block under this layout's base at any depth: a block
    /// of this layout, or of a namespace below its base (`<base>/<segments>/<block>`, as
    /// the blocks of every namespace are below an empty namespace). Probe objects,
    /// temporary files and names no key has are not blocks.
    pub fn key_below(&self, name: &str) -> Option<Vec<u8>> {
        if ObjectKind::of(name) != ObjectKind::Block {
            return None;
        }
        let rest = if self.base.is_empty() {
            name
        } else {
            name.strip_prefix(&self.base)?.strip_prefix('/')?
        };
        let segments: Vec<&str> = rest.split('/').collect();
        let deeper = segments.get(..segments.len().checked_sub(3)?)?.join("/");
        let base = match (self.base.as_str(), deeper.as_str()) {
            (base, "") => base.to_string(),
            ("", deeper) => deeper.to_string(),
            (base, deeper) => format!("{base}/{deeper}"),
        };
        KeyLayout { base }.key_of(name)
    }

    /// A name under the base that no block can ever have, for connectivity probes.
    pub fn probe_name(&self) -> String {
        if self.base.is_empty() {
            format!("{PROBE_SEGMENT}/connectivity_test")
        } else {
            format!("{}/{PROBE_SEGMENT}/connectivity_test", self.base)
        }
    }
}

/// Characters the object store client would percent-encode (so the server-side name
/// would differ from vLLM's) or that cannot be part of a path segment.
const FORBIDDEN_IN_SEGMENT: &[char] = &[
    '\\', '{', '}', '^', '%', '`', '[', ']', '"', '<', '>', '~', '#', '|',
];

fn validate_segment(what: &str, segment: &str) -> Result<()> {
    let ok = segment != "."
        && segment != ".."
        && !segment
            .chars()
            .any(|c| c.is_control() || FORBIDDEN_IN_SEGMENT.contains(&c));
    if ok {
        Ok(())
    } else {
        Err(Error::config(format!(
            "{what} segment {segment:?} is not usable in an object name: no control characters, \".\", \"..\" or any of \\ {{ }} ^ % ` [ ] \" < > ~ # |"
        )))
    }
}

/// The directory segment of the start-up probe's objects, under a prefix and namespace: a
/// segment no block name can hold.
pub const PROBE_SEGMENT: &str = "__kvtier_probe__";
/// How the names of the local store's short-lived files start (temporary files before
/// their rename, the start-up writability check): a dot, which no object name starts with.
pub const TEMPORARY_START: &str = ".kvtier-";

/// What an object in a tier's store is, told by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ObjectKind {
    /// The tier's own: a block (or any other object under the prefix that is neither below).
    Block,
    /// One of the start-up probe's objects (below a [`PROBE_SEGMENT`] directory).
    Probe,
    /// A local store's file kept only for a moment (its last segment starts with
    /// [`TEMPORARY_START`]).
    Temporary,
}

impl ObjectKind {
    /// The kind of the object named `name` (`/`-separated, as a listing gives it).
    pub fn of(name: &str) -> ObjectKind {
        let last = name.rsplit('/').next().unwrap_or(name);
        if last.starts_with(TEMPORARY_START) {
            ObjectKind::Temporary
        } else if name.split('/').any(|segment| segment == PROBE_SEGMENT) {
            ObjectKind::Probe
        } else {
            ObjectKind::Block
        }
    }
}

/// The one `Path` of an object name, used by every request about that object (PUT, GET,
/// HEAD, DELETE, on the general and the direct path): `Path::parse` keeps the name as it
/// is, so the HTTP layer percent-encodes it exactly once (`modèle` goes out as
/// `mod%C3%A8le`). `Path::from` would encode it first (`mod%C3%A8le` in the path, sent as
/// `mod%25C3%25A8le`), naming another object. Layout names always parse; anything else
/// falls back to `Path::from`.
pub fn object_path(name: &str) -> Path {
    Path::parse(name).unwrap_or_else(|_| Path::from(name))
}

#[cfg(test)]
mod object_kind_tests {
    use super::ObjectKind;

    #[test]
    fn object_kinds_by_name() {
        assert_eq!(
            ObjectKind::of("kv/ns/abc/de_g0/abcdef.bin"),
            ObjectKind::Block
        );
        assert_eq!(
            ObjectKind::of("kv/ns/__kvtier_probe__/connectivity_test-conditional-put"),
            ObjectKind::Probe
        );
        assert_eq!(ObjectKind::of("__kvtier_probe__/cli-1"), ObjectKind::Probe);
        assert_eq!(
            ObjectKind::of("kv/ns/abc/de_g0/.kvtier-tmp-12-0"),
            ObjectKind::Temporary
        );
        assert_eq!(
            ObjectKind::of(".kvtier-write-probe-1-2"),
            ObjectKind::Temporary
        );
        assert_eq!(
            ObjectKind::of("kv/.kvtier-ns/abc/de_g0/abcdef.bin"),
            ObjectKind::Block,
            "only the last segment makes a temporary file"
        );
        let layout = crate::key::KeyLayout::new("kv", "ns").unwrap();
        assert_eq!(ObjectKind::of(&layout.probe_name()), ObjectKind::Probe);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash32() -> Vec<u8> {
        (0u8..32)
            .map(|i| i.wrapping_mul(37).wrapping_add(0x0a))
            .collect()
    }

    #[test]
    fn split_and_make_are_inverse() {
        let key = make_key(&hash32(), 0x0102_0304);
        assert_eq!(&key[32..], &[1, 2, 3, 4]);
        let (hash, group) = split_key(&key).unwrap();
        assert_eq!(hash, &hash32()[..]);
        assert_eq!(group, 0x0102_0304);
    }

    #[test]
    fn vllm_effective_layout_with_prefix() {
        // vLLM's tier hands "kv//<ns>/0ab/cd_g0/<hex>.bin" to the S3 SDK, which stores "kv/<ns>/...".
        let layout = KeyLayout::new("kv", "meta-llama_Llama-3-8B_a1b2c3d4e5f6_r0").unwrap();
        let mut hash = vec![0u8; 32];
        hash[0] = 0x0a;
        hash[1] = 0xbc;
        hash[2] = 0xde;
        hash[31] = 0xff;
        let name = layout.object_name(&make_key(&hash, 0)).unwrap();
        let hex = to_hex(&hash);
        assert_eq!(hex, format!("0abcde{}ff", "00".repeat(28)));
        assert_eq!(
            name,
            format!("kv/meta-llama_Llama-3-8B_a1b2c3d4e5f6_r0/0ab/cd_g0/{hex}.bin")
        );
    }

    #[test]
    fn vectors() {
        let layout = KeyLayout::new("", "m_0123456789ab_r0").unwrap();
        let key = make_key(&[0xde, 0xad, 0xbe, 0xef], 7);
        assert_eq!(
            layout.object_name(&key).unwrap(),
            "m_0123456789ab_r0/dea/db_g7/deadbeef.bin"
        );

        let layout = KeyLayout::new("/a//b/", "/ns/").unwrap();
        let key = make_key(&[0xff; 8], 4_000_000_000);
        assert_eq!(
            layout.object_name(&key).unwrap(),
            "a/b/ns/fff/ff_g4000000000/ffffffffffffffff.bin"
        );

        let layout = KeyLayout::new("", "").unwrap();
        let key = make_key(&[0x00, 0x01, 0x02], 0);
        assert_eq!(layout.object_name(&key).unwrap(), "000/10_g0/000102.bin");
        // Short hashes, named as vLLM's FileMapper names them (f"{h[:3]}/{h[3:5]}_g{g}/{h}.bin").
        assert_eq!(
            layout.object_name(&make_key(&[0x31], 0)).unwrap(),
            "31/_g0/31.bin"
        );
        assert_eq!(
            layout.object_name(&make_key(&[0xab, 0xcd], 2)).unwrap(),
            "abc/d_g2/abcd.bin"
        );
        assert_eq!(layout.probe_name(), "__kvtier_probe__/connectivity_test");
    }

    #[test]
    fn rejects_bad_keys_and_segments() {
        assert_eq!(
            split_key(&[1, 2, 3, 4]).unwrap_err().status,
            crate::error::Status::InvalidArgument
        );
        assert!(split_key(&[0u8; 69]).is_err());
        assert!(split_key(&[0u8; 68]).is_ok());
        for len in [
            0,
            4,
            69,
            1 << 40,
            (1 << 63) - 1,
            usize::MAX - 15,
            usize::MAX,
        ] {
            assert_eq!(
                check_key_len(len).unwrap_err().status,
                crate::error::Status::InvalidArgument,
                "{len}"
            );
        }
        for len in [5, 6, 7, 36, 68] {
            check_key_len(len).unwrap();
        }
        assert!(KeyLayout::new("ok", "..").is_err());
        assert!(KeyLayout::new("ok", "x%y").is_err());
        assert!(KeyLayout::new("ok", "x\ny").is_err());
        // Model names vLLM turns into namespaces: spaces, colons, non-ASCII.
        let layout = KeyLayout::new("", "org_módèl:v1 x_0123456789ab_r0").unwrap();
        assert!(layout.base().starts_with("org_módèl:v1 x"));
    }

    #[test]
    fn key_of_inverts_object_name() {
        for (prefix, namespace) in [("", ""), ("kv", "m_0123456789ab_r0"), ("a/b", "modèle")] {
            let layout = KeyLayout::new(prefix, namespace).unwrap();
            for hash_len in [1, 2, 3, 5, 32, 64] {
                let hash: Vec<u8> = (0..hash_len as u8).map(|i| i.wrapping_mul(37)).collect();
                let key = make_key(&hash, 70_000);
                let name = layout.object_name(&key).unwrap();
                assert_eq!(layout.key_of(&name), Some(key), "{name}");
            }
            assert_eq!(layout.key_of(&layout.probe_name()), None);
            assert_eq!(layout.key_of("elsewhere/abc/de_g0/abcdef.bin"), None);
        }
    }

    #[test]
    fn key_below_finds_blocks_of_every_namespace_under_the_base() {
        let key = make_key(&[0xab, 0xcd, 0xef], 2);
        let top = KeyLayout::new("", "").unwrap();
        for (prefix, namespace) in [("", ""), ("", "m_r0"), ("kv", "m_r1"), ("kv", "a/b")] {
            let name = KeyLayout::new(prefix, namespace)
                .unwrap()
                .object_name(&key)
                .unwrap();
            assert_eq!(top.key_below(&name), Some(key.clone()), "{name}");
        }
        let kv = KeyLayout::new("kv", "").unwrap();
        assert_eq!(kv.key_below("kv/m_r1/abc/def_g2/abcdef.bin"), None);
        assert_eq!(
            kv.key_below("kv/m_r1/abc/de_g2/abcdef.bin"),
            Some(key.clone())
        );
        assert_eq!(kv.key_below("m_r0/abc/de_g2/abcdef.bin"), None);
        assert_eq!(kv.key_below("kvx/abc/de_g2/abcdef.bin"), None);
        for not_a_block in [
            "kv/__kvtier_probe__/abc/de_g2/abcdef.bin",
            "kv/m/abc/de_g2/.kvtier-tmp-1-0",
            "kv/m/notes.txt",
            "kv/abc/de_g2",
            "kv",
            "",
        ] {
            assert_eq!(kv.key_below(not_a_block), None, "{not_a_block}");
        }
    }
}
