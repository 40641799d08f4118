//! The layering, checked: what sits above is never imported from below, and no module's
//! imports run in a circle. The crates are layered by Cargo (kvtier-core knows neither the C
//! ABI nor the command line: it has no dependency on them); inside kvtier-core, the modules
//! are layered by `CORE_LAYERS`, which this test holds against every `crate::` path of the
//! sources. A failure names the file and the path that break the rule.
//!
//! How a path is read: `crate::a::b::c`, `super::x` and a `use` of a child module
//! (`use jobs::JobTable` in the module that declares `mod jobs`) name the deepest module
//! of the path that has a file. A module may use the modules that enclose it (a child
//! reaching its parent's types through `super::` is the parent's front door, not a
//! circle); tests (`#[cfg(test)] mod …`) and comments are not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

/// kvtier-core's top-level modules, lowest layer first. A module may import modules of
/// lower layers only (not its own layer's other modules, nor higher ones).
const CORE_LAYERS: &[&[&str]] = &[
    // Leaves: no other module of the crate.
    &["error", "redact", "integrity", "signals"],
    // The key layout and object names.
    &["key"],
    // vLLM's namespace string (built from key bytes).
    &["namespace"],
    &["config"],
    // The caller's memory: host pool, regions, the pieces of a key's object.
    &["memory"],
    &["encryption"],
    &["store"],
    &["engine"],
];

/// Dependencies a crate must not have, so that what is above stays above.
const FORBIDDEN_DEPENDENCIES: &[(&str, &[&str])] = &[
    (
        "core/Cargo.toml",
        &["kvtier", "kvtier-cli", "clap", "clap_complete", "humantime"],
    ),
    ("Cargo.toml", &["kvtier-cli", "clap", "clap_complete"]),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A module path (`["engine", "jobs"]`) for each source file of a crate's `src`.
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            let mut parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            out.insert(parts, path);
        }
    }
    out
}

/// The source without comments and without test modules.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            // Skip to the module's closing brace at the same indentation.
            let indent = line.len() - line.trim_start().len();
            let close = format!("{}}}", " ".repeat(indent));
            for skipped in lines.by_ref() {
                if skipped == close {
                    break;
                }
            }
            continue;
        }
        let code = match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Each module another module's code names: (importer, imported, the path as written).
fn edges(src: &Path) -> Vec<(Vec<String>, Vec<String>, String)> {
    let modules = modules(src);
    let path_re = Regex::new(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)").unwrap();
    let use_re =
        Regex::new(r"(?m)^\s*(?:pub(?:\([a-z]+\))?\s+)?use\s+([a-z_][a-z0-9_]*)::").unwrap();
    let mut out = Vec::new();
    for (module, file) in &modules {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let is_dir_module = matches!(
            file.file_stem().and_then(|s| s.to_str()),
            Some("mod" | "lib" | "main")
        );
        // The module `super::` names from this file.
        let parent: Vec<String> = module[..module.len().saturating_sub(1)].to_vec();
        let mut named: Vec<(Vec<String>, String)> = Vec::new();
        for caps in path_re.captures_iter(&code) {
            let segments: Vec<String> = caps[2]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            let mut base = if &caps[1] == "crate" {
                Vec::new()
            } else {
                parent.clone()
            };
            base.extend(segments);
            named.push((base, caps[0].to_string()));
        }
        if is_dir_module {
            for caps in use_re.captures_iter(&code) {
                let first = caps[1].to_string();
                let mut child = module.clone();
                child.push(first.clone());
                if modules.contains_key(&child) {
                    named.push((child, format!("use {first}::…")));
                }
            }
        }
        for (path, written) in named {
            // The deepest module of the path that has a file.
            let target = (0..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|prefix| modules.contains_key(prefix));
            let Some(target) = target else { continue };
            if &target == module || module.starts_with(&target) {
                continue; // itself, or a module that encloses it
            }
            out.push((module.clone(), target, written));
        }
    }
    out
}

fn layer_of(module: &[String]) -> Option<usize> {
    let top = module.first()?;
    CORE_LAYERS
        .iter()
        .position(|layer| layer.contains(&top.as_str()))
}

/// The core's imports that run up (or sideways within a layer of several modules).
fn upward_imports(edges: &[(Vec<String>, Vec<String>, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (from, to, written) in edges {
        if from.first() == to.first() {
            continue; // inside one top-level module: the circle check covers it
        }
        let (Some(lf), Some(lt)) = (layer_of(from), layer_of(to)) else {
            if !from.is_empty() && !to.is_empty() {
                out.push(format!(
                    "core/src/{}: `{written}`: a module missing from CORE_LAYERS",
                    from.join("/")
                ));
            }
            continue;
        };
        if lt >= lf {
            out.push(format!(
                "core/src/{} (layer {lf}) imports {} (layer {lt}) through `{written}`",
                from.join("/"),
                to.join("::"),
            ));
        }
    }
    out
}

/// Every circle of the module graph, as the modules on it, each named once.
fn circles(edges: &[(Vec<String>, Vec<String>, String)]) -> Vec<Vec<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to, _) in edges {
        graph
            .entry(from.join("::"))
            .or_default()
            .insert(to.join("::"));
        graph.entry(to.join("::")).or_default();
    }
    // Tarjan's strongly connected components; a component of two or more is a circle.
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in &s.graph[v] {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        graph: &graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !state.index.contains_key(v.as_str()) {
            visit(&mut state, v);
        }
    }
    state.found
}

/// The imports that tie a circle together, named.
fn describe(circle: &[String], edges: &[(Vec<String>, Vec<String>, String)]) -> String {
    let members: BTreeSet<&str> = circle.iter().map(String::as_str).collect();
    let ties: Vec<String> = edges
        .iter()
        .filter(|(f, t, _)| {
            members.contains(f.join("::").as_str()) && members.contains(t.join("::").as_str())
        })
        .map(|(f, t, w)| format!("{} -> {} (`{w}`)", f.join("::"), t.join("::")))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    format!("circle {{{}}}: {}", circle.join(", "), ties.join("; "))
}

#[test]
fn core_modules_import_only_lower_layers() {
    let edges = edges(&root().join("core/src"));
    assert!(
        edges.len() > 50,
        "the import reader found only {} imports in core/src: it is broken",
        edges.len()
    );
    let upward = upward_imports(&edges);
    assert!(
        upward.is_empty(),
        "imports against the layering (CORE_LAYERS in tests/layering.rs):\n  {}",
        upward.join("\n  ")
    );
}

#[test]
fn no_module_imports_run_in_a_circle() {
    let mut found = Vec::new();
    for src in ["core/src", "src", "cli/src"] {
        let edges = edges(&root().join(src));
        for circle in circles(&edges) {
            found.push(format!("{src}: {}", describe(&circle, &edges)));
        }
    }
    assert!(
        found.is_empty(),
        "imports in a circle:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn lower_crates_do_not_depend_on_higher_ones() {
    let dep_re = Regex::new(r#"(?m)^([A-Za-z0-9_-]+)(?:\.workspace)?\s*="#).unwrap();
    for (manifest, forbidden) in FORBIDDEN_DEPENDENCIES {
        let text = std::fs::read_to_string(root().join(manifest)).unwrap();
        // The [dependencies] table only (dev-dependencies may reach any crate).
        let deps = text
            .split("\n[dependencies]\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{manifest} has a [dependencies] table"));
        let deps = deps.split("\n[").next().unwrap();
        for caps in dep_re.captures_iter(deps) {
            assert!(
                !forbidden.contains(&&caps[1]),
                "{manifest} depends on {}, a crate above it",
                &caps[1]
            );
        }
    }
}

/// The checker itself: an upward import and a circle, written into a scratch tree, are
/// found and named.
#[test]
fn the_checker_finds_an_upward_import_and_a_circle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("engine")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod key;\nmod engine;\n").unwrap();
    std::fs::write(
        src.join("key.rs"),
        "use crate::engine::Tier;\n#[cfg(test)]\nmod tests {\n    use crate::store::X;\n}\n",
    )
    .unwrap();
    std::fs::write(
        src.join("engine/mod.rs"),
        "mod a;\nmod b;\npub struct Tier;\n",
    )
    .unwrap();
    std::fs::write(src.join("engine/a.rs"), "use super::b::B;\npub struct A;\n").unwrap();
    std::fs::write(
        src.join("engine/b.rs"),
        "// use crate::key::nothing;\npub struct B(super::a::A);\n",
    )
    .unwrap();
    let edges = edges(src);
    let upward = upward_imports(&edges);
    assert_eq!(upward.len(), 1, "{upward:?}");
    assert!(upward[0].contains("core/src/key") && upward[0].contains("crate::engine::Tier"));
    let found = circles(&edges);
    assert_eq!(
        found,
        vec![vec!["engine::a".to_string(), "engine::b".to_string()]]
    );
}
