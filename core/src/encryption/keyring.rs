//! Keyrings: the keys a tier encrypts with (one, the write key) and opens with (all of
//! them), and where they come from. Key material never appears in a message, a log record
//! or `Debug` output: errors name a key by its id, a keyring's text by line and column, and
//! a source by its value only when that cannot be a key pasted in its place ([`withheld`]).

use std::fmt;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use zeroize::{Zeroize, Zeroizing};

/// Bytes of a keyring key (AES-256).
pub(crate) const KEY_BYTES: usize = 32;
/// Longest key id: ids are stored in each object's header, zero-padded to this.
pub(crate) const KEY_ID_MAX: usize = 24;
/// How long a `keyring_command` may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest keyring text read from any source.
const MAX_KEYRING_BYTES: u64 = 1 << 20;
/// Longest a keyring file's read may take. A local file reads in microseconds; one on a
/// hung network file system would hold the tier's start (or a refresh) for ever, so it is
/// abandoned at this bound and the start fails, naming the file.
const FILE_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A key's id: 1 to 24 of `A-Z a-z 0-9 . _ -`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct KeyId(String);

impl KeyId {
    pub(crate) fn new(id: &str) -> Option<KeyId> {
        let valid = !id.is_empty()
            && id.len() <= KEY_ID_MAX
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        valid.then(|| KeyId(id.to_string()))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn padded(&self) -> [u8; KEY_ID_MAX] {
        let mut out = [0u8; KEY_ID_MAX];
        out[..self.0.len()].copy_from_slice(self.0.as_bytes());
        out
    }

    /// The id a header's zero-padded field holds, if it is one.
    pub(crate) fn from_padded(padded: &[u8]) -> Option<KeyId> {
        let len = padded.iter().position(|&b| b == 0).unwrap_or(padded.len());
        if padded[len..].iter().any(|&b| b != 0) {
            return None;
        }
        KeyId::new(std::str::from_utf8(&padded[..len]).ok()?)
    }
}

impl std::fmt::Debug for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// A key, zeroed when dropped.
pub(crate) struct Secret(pub(crate) [u8; KEY_BYTES]);

impl Drop for Secret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// The keys a tier opens objects with, and the one it writes new objects with.
pub(crate) struct Keyring {
    write: KeyId,
    keys: Vec<(KeyId, Secret)>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("write", &self.write)
            .field("ids", &self.ids())
            .finish_non_exhaustive()
    }
}

/// A keyring's text, as JSON: `{"write": "ID", "keys": {"ID": "BASE64 OF 32 BYTES", …}}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyringText {
    write: String,
    /// Every `"ID": "KEY"` pair as written, an id given twice included (a map would keep
    /// the last silently).
    #[serde(deserialize_with = "pairs")]
    keys: Vec<(String, String)>,
}

/// A JSON object's pairs, in the order written; those read before an error are wiped.
fn pairs<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<(String, String)>, D::Error> {
    struct Pairs;
    impl<'de> Visitor<'de> for Pairs {
        type Value = Vec<(String, String)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object of key ids and keys")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut pairs = Vec::new();
            loop {
                match map.next_entry::<String, String>() {
                    Ok(Some(pair)) => pairs.push(pair),
                    Ok(None) => return Ok(pairs),
                    Err(e) => {
                        wipe(&mut pairs);
                        return Err(e);
                    }
                }
            }
        }
    }
    deserializer.deserialize_map(Pairs)
}

fn wipe(pairs: &mut Vec<(String, String)>) {
    for (mut id, mut encoded) in pairs.drain(..) {
        id.zeroize();
        encoded.zeroize();
    }
}

const KEYRING_FORM: &str = r#"{"write": "ID", "keys": {"ID": "32 bytes in base64", ...}} (ids: 1 to 24 of A-Z a-z 0-9 . _ -)"#;

impl Keyring {
    /// Parses a keyring's text. Errors never quote the text, nor a value that fails to be
    /// an id (a key put where an id belongs would be): they name valid ids only. The text's
    /// strings and the decoded keys are wiped from memory.
    pub(crate) fn parse(text: &[u8]) -> Result<Keyring, String> {
        let mut parsed: KeyringText = serde_json::from_slice(text).map_err(|e| {
            format!(
                "not a keyring (line {}, column {}); expected {KEYRING_FORM}",
                e.line(),
                e.column()
            )
        })?;
        // Sorted by id (moving the strings, not copying them): an id given twice is then
        // next to itself.
        parsed.keys.sort_by(|a, b| a.0.cmp(&b.0));
        let ring = Keyring::from_text(&parsed);
        parsed.write.zeroize();
        wipe(&mut parsed.keys);
        ring
    }

    fn from_text(parsed: &KeyringText) -> Result<Keyring, String> {
        let mut keys: Vec<(KeyId, Secret)> = Vec::with_capacity(parsed.keys.len());
        for (position, (id, encoded)) in parsed.keys.iter().enumerate() {
            let key_id = KeyId::new(id).ok_or_else(|| {
                format!(
                    "key id number {} (in sorted order) is not 1 to 24 of A-Z a-z 0-9 . _ -",
                    position + 1
                )
            })?;
            if keys.last().is_some_and(|(last, _)| *last == key_id) {
                return Err(format!(
                    "key id {key_id:?} is given more than once; each id names one key"
                ));
            }
            let bytes = Zeroizing::new(
                base64::engine::general_purpose::STANDARD
                    .decode(encoded.trim())
                    .unwrap_or_default(),
            );
            if bytes.len() != KEY_BYTES {
                return Err(format!("key {key_id:?} is not {KEY_BYTES} bytes in base64"));
            }
            let mut secret = Secret([0; KEY_BYTES]);
            secret.0.copy_from_slice(&bytes);
            keys.push((key_id, secret));
        }
        let write = KeyId::new(&parsed.write)
            .ok_or("the write key's id is not 1 to 24 of A-Z a-z 0-9 . _ -")?;
        if !keys.iter().any(|(k, _)| *k == write) {
            return Err(format!(
                "the write key {write:?} is not one of the keyring's keys ({:?})",
                keys.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>()
            ));
        }
        Ok(Keyring { write, keys })
    }

    /// The key new objects are sealed with.
    pub(crate) fn write_key(&self) -> (&KeyId, &[u8; KEY_BYTES]) {
        let key = self.key(&self.write).expect("the write key is in the ring");
        (&self.write, key)
    }

    pub(crate) fn key(&self, id: &KeyId) -> Option<&[u8; KEY_BYTES]> {
        self.keys.iter().find(|(k, _)| k == id).map(|(_, s)| &s.0)
    }

    pub(crate) fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|(k, _)| k.as_str()).collect()
    }
}

/// Where a keyring comes from.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum KeySource {
    /// A file holding the keyring's text.
    File(PathBuf),
    /// An environment variable holding it.
    Env(String),
    /// A command (program and arguments, no shell) that prints it on standard output.
    Command(Vec<String>),
}

/// The source in words: a command's arguments may hold a token, so only its program.
impl std::fmt::Debug for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl KeySource {
    /// Reads the keyring: what a tier's start, its refreshes and the configuration's check
    /// all call. The error says where from and why, never what was read.
    pub(crate) fn load(&self) -> Result<Keyring, String> {
        self.load_unless_stopped(&CommandStop::default())
    }

    /// As [`load`](Self::load); a command still running when `stop` is stopped is ended.
    pub(crate) fn load_unless_stopped(&self, stop: &CommandStop) -> Result<Keyring, String> {
        let text = Zeroizing::new(match self {
            KeySource::File(path) => read_file_bounded(path, &self.value())?,
            KeySource::Env(name) => std::env::var_os(name)
                .ok_or_else(|| format!("the keyring variable {} is not set", self.value()))?
                .into_encoded_bytes(),
            KeySource::Command(argv) => run_command(argv, &self.value(), stop)?,
        });
        Keyring::parse(&text).map_err(|e| format!("{}: {e}", self.describe()))
    }

    /// The source in words, for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            KeySource::File(_) => format!("keyring file {}", self.value()),
            KeySource::Env(_) => format!("keyring variable {}", self.value()),
            KeySource::Command(_) => format!("keyring command {}", self.value()),
        }
    }

    /// The source's value for messages: the file's path, the variable's name, the
    /// command's program (quoted; never its arguments, which may hold a token); or, where
    /// it could be key material, words that stand for it ([`withheld`]).
    fn value(&self) -> String {
        match self {
            KeySource::File(path) => withheld(&path.to_string_lossy(), "keyring_file")
                .unwrap_or_else(|| path.display().to_string()),
            KeySource::Env(name) => withheld(name, "keyring_env").unwrap_or_else(|| name.clone()),
            KeySource::Command(argv) => {
                withheld(&argv[0], "keyring_command").unwrap_or_else(|| format!("{:?}", argv[0]))
            }
        }
    }

    /// Whether reading it again can give another keyring (rotation without a restart).
    pub(crate) fn can_change(&self) -> bool {
        !matches!(self, KeySource::Env(_))
    }
}

/// Characters of a run that [`withheld`] withholds: 32 bytes of key are 43 or 44 characters
/// of base64, 64 of hex; the rule withholds from 32 on, so that a key cut short is too.
const KEY_LIKE_RUN: usize = 32;

/// Whether a key source's value (a keyring file's path, a variable's name, a command's
/// program) is kept out of messages and log records: `None` when it may appear, else the
/// words that stand for it, naming the configuration's key.
///
/// The rule: a value is never shown when it holds a run of [`KEY_LIKE_RUN`] or more
/// characters of the base64 and base64url alphabets (`A-Z a-z 0-9 + / = - _`) with letters
/// of both cases, or of as many hex digits. A key pasted where its source belongs is such
/// a run, whole or inside a path: 32 random bytes in base64 mix the cases but for a chance
/// in billions, and `/` counts as part of a run because base64 uses it. Paths (lower case,
/// or broken by a dot as in `keyring.json`), variable names (upper case) and programs are
/// shown as they are; one withheld all the same costs only a message that names the
/// configuration's key instead of its value.
fn withheld(value: &str, config_key: &str) -> Option<String> {
    let (mut run, mut upper, mut lower, mut hex) = (0, false, false, 0);
    for c in value.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '-' | '_') {
            run += 1;
            upper |= c.is_ascii_uppercase();
            lower |= c.is_ascii_lowercase();
        } else {
            (run, upper, lower) = (0, false, false);
        }
        hex = if c.is_ascii_hexdigit() { hex + 1 } else { 0 };
        if (run >= KEY_LIKE_RUN && upper && lower) || hex >= KEY_LIKE_RUN {
            return Some(format!(
                "named by encryption.{config_key} (its value not shown: it could be key \
                 material)"
            ));
        }
    }
    None
}

/// [`read_file`] on a thread of its own, abandoned after [`FILE_READ_TIMEOUT`]: a read the
/// kernel holds (a hung network file system) fails the caller in time; the thread ends
/// when the kernel lets it go, and wipes what it read.
fn read_file_bounded(path: &Path, named: &str) -> Result<Vec<u8>, String> {
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    let (path_owned, named_owned) = (path.to_owned(), named.to_owned());
    std::thread::Builder::new()
        .name("kvtier-keyring-read".into())
        .spawn(move || {
            let read = read_file(&path_owned, &named_owned).map(Zeroizing::new);
            // Dropped (and wiped) here when the caller gave up waiting.
            let _ = done_tx.send(read);
        })
        .map_err(|e| format!("cannot read the keyring file {named}: {e}"))?;
    match done_rx.recv_timeout(FILE_READ_TIMEOUT) {
        Ok(read) => read.map(|mut text| std::mem::take(&mut *text)),
        Err(_) => Err(format!(
            "reading the keyring file {named} did not finish within {} s (a hung network \
             file system?)",
            FILE_READ_TIMEOUT.as_secs()
        )),
    }
}

/// Reads a keyring file (`named`: its path for messages). A regular file only: a FIFO, a
/// socket or a device could block the read for ever, or never end; one is refused at
/// once, naming its kind. Opened with `O_NONBLOCK`, so that a file swapped for a FIFO
/// after the check does not block the open either (its type is checked again on the open
/// file). At most [`MAX_KEYRING_BYTES`].
fn read_file(path: &Path, named: &str) -> Result<Vec<u8>, String> {
    let cannot = |e: std::io::Error| format!("cannot read the keyring file {named}: {e}");
    let regular = |meta: &std::fs::Metadata| match irregular_kind(meta.file_type()) {
        None => Ok(()),
        Some(kind) => Err(format!(
            "the keyring file {named} is not a regular file: it is {kind}"
        )),
    };
    regular(&std::fs::metadata(path).map_err(cannot)?)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    regular(&meta)?;
    if meta.len() > MAX_KEYRING_BYTES {
        return Err(format!(
            "the keyring file {named} is {} bytes; a keyring is at most {MAX_KEYRING_BYTES} bytes",
            meta.len()
        ));
    }
    let mut text = Vec::new();
    file.take(MAX_KEYRING_BYTES)
        .read_to_end(&mut text)
        .map_err(cannot)?;
    Ok(text)
}

/// What a file that is not a regular file is, in words; `None` for a regular file.
fn irregular_kind(file_type: std::fs::FileType) -> Option<&'static str> {
    if file_type.is_file() {
        None
    } else if file_type.is_dir() {
        Some("a directory")
    } else if file_type.is_fifo() {
        Some("a FIFO")
    } else if file_type.is_socket() {
        Some("a socket")
    } else if file_type.is_char_device() || file_type.is_block_device() {
        Some("a device")
    } else {
        Some("neither a file nor a directory")
    }
}

/// Ends the keyring command a tier's refresh runs when the tier shuts down, so that a
/// command that hangs neither holds the shutdown nor outlives the tier by its timeout.
#[derive(Debug, Default)]
pub(crate) struct CommandStop {
    state: std::sync::Mutex<StopState>,
}

#[derive(Debug, Default)]
struct StopState {
    stopped: bool,
    /// The process group of the command running now: registered once spawned, and
    /// dropped before the command is reaped, so a kill never reaches a reused id.
    running: Option<libc::pid_t>,
}

impl CommandStop {
    /// Kills the command running now, if any, and every later one as soon as it starts.
    pub(crate) fn stop(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.stopped = true;
        if let Some(group) = state.running {
            kill_group(group);
        }
    }

    /// Registers `group`; killed at once if already stopped.
    fn started(&self, group: libc::pid_t) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.running = Some(group);
        if state.stopped {
            kill_group(group);
        }
    }

    /// Forgets the command (before it is reaped); whether it was stopped.
    fn ended(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.running = None;
        state.stopped
    }
}

fn kill_group(group: libc::pid_t) {
    // SAFETY: a plain kill(2) of a process group this process started and has not reaped.
    unsafe { libc::kill(-group, libc::SIGKILL) };
}

/// Runs a keyring command (`program`: its program for messages) and returns its standard
/// output. Its standard error is not kept: it could hold key material. `stop` ends it early.
fn run_command(argv: &[String], program: &str, stop: &CommandStop) -> Result<Vec<u8>, String> {
    // Its own process group, so that a timeout ends whatever it started too (a shell's
    // children hold its output open).
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run the keyring command {program}: {e}"))?;
    let group = child.id() as libc::pid_t;
    stop.started(group);
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let read = (&mut stdout)
            .take(MAX_KEYRING_BYTES)
            .read_to_end(&mut text)
            .map(|_| text);
        let _ = done_tx.send(());
        read
    });
    if done_rx.recv_timeout(COMMAND_TIMEOUT).is_err() {
        // Its process group: its pid (process_group(0)).
        kill_group(group);
        stop.ended();
        let _ = child.wait();
        // The reader ends when the pipe closes; it is not waited for.
        drop(reader);
        return Err(format!(
            "the keyring command {program} did not finish within {} s",
            COMMAND_TIMEOUT.as_secs()
        ));
    }
    if stop.ended() {
        kill_group(group);
        let _ = child.wait();
        return Err(format!(
            "the keyring command {program} was ended: the tier shut down"
        ));
    }
    let text = reader
        .join()
        .map_err(|_| "the keyring command's reader failed".to_string())?
        .map_err(|e| format!("cannot read the keyring command {program}'s output: {e}"))?;
    let status = child
        .wait()
        .map_err(|e| format!("the keyring command {program} could not be waited for: {e}"))?;
    if !status.success() {
        return Err(format!("the keyring command {program} failed ({status})"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    const KEY_B: &str = "q83vEjRWeJCrze8SNFZ4kKvN7xI0VniQq83vEjRWeJA=";

    #[test]
    fn parses_a_ring_and_finds_its_keys() {
        let ring = Keyring::parse(
            format!(
                r#"{{"write": "2026-12", "keys": {{"2026-11": "{KEY_A}", "2026-12": "{KEY_B}"}}}}"#
            )
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(ring.write_key().0.as_str(), "2026-12");
        assert_eq!(ring.write_key().1[0], 0xab);
        assert_eq!(ring.key(&KeyId::new("2026-11").unwrap()), Some(&[0u8; 32]));
        assert_eq!(ring.key(&KeyId::new("other").unwrap()), None);
        assert!(!format!("{ring:?}").contains("171"), "{ring:?}");
    }

    #[test]
    fn errors_name_ids_never_keys() {
        let cases = [
            format!(r#"{{"write": "a", "keys": {{"a": "{KEY_B}"}}"#),
            format!(r#"{{"write": "b", "keys": {{"a": "{KEY_B}"}}}}"#),
            format!(r#"{{"write": "a", "keys": {{"a": "{}"}}}}"#, &KEY_B[..40]),
            format!(r#"{{"write": "a", "keys": {{"a": 5, "x": "{KEY_B}"}}}}"#),
            format!(r#"{{"write": "a", "keys": {{"a": "{KEY_B}"}}, "extra": "{KEY_B}"}}"#),
            format!(r#"{{"write": "a/b", "keys": {{"a/b": "{KEY_B}"}}}}"#),
            format!(r#"["{KEY_B}"]"#),
        ];
        for text in cases {
            let error = Keyring::parse(text.as_bytes()).unwrap_err();
            assert!(!error.contains(&KEY_B[..8]), "{error}");
        }
    }

    #[test]
    fn an_id_given_twice_is_refused_naming_it() {
        let text = format!(
            r#"{{"write": "b", "keys": {{"b": "{KEY_A}", "a": "{KEY_A}", "b": "{KEY_B}"}}}}"#
        );
        let error = Keyring::parse(text.as_bytes()).unwrap_err();
        assert!(
            error.contains(r#"key id "b" is given more than once"#),
            "{error}"
        );
        assert!(!error.contains(&KEY_B[..8]), "{error}");
        // Distinct ids load, whatever their order.
        let text = format!(r#"{{"write": "b", "keys": {{"b": "{KEY_B}", "a": "{KEY_A}"}}}}"#);
        assert_eq!(Keyring::parse(text.as_bytes()).unwrap().ids(), ["a", "b"]);
    }

    #[test]
    fn source_values_that_could_be_keys_are_not_shown() {
        let hex = "ab".repeat(32);
        let url_safe = KEY_B.replace('+', "-").replace('/', "_");
        let in_a_path = format!("/etc/kvtier/{KEY_B}");
        for key in [KEY_A, KEY_B, &hex, &url_safe, &in_a_path, &KEY_B[..32]] {
            let words = withheld(key, "keyring_env").expect("withheld");
            assert!(words.contains("encryption.keyring_env"), "{words}");
            let sources = [
                KeySource::File(key.into()),
                KeySource::Env(key.into()),
                KeySource::Command(vec![key.into(), key.into()]),
            ];
            for source in sources {
                let described = format!("{source:?} {}", source.load().unwrap_err());
                assert!(!described.contains(&key[key.len() - 20..]), "{described}");
            }
        }
        for value in [
            "/etc/kvtier/keyring.json",
            "/var/lib/kvtier-keyrings/production/keyring",
            "KVTIER_PRODUCTION_CLUSTER_KEYRING_JSON",
            "/usr/local/bin/kvtier-keyring",
            &KEY_B[..31],
            &hex[..31],
        ] {
            assert_eq!(withheld(value, "keyring_file"), None, "{value}");
        }
    }

    #[test]
    fn only_a_regular_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        // A directory named plainly: a temporary directory's random name (and its parents',
        // under mktemp) can look like key material, and is then rightly not shown.
        for (path, kind) in [
            (std::path::PathBuf::from("."), "a directory"),
            ("/dev/null".into(), "a device"),
        ] {
            let error = KeySource::File(path.clone()).load().unwrap_err();
            assert_eq!(
                error,
                format!(
                    "the keyring file {} is not a regular file: it is {kind}",
                    path.display()
                )
            );
        }
        let large = dir.path().join("large.json");
        std::fs::write(&large, vec![b' '; MAX_KEYRING_BYTES as usize + 1]).unwrap();
        let error = KeySource::File(large).load().unwrap_err();
        assert!(
            error.contains("a keyring is at most 1048576 bytes"),
            "{error}"
        );
    }

    #[test]
    fn key_ids_fit_the_header() {
        for bad in ["", "a b", "x/y", "é", &"k".repeat(25)] {
            assert!(KeyId::new(bad).is_none(), "{bad:?}");
        }
        let id = KeyId::new(&"k".repeat(24)).unwrap();
        assert_eq!(KeyId::from_padded(&id.padded()), Some(id));
        let short = KeyId::new("v1").unwrap();
        assert_eq!(KeyId::from_padded(&short.padded()), Some(short));
        let mut bad = KeyId::new("v1").unwrap().padded();
        bad[5] = b'x';
        assert_eq!(KeyId::from_padded(&bad), None);
    }

    #[test]
    fn sources_read_files_variables_and_commands() {
        let text = format!(r#"{{"write": "a", "keys": {{"a": "{KEY_B}"}}}}"#);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ring.json");
        std::fs::write(&path, &text).unwrap();
        assert_eq!(KeySource::File(path.clone()).load().unwrap().ids(), ["a"]);
        let missing = KeySource::File(dir.path().join("none")).load().unwrap_err();
        assert!(
            missing.contains("cannot read the keyring file"),
            "{missing}"
        );

        let command = KeySource::Command(vec!["cat".into(), path.display().to_string()]);
        assert_eq!(command.load().unwrap().ids(), ["a"]);
        let failing = KeySource::Command(vec!["false".into()]).load().unwrap_err();
        assert!(failing.contains("failed"), "{failing}");
        let absent = KeySource::Command(vec!["/no/such/program".into()])
            .load()
            .unwrap_err();
        // Where programs run under an emulator (qemu-user), the emulator reports a missing
        // program as exit status 127 instead of the spawn failing.
        assert!(
            absent.contains("cannot run") || absent.contains("failed"),
            "{absent}"
        );
        let garbage = KeySource::Command(vec!["echo".into(), KEY_B.into()])
            .load()
            .unwrap_err();
        assert!(
            garbage.contains("not a keyring") && !garbage.contains(&KEY_B[..8]),
            "{garbage}"
        );

        let unset = KeySource::Env("KVTIER_TEST_KEYRING_UNSET".into())
            .load()
            .unwrap_err();
        assert!(unset.contains("not set"), "{unset}");
    }
}
