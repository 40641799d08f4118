//! No status, decision or match in the library, the command line or the Python package
//! depends on the wording of an error message: statuses come from facts (HTTP status,
//! the store's error code, error types), and messages are for people. This test greps
//! the sources for the shapes such a dependency takes, as the header test checks the
//! header; a self-test first proves each pattern catches what it is meant to catch.
//!
//! Unit tests are exempt (they check that messages say what they should).

use std::path::{Path, PathBuf};

use regex::Regex;

/// Shapes of a decision made from message text, in Rust.
const RUST_PATTERNS: &[(&str, &str)] = &[
    (
        r"\b(e|err|error|msg|message|text|why|detail|reason|answer|body)(\.message|\.to_string\(\))?\.(contains|starts_with|ends_with|find|rfind|matches)\(",
        "looks into an error's text",
    ),
    (
        r"\.to_string\(\)\s*\.\s*(contains|starts_with|ends_with|find|rfind)\(",
        "looks into formatted text",
    ),
    (
        r#"format!\("\{[a-z_:?]*\}"[^)]*\)\s*\.\s*(contains|starts_with|ends_with|find)\("#,
        "looks into formatted text",
    ),
    (
        r"describe\(\)\s*\.\s*(contains|starts_with|ends_with|find)\(",
        "looks into a store's description",
    ),
];

/// Shapes of a decision made from message text, in Python.
const PYTHON_PATTERNS: &[(&str, &str)] = &[
    (
        r"\bin\s+(str|repr)\(\s*(e|exc|err|error)\s*\)",
        "looks into an exception's text",
    ),
    (
        r"(\bmessage|str\(\s*(e|exc|err|error)\s*\))\s*\.\s*(startswith|endswith|find|index|lower|upper)\(",
        "looks into an exception's text",
    ),
    (
        r#"["'][^"']*["']\s+(not\s+)?in\s+[\w.]*\bmessage\b"#,
        "looks into a message",
    ),
    (
        r"re\.(search|match|fullmatch|findall)\(.*\b(message|str\()",
        "matches a message with a regular expression",
    ),
];

/// Lines that match a pattern and are not decisions, with the reason.
const NOT_DECISIONS: &[(&str, &str)] = &[
    (
        "core/src/store/classify.rs",
        // Composing one message from an error and its sources: skips a source whose text
        // the outer error already repeats. Formatting, not a decision.
        "if !text.contains(&s_text) {",
    ),
    (
        "core/src/namespace.rs",
        // Python's float repr for vLLM's namespace hash: the text of a number, no error.
        "if text.contains('.') {",
    ),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            if path
                .file_name()
                .is_some_and(|n| n == "tests" || n == "__pycache__")
            {
                continue;
            }
            files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext)
            && !(ext == "rs" && path.file_name().is_some_and(|n| n == "tests.rs"))
        {
            // (A `tests.rs` is a module's unit tests in a file of their own, declared
            // `#[cfg(test)] mod tests;`: test code, as the tail of a file is below.)
            out.push(path);
        }
    }
}

/// The lines of a source file that are not comments or unit tests, with their numbers.
fn code_lines(text: &str, rust: bool) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        // A file's unit tests come last: `#[cfg(test)]`, perhaps more attributes, `mod tests`.
        if rust
            && trimmed.starts_with("#[cfg(test)]")
            && lines[i + 1..]
                .iter()
                .map(|next| next.trim_start())
                .find(|next| !next.starts_with("#["))
                .is_some_and(|next| next.starts_with("mod tests"))
        {
            break;
        }
        let comment = if rust { "//" } else { "#" };
        if trimmed.starts_with(comment) {
            continue;
        }
        out.push((i + 1, *line));
    }
    out
}

fn compile(patterns: &[(&str, &'static str)]) -> Vec<(Regex, &'static str)> {
    patterns
        .iter()
        .map(|(p, why)| (Regex::new(p).expect("pattern compiles"), *why))
        .collect()
}

fn findings(root: &Path, dirs: &[&str], ext: &str, patterns: &[(Regex, &str)]) -> Vec<String> {
    let mut paths = Vec::new();
    for dir in dirs {
        files(&root.join(dir), ext, &mut paths);
    }
    assert!(!paths.is_empty(), "no .{ext} files under {dirs:?}");
    let mut found = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        let relative = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        for (number, line) in code_lines(&text, ext == "rs") {
            let excused = NOT_DECISIONS
                .iter()
                .any(|(file, allowed)| *file == relative && line.trim() == *allowed);
            if excused {
                continue;
            }
            for (pattern, why) in patterns {
                if pattern.is_match(line) {
                    found.push(format!("{relative}:{number}: {why}: {}", line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn the_patterns_catch_decisions_on_message_text() {
    let rust = compile(RUST_PATTERNS);
    let python = compile(PYTHON_PATTERNS);
    let caught =
        |patterns: &[(Regex, &str)], line: &str| patterns.iter().any(|(p, _)| p.is_match(line));
    for bad in [
        r#"if e.to_string().contains("NoSuchKey") {"#,
        r#"let tls = store.describe().contains(" at https://");"#,
        r#"errors.iter().find(|(_, e)| e.contains(name))"#,
        r#"if error.message.starts_with("load") {"#,
        r#"match format!("{err}").contains("412") {"#,
        r#"let code = body.find("<Code>");"#,
    ] {
        assert!(caught(&rust, bad), "not caught: {bad}");
    }
    for good in [
        r#"if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&key_len) {"#,
        r#"if name.starts_with(TEMPORARY_START) {"#,
        r#"let status = answer.status;"#,
    ] {
        assert!(!caught(&rust, good), "flagged: {good}");
    }
    for bad in [
        r#"if "timed out" in str(exc):"#,
        r#"if exc.message.startswith("store"):"#,
        r#"if "NoSuchBucket" in error.message:"#,
        r#"m = re.search(r"status (\d+)", str(e))"#,
    ] {
        assert!(caught(&python, bad), "not caught: {bad}");
    }
    for good in [
        r#"if exc.status == Status.NOT_FOUND:"#,
        r#"if key in TIER_KEYS:"#,
        r#"self._fail_at_submission(job_id, kind, keys, str(exc))"#,
    ] {
        assert!(!caught(&python, good), "flagged: {good}");
    }
}

#[test]
fn no_decision_depends_on_message_text() {
    let root = root();
    let mut found = findings(
        &root,
        &["src", "core/src", "cli/src"],
        "rs",
        &compile(RUST_PATTERNS),
    );
    found.extend(findings(
        &root,
        &["python/kvtier"],
        "py",
        &compile(PYTHON_PATTERNS),
    ));
    assert!(
        found.is_empty(),
        "decisions made from the wording of a message (use a status, an error type or the \
         store's error code; or, if the line is not a decision, add it to NOT_DECISIONS with \
         the reason):\n{}",
        found.join("\n")
    );
}

#[test]
fn every_excused_line_still_exists() {
    // An excuse for a line that is gone would excuse a different line later.
    let root = root();
    for (file, line) in NOT_DECISIONS {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        assert!(
            text.lines().any(|l| l.trim() == *line),
            "{file} no longer holds {line:?}: remove it from NOT_DECISIONS"
        );
    }
}
