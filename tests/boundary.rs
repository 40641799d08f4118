//! The panic boundary, checked mechanically: every `extern "C"` function of the C ABI
//! enters a guard of `src/boundary.rs` (which catches a panic and turns it into
//! KVT_STATUS_PANIC, or a documented fallback value, with the message in kvt_last_error),
//! directly or through a helper that does (such as `submit` for the four submit calls), so
//! no panic can unwind into a C host. A failure names the export.

use std::path::PathBuf;

use regex::Regex;

/// The guards an export may enter (src/boundary.rs).
const GUARDS: &[&str] = &["guard(", "guard_tier(", "guard_tier_or(", "guard_value("];

/// Exports that need no guard, with the reason.
const UNGUARDED: &[(&str, &str)] = &[(
    "kvt_last_error",
    // It reads the thread's last error and must not overwrite it; its body cannot panic
    // (a thread-local read through try_with, with a static fallback).
    "reads the last error itself",
)];

/// Every function of the C ABI's sources, (name, file, text), the exports among them.
fn functions() -> Vec<(String, String, String)> {
    let start =
        Regex::new(r#"(?m)^(?:pub(?:\(crate\))? )?(?:unsafe )?(?:extern "C" )?fn ([a-z_]+)"#)
            .unwrap();
    read_functions(&start)
}

fn exports() -> Vec<(String, String, String)> {
    let start = Regex::new(r#"(?m)^pub (?:unsafe )?extern "C" fn (kvt_[a-z_]+)"#).unwrap();
    read_functions(&start)
}

fn read_functions(start: &Regex) -> Vec<(String, String, String)> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for caps in start.captures_iter(&text) {
            let at = caps.get(0).unwrap().start();
            // The body: up to the closing brace at the start of a line.
            let rest = &text[at..];
            let end = rest.find("\n}\n").map_or(rest.len(), |e| e + 3);
            out.push((
                caps[1].to_string(),
                path.file_name().unwrap().to_string_lossy().into_owned(),
                rest[..end].to_string(),
            ));
        }
    }
    out
}

#[test]
fn every_export_enters_the_panic_guard() {
    let exports = exports();
    assert!(
        exports.len() >= 30,
        "found only {} exports under src/: the reader is broken",
        exports.len()
    );
    // The guards, and the functions that enter one (as far as calls lead).
    let mut guarding: Vec<String> = GUARDS.iter().map(|g| g.to_string()).collect();
    let helpers = functions();
    loop {
        let before = guarding.len();
        for (name, _, body) in &helpers {
            let call = format!("{name}(");
            // A body's own signature names it: look past its first line.
            let inside = body.split_once('\n').map_or("", |(_, rest)| rest);
            if !guarding.contains(&call) && guarding.iter().any(|g| inside.contains(g.as_str())) {
                guarding.push(call);
            }
        }
        if guarding.len() == before {
            break;
        }
    }
    let mut unguarded = Vec::new();
    for (name, file, body) in &exports {
        if UNGUARDED.iter().any(|(n, _)| n == name) {
            continue;
        }
        let inside = body.split_once('\n').map_or("", |(_, rest)| rest);
        if !guarding.iter().any(|g| inside.contains(g.as_str())) {
            unguarded.push(format!("{name} (src/{file})"));
        }
    }
    assert!(
        unguarded.is_empty(),
        "exports outside the panic guard (wrap the body in one of {GUARDS:?}, or call a helper that does):\n  {}",
        unguarded.join("\n  ")
    );
}

/// Every export the header declares is one this test read (so none escapes the check by
/// living where it does not look).
#[test]
fn the_check_reads_every_export_of_the_header() {
    let header =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/kvtier.h")).unwrap();
    let declared = Regex::new(r"(?m)\b(kvt_[a-z_]+)\(").unwrap();
    let read: Vec<String> = exports().into_iter().map(|(name, _, _)| name).collect();
    for caps in declared.captures_iter(&header) {
        let name = &caps[1];
        // Mentions inside comments name functions too; only declarations count, and every
        // declared function must be read.
        let declaration = format!(" {name}(");
        if header.lines().any(|l| {
            !l.trim_start().starts_with("//")
                && !l.trim_start().starts_with('*')
                && l.contains(&declaration)
        }) {
            assert!(
                read.iter().any(|r| r == name),
                "{name} is declared in the header but not read"
            );
        }
    }
}
