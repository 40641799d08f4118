//! Encryption at rest as an operator meets it, through the C ABI: `kvt_config_check` accepts
//! and refuses exactly the keyrings `kvt_tier_new` does, with the same message (a keyring
//! file missing, malformed, a directory, a FIFO or a device; a command that fails; a
//! variable not set; an id given twice); a key pasted where a source belongs is never
//! echoed; a FIFO with no writer is refused at once instead of blocking the tier's start.

use std::ffi::{CStr, CString};
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use kvtier::{kvt_config_check, kvt_last_error, kvt_tier_free, kvt_tier_new};
use kvtier_core::Status;
use serde_json::{json, Value};

/// A key of 32 bytes in base64, as an operator would paste it; its bytes give a `/` and a
/// `+` in the encoding, which a rule that looks for path separators must not be fooled by.
fn pasted_key() -> String {
    let key = "QWmb1x1txyuZEZMftVX/s3E5C+fNvbe7yeEDL2Wl70M=";
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(key)
        .unwrap();
    assert_eq!(bytes.len(), 32);
    key.to_string()
}

fn keyring_text(write: &str, keys: &[(&str, &str)]) -> String {
    let keys: Vec<String> = keys
        .iter()
        .map(|(id, key)| format!("{id:?}: {key:?}"))
        .collect();
    format!(r#"{{"write": {write:?}, "keys": {{{}}}}}"#, keys.join(", "))
}

fn config(encryption: Value) -> String {
    json!({"store": {"type": "memory"}, "encryption": encryption}).to_string()
}

fn last_error() -> String {
    // SAFETY: the calling thread's last error, valid until its next kvt_ call.
    unsafe { CStr::from_ptr(kvt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// `kvt_config_check`'s answer: Ok, or the status and message.
fn check(config: &str) -> Result<(), (Status, String)> {
    let text = CString::new(config).unwrap();
    // SAFETY: a NUL-terminated string, borrowed for the call.
    match unsafe { kvt_config_check(text.as_ptr()) } {
        Status::Ok => Ok(()),
        status => Err((status, last_error())),
    }
}

/// `kvt_tier_new`'s answer (the tier, if made, freed at once).
fn create(config: &str) -> Result<(), (Status, String)> {
    let text = CString::new(config).unwrap();
    let mut tier = std::ptr::null_mut();
    // SAFETY: a NUL-terminated string and a writable out-pointer.
    match unsafe { kvt_tier_new(text.as_ptr(), &mut tier) } {
        Status::Ok => {
            // SAFETY: the handle kvt_tier_new just made, freed once.
            unsafe { kvt_tier_free(tier) };
            Ok(())
        }
        status => Err((status, last_error())),
    }
}

/// Runs `f` on a thread of its own and waits for it at most `bound`; a call that blocks
/// past it fails the test (then `unblock` is run so that the thread can end).
fn within<T: Send + 'static>(
    bound: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
    unblock: impl FnOnce(),
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(bound) {
        Ok(value) => {
            worker.join().unwrap();
            assert!(
                started.elapsed() < bound,
                "{what} took {:?}",
                started.elapsed()
            );
            value
        }
        Err(_) => {
            unblock();
            panic!("{what} did not return within {bound:?}");
        }
    }
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "mkfifo {path:?}"
    );
}

#[test]
fn the_check_and_the_tier_accept_and_refuse_the_same_keyrings() {
    let dir = tempfile::tempdir().unwrap();
    let key = pasted_key();
    let good = dir.path().join("good.json");
    std::fs::write(&good, keyring_text("k1", &[("k1", &key)])).unwrap();
    let malformed = dir.path().join("malformed.json");
    std::fs::write(&malformed, "{\"write\": \"k1\", \"keys\": ").unwrap();
    let twice = dir.path().join("twice.json");
    std::fs::write(&twice, keyring_text("k1", &[("k1", &key), ("k1", &key)])).unwrap();
    let missing = dir.path().join("missing.json");

    let refused = [
        (
            json!({"keyring_file": missing}),
            "cannot read the keyring file",
        ),
        (json!({"keyring_file": malformed}), "not a keyring"),
        (json!({"keyring_file": twice}), "\"k1\""),
        (json!({"keyring_file": dir.path()}), "not a regular file"),
        (json!({"keyring_file": "/dev/null"}), "not a regular file"),
        (json!({"keyring_command": ["false"]}), "failed"),
        (
            json!({"keyring_env": "KVTIER_EDGES_NEVER_SET_VARIABLE"}),
            "KVTIER_EDGES_NEVER_SET_VARIABLE is not set",
        ),
    ];
    for (encryption, says) in refused {
        let config = config(encryption.clone());
        let by_tier = create(&config).expect_err(&format!("{encryption}: the tier started"));
        let by_check = check(&config);
        assert_eq!(
            by_check,
            Err(by_tier.clone()),
            "{encryption}: kvt_config_check and kvt_tier_new disagree"
        );
        assert_eq!(by_tier.0, Status::Config, "{encryption}: {}", by_tier.1);
        assert!(by_tier.1.contains(says), "{encryption}: {}", by_tier.1);
        assert!(!by_tier.1.contains(&key[..12]), "{}", by_tier.1);
    }
    let accepted = config(json!({"keyring_file": good, "refresh_s": 0}));
    assert_eq!(check(&accepted), Ok(()));
    assert_eq!(create(&accepted), Ok(()));
    let by_command = config(json!({"keyring_command": ["cat", good]}));
    assert_eq!(check(&by_command), Ok(()));
    assert_eq!(create(&by_command), Ok(()));
}

#[test]
fn a_key_pasted_as_a_source_is_never_echoed() {
    let key = pasted_key();
    let hex: String = base64::engine::general_purpose::STANDARD
        .decode(&key)
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let url_safe = key.replace('+', "-").replace('/', "_");
    for pasted in [&key, &hex, &url_safe, &format!("/etc/kvtier/{key}")] {
        for (encryption, names) in [
            (json!({"keyring_file": pasted}), "keyring_file"),
            (json!({"keyring_env": pasted}), "keyring_env"),
            (json!({"keyring_command": [pasted]}), "keyring_command"),
            (
                json!({"keyring_command": [pasted, pasted]}),
                "keyring_command",
            ),
        ] {
            let config = config(encryption.clone());
            let (status, message) = create(&config).expect_err("the tier must not start");
            assert_eq!(status, Status::Config, "{message}");
            assert_eq!(check(&config), Err((status, message.clone())));
            // Not the value, nor a piece of it long enough to matter.
            for piece in pasted.as_bytes().chunks(12) {
                let piece = std::str::from_utf8(piece).unwrap();
                if piece.len() == 12 {
                    assert!(!message.contains(piece), "{encryption}: {message}");
                }
            }
            // Still says which key of the configuration is at fault.
            assert!(message.contains(names), "{encryption}: {message}");
        }
    }
    // A path, a variable's name and a program are named as they are.
    let (_, message) = check(&config(
        json!({"keyring_file": "/nonexistent/kvtier/ring.json"}),
    ))
    .expect_err("no such file");
    assert!(
        message.contains("/nonexistent/kvtier/ring.json"),
        "{message}"
    );
    let (_, message) =
        check(&config(json!({"keyring_env": "KVTIER_EDGES_UNSET"}))).expect_err("no such variable");
    assert!(message.contains("KVTIER_EDGES_UNSET"), "{message}");
    let (_, message) = check(&config(
        json!({"keyring_command": ["/no/such/kvtier-keyring"]}),
    ))
    .expect_err("no such program");
    assert!(message.contains("/no/such/kvtier-keyring"), "{message}");
}

#[test]
fn a_keyring_with_an_id_twice_is_refused_naming_the_id() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keyring.json");
    let other = base64::engine::general_purpose::STANDARD.encode([0x5a; 32]);
    let key = pasted_key();
    std::fs::write(
        &path,
        keyring_text("k2", &[("k1", &other), ("k2", &key), ("k1", &key)]),
    )
    .unwrap();
    let (status, message) = create(&config(json!({"keyring_file": path})))
        .expect_err("a keyring with an id twice must not start a tier");
    assert_eq!(status, Status::Config);
    assert!(
        message.contains("\"k1\"") && message.contains("more than once"),
        "{message}"
    );
    assert!(
        !message.contains(&key[..12]) && !message.contains(&other[..12]),
        "{message}"
    );
}

#[test]
fn a_fifo_socket_or_device_keyring_is_refused_at_once_naming_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("keyring.fifo");
    mkfifo(&fifo);
    let socket = dir.path().join("keyring.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    // A FIFO with no writer: the tier's start, the check and a keyring refresh would wait
    // for one for ever. Should one block, a writer that opens and closes it ends the wait.
    let unblock = |fifo: &Path| {
        let fifo = fifo.to_path_buf();
        move || {
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
    };
    for path in [&fifo, &socket, &Path::new("/dev/zero").to_path_buf()] {
        let config = config(json!({"keyring_file": path}));
        let by_tier = {
            let config = config.clone();
            within(
                Duration::from_secs(10),
                &format!("kvt_tier_new with {path:?}"),
                move || create(&config),
                unblock(&fifo),
            )
        };
        let by_check = {
            let config = config.clone();
            within(
                Duration::from_secs(10),
                &format!("kvt_config_check with {path:?}"),
                move || check(&config),
                unblock(&fifo),
            )
        };
        let (status, message) = by_tier.expect_err("the tier must not start");
        assert_eq!(by_check, Err((status, message.clone())));
        assert_eq!(status, Status::Config, "{message}");
        assert!(
            message.contains(&path.display().to_string()) && message.contains("not a regular file"),
            "{message}"
        );
    }
}
