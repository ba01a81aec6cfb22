//! The crate graph and the modules inside each crate, as the design keeps them: the worker builds
//! without the MCP hub (and so without `rmcp`) and without the setup commands, the configuration
//! crate starts no process, and no library crate has modules that import each other in a circle.
//!
//! Cargo itself is asked (the `CARGO` that runs these tests, offline and locked), and each library
//! crate's sources are read as they are in the work tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The workspace's root folder: two levels above this crate's manifest.
fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_owned();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("[workspace]"), "{}", root.display());
    root
}

/// The cargo running these tests, in the workspace root, never reaching the network.
fn cargo(args: &[&str]) -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let out = Command::new(cargo)
        .args(args)
        .args(["--offline", "--locked"])
        .current_dir(workspace_root())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo {args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// The packages `package` is built with, itself included: its normal dependencies, direct or not,
/// on this host (not what its tests or build scripts use), by name, with cargo's tree to show.
fn built_with(package: &str) -> (BTreeSet<String>, String) {
    let tree = cargo(&[
        "tree", "-p", package, "-e", "normal", "--prefix", "none", "--format", "{p}",
    ]);
    // Each line is `name vVERSION [(path)] [(*)]`: the names, exactly.
    let names = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    (names, tree)
}

#[test]
fn the_worker_is_built_without_the_hub_setup_or_rmcp() {
    let (names, tree) = built_with("pi-dispatch-worker");
    // The tree is the real one: the worker and what it is made of are in it.
    for present in [
        "pi-dispatch-worker",
        "pi-dispatch-queue",
        "pi-dispatch-sandbox",
    ] {
        assert!(
            names.contains(present),
            "{present} is missing from:\n{tree}"
        );
    }
    for absent in ["rmcp", "pi-dispatch-hub", "pi-dispatch-setup"] {
        assert!(
            !names.contains(absent),
            "the worker depends on {absent} (cargo tree -p pi-dispatch-worker -i {absent}):\n{tree}"
        );
    }
}

#[test]
fn the_configuration_starts_no_process() {
    let (names, tree) = built_with("pi-dispatch-config");
    // The tree is the real one: config reads JSON.
    assert!(names.contains("serde_json"), "{tree}");
    // Crates whose purpose is to start processes, or to run them asynchronously.
    for spawner in [
        "pi-dispatch-spawn",
        "tokio",
        "nix",
        "command-fds",
        "close_fds",
    ] {
        assert!(
            !names.contains(spawner),
            "pi-dispatch-config depends on {spawner} (cargo tree -p pi-dispatch-config -i {spawner}):\n{tree}"
        );
    }
}

/// Each workspace crate and the workspace crates it is built with (normal dependencies), as cargo
/// has them, by short name (`pi-dispatch-worker` is `worker`).
fn workspace_graph() -> BTreeMap<String, BTreeSet<String>> {
    let metadata: Value =
        serde_json::from_str(&cargo(&["metadata", "--no-deps", "--format-version", "1"])).unwrap();
    let short = |name: &str| name.strip_prefix("pi-dispatch-").unwrap_or(name).to_owned();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["name"].as_str())
                .filter(|n| n.starts_with("pi-dispatch"))
                .map(short)
                .collect();
            (short(p["name"].as_str().unwrap()), deps)
        })
        .collect()
}

/// The graph `crates/README.md` draws: a line `- \`name\`: \`dep\`, \`dep\`` (or `none`) a crate.
fn documented_graph() -> BTreeMap<String, BTreeSet<String>> {
    let readme = std::fs::read_to_string(workspace_root().join("crates/README.md")).unwrap();
    let section = readme
        .split("## How they depend on each other")
        .nth(1)
        .expect("crates/README.md draws the crate graph");
    section
        .lines()
        .filter_map(|l| l.strip_prefix("- `"))
        .map(|l| {
            let (name, deps) = l.split_once("`:").unwrap();
            let deps = deps
                .split(',')
                .map(|d| d.trim().trim_matches('`').to_owned())
                .filter(|d| !d.is_empty() && d != "none")
                .collect();
            (name.to_owned(), deps)
        })
        .collect()
}

#[test]
fn the_crate_graph_is_the_one_the_readme_draws_and_keeps_its_shape() {
    let graph = workspace_graph();
    // The probe read the real graph: the worker is built with the queue.
    assert!(graph["worker"].contains("queue"), "{graph:#?}");
    assert_eq!(
        documented_graph(),
        graph,
        "crates/README.md's graph is not cargo's"
    );
    let users_of = |name: &str| -> BTreeSet<&str> {
        graph
            .iter()
            .filter(|(_, deps)| deps.contains(name))
            .map(|(n, _)| n.as_str())
            .collect()
    };
    // Only the binary and the benchmarks carry out jobs.
    assert_eq!(users_of("worker"), BTreeSet::from(["pi-dispatch", "bench"]));
    // What crosses a process boundary is built without any other crate of the workspace (no
    // file reader among them).
    assert!(graph["protocol"].is_empty(), "{:?}", graph["protocol"]);
    // What tests share is built without any product crate.
    assert!(graph["testkit"].is_empty(), "{:?}", graph["testkit"]);
    // The panel reads records, and never starts a job.
    for absent in ["worker", "sandbox", "hub", "pickup", "forge", "egress"] {
        assert!(
            !graph["panel"].contains(absent),
            "the panel depends on {absent}"
        );
    }
}

// ---- Modules inside each library crate ----

/// Rust source with comments (doc comments too), string, byte-string and character literals
/// blanked out: what is left is code. Line breaks are kept, so positions keep their line.
fn code_only(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prev_ident = i > 0 && is_ident(chars[i - 1]);
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
                out.push(' ');
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
            continue;
        }
        // A raw string: r"…", r#"…"#, br"…", cr"…" (but not a raw identifier, r#name).
        if !prev_ident && (c == 'r' || (matches!(c, 'b' | 'c') && next == Some('r'))) {
            let mut j = if c == 'r' { i + 1 } else { i + 2 };
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) == Some(&'"') {
                let close: Vec<char> = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                let mut k = j + 1;
                while k < chars.len() && !chars[k..].starts_with(&close) {
                    k += 1;
                }
                let end = (k + close.len()).min(chars.len());
                for &ch in &chars[i..end] {
                    blank(&mut out, ch);
                }
                i = end;
                continue;
            }
        }
        // A string: "…", b"…", c"…", with escapes.
        if c == '"' || (!prev_ident && matches!(c, 'b' | 'c') && next == Some('"')) {
            let mut k = if c == '"' { i + 1 } else { i + 2 };
            while k < chars.len() && chars[k] != '"' {
                k += if chars[k] == '\\' { 2 } else { 1 };
            }
            let end = (k + 1).min(chars.len());
            for &ch in &chars[i..end] {
                blank(&mut out, ch);
            }
            i = end;
            continue;
        }
        // A character literal ('x', '\n', '\u{1F600}', b'x'); a lifetime or label ('a) stays.
        if c == '\'' {
            let end = if next == Some('\\') {
                let mut k = i + 3;
                while k < chars.len() && chars[k] != '\'' {
                    k += 1;
                }
                Some(k + 1)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            };
            if let Some(end) = end {
                let end = end.min(chars.len());
                for &ch in &chars[i..end] {
                    blank(&mut out, ch);
                }
                i = end;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

/// The identifier starting at `i` (after blanks), and where it ends.
fn ident_at(chars: &[char], mut i: usize) -> Option<(String, usize)> {
    while i < chars.len() && chars[i].is_whitespace() {
        i += 1;
    }
    let start = i;
    while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
        i += 1;
    }
    (i > start).then(|| (chars[start..i].iter().collect(), i))
}

/// After `i` (blanks skipped): `::`, and where it ends.
fn path_sep_at(chars: &[char], mut i: usize) -> Option<usize> {
    while i < chars.len() && chars[i].is_whitespace() {
        i += 1;
    }
    (chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':')).then_some(i + 2)
}

/// The first segment after every `crate::` in `code`, with its line: `crate::a::B` gives `a`, and
/// `crate::{a::B, b}` gives `a` and `b`.
fn crate_paths(code: &str) -> Vec<(String, usize)> {
    let chars: Vec<char> = code.chars().collect();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let line_of = |i: usize| chars[..i].iter().filter(|c| **c == '\n').count() + 1;
    let mut found = Vec::new();
    let mut i = 0;
    while i + 5 <= chars.len() {
        let word = chars[i..i + 5].iter().collect::<String>() == "crate";
        let alone =
            (i == 0 || !is_ident(chars[i - 1])) && chars.get(i + 5).is_none_or(|c| !is_ident(*c));
        if !(word && alone) {
            i += 1;
            continue;
        }
        let line = line_of(i);
        let Some(mut j) = path_sep_at(&chars, i + 5) else {
            i += 5;
            continue;
        };
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        if chars.get(j) == Some(&'{') {
            // A group: the first segment of each item at the group's own depth.
            let mut depth = 0;
            let mut item_starts = true;
            while j < chars.len() {
                match chars[j] {
                    '{' => {
                        depth += 1;
                        item_starts = depth == 1;
                        j += 1;
                    }
                    '}' => {
                        depth -= 1;
                        j += 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' => {
                        item_starts = depth == 1;
                        j += 1;
                    }
                    c if c.is_whitespace() => j += 1,
                    _ if item_starts => {
                        item_starts = false;
                        match ident_at(&chars, j) {
                            Some((name, end)) => {
                                found.push((name, line_of(j)));
                                j = end;
                            }
                            None => j += 1,
                        }
                    }
                    _ => j += 1,
                }
            }
        } else if let Some((name, end)) = ident_at(&chars, j) {
            found.push((name, line));
            j = end;
        }
        i = j.max(i + 5);
    }
    found
}

/// The names the crate root re-exports from its modules (`pub use m::{A, B as C};` makes `A` and
/// `C` stand for `m`), so that `crate::A` in another module is a use of `m`.
fn root_reexports(root_code: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for statement in root_code.split(';') {
        let tokens: Vec<String> = statement
            .replace("::", " :: ")
            .replace(['{', '}', ','], " , ")
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let Some(at) = tokens.iter().position(|t| t == "use") else {
            continue;
        };
        if at == 0 || !tokens[at - 1].starts_with("pub") {
            continue;
        }
        let mut path = &tokens[at + 1..];
        if path.first().is_some_and(|t| t == "crate" || t == "self") {
            path = &path[2.min(path.len())..];
        }
        let Some(module) = path.first().filter(|m| modules.contains(*m)) else {
            continue;
        };
        // An exported name ends an item: it comes before a `,` or the end of the statement.
        for (k, token) in path.iter().enumerate() {
            let ends_item = path.get(k + 1).is_none_or(|t| t == ",");
            let is_name = token.chars().all(|c| c.is_alphanumeric() || c == '_');
            if ends_item && is_name && token != "self" && k > 0 {
                out.insert(token.clone(), module.clone());
            }
        }
    }
    out
}

/// A use of one top-level module by another, and where it is first seen.
struct Edge {
    to: String,
    at: String,
}

/// Every Rust file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The top-level modules of the library whose root is `lib_rs`, each with the modules it uses
/// through `crate::`. A file belongs to the top-level module its path starts with; a file named by
/// `#[path = "…"]` belongs to the module of the file that names it, and `X_tests.rs` otherwise to
/// module `X`. The root itself, and the binaries under `src/bin`, are left out.
fn module_graph(lib_rs: &Path) -> BTreeMap<String, BTreeMap<String, Edge>> {
    let src = lib_rs.parent().unwrap();
    let files: Vec<PathBuf> = rust_files(src)
        .into_iter()
        .filter(|f| f != lib_rs && !f.starts_with(src.join("bin")))
        .collect();
    let top = |file: &Path| -> String {
        let rel = file.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        first.strip_suffix(".rs").unwrap_or(&first).to_owned()
    };
    // Files another file names with #[path]: they belong to that file's module.
    let mut owner: BTreeMap<PathBuf, String> = BTreeMap::new();
    for file in std::iter::once(lib_rs.to_owned()).chain(files.iter().cloned()) {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines().map(str::trim) {
            let Some(rest) = line.strip_prefix("#[path") else {
                continue;
            };
            let Some(named) = rest.split('"').nth(1) else {
                continue;
            };
            let named = file.parent().unwrap().join(named);
            let module = if file == lib_rs {
                top(&named)
            } else {
                top(&file)
            };
            owner.insert(named, module);
        }
    }
    let names: BTreeSet<String> = files
        .iter()
        .map(|f| top(f))
        .filter(|m| !m.ends_with("_tests"))
        .collect();
    let module_of = |file: &Path| -> Option<String> {
        if let Some(m) = owner.get(file) {
            return Some(m.clone());
        }
        let m = top(file);
        match m.strip_suffix("_tests") {
            // Tests of a module are part of it; tests of the root are the root's.
            Some(of) => names.contains(of).then(|| of.to_owned()),
            None => Some(m),
        }
    };
    let root_code = code_only(&std::fs::read_to_string(lib_rs).unwrap());
    let reexports = root_reexports(&root_code, &names);
    let mut graph: BTreeMap<String, BTreeMap<String, Edge>> =
        names.iter().map(|m| (m.clone(), BTreeMap::new())).collect();
    for file in &files {
        let Some(from) = module_of(file) else {
            continue;
        };
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        for (name, line) in crate_paths(&code) {
            let to = if names.contains(&name) {
                name
            } else if let Some(m) = reexports.get(&name) {
                m.clone()
            } else {
                continue;
            };
            if to != from {
                let at = format!("{}:{line}", file.strip_prefix(src).unwrap().display());
                graph
                    .entry(from.clone())
                    .or_default()
                    .entry(to.clone())
                    .or_insert(Edge { to, at });
            }
        }
    }
    graph
}

/// Every cycle a depth-first walk meets, each as the modules in order and where each use is.
fn cycles(graph: &BTreeMap<String, BTreeMap<String, Edge>>) -> Vec<String> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn walk(
        node: &str,
        graph: &BTreeMap<String, BTreeMap<String, Edge>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
        found: &mut Vec<String>,
    ) {
        marks.insert(node.to_owned(), Mark::Open);
        stack.push(node.to_owned());
        for edge in graph.get(node).into_iter().flat_map(BTreeMap::values) {
            match marks.get(&edge.to).copied().unwrap_or(Mark::New) {
                Mark::New => walk(&edge.to, graph, marks, stack, found),
                Mark::Open => {
                    let start = stack.iter().position(|m| *m == edge.to).unwrap();
                    let ring: Vec<&String> = stack[start..].iter().chain([&edge.to]).collect();
                    let uses: Vec<String> = ring
                        .windows(2)
                        .map(|w| format!("{} uses {} at {}", w[0], w[1], graph[w[0]][w[1]].at))
                        .collect();
                    found.push(format!(
                        "{} ({})",
                        ring.iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(" -> "),
                        uses.join("; ")
                    ));
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        marks.insert(node.to_owned(), Mark::Done);
    }
    let mut marks = BTreeMap::new();
    let mut found = Vec::new();
    for node in graph.keys() {
        if marks.get(node).copied().unwrap_or(Mark::New) == Mark::New {
            walk(node, graph, &mut marks, &mut Vec::new(), &mut found);
        }
    }
    found
}

/// Each library crate of the workspace, by package name, with the path of its root file.
fn library_crates() -> Vec<(String, PathBuf)> {
    let metadata: Value =
        serde_json::from_str(&cargo(&["metadata", "--format-version", "1", "--no-deps"])).unwrap();
    let members: BTreeSet<&str> = metadata["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    let mut out = Vec::new();
    for package in metadata["packages"].as_array().unwrap() {
        if !members.contains(package["id"].as_str().unwrap()) {
            continue;
        }
        for target in package["targets"].as_array().unwrap() {
            let kinds = target["kind"].as_array().unwrap();
            if kinds.iter().any(|k| k == "lib" || k == "rlib") {
                out.push((
                    package["name"].as_str().unwrap().to_owned(),
                    PathBuf::from(target["src_path"].as_str().unwrap()),
                ));
            }
        }
    }
    out
}

/// Each library crate says in its entry's documentation where it stands on the job's path (queue,
/// worker, sandbox, runner, pi, exit line, record), so a reader knows where they are.
#[test]
fn each_library_crate_says_its_place_on_the_jobs_path() {
    let crates = library_crates();
    assert!(crates.len() >= 10, "{crates:?}");
    for (name, lib) in crates {
        let text = std::fs::read_to_string(&lib).unwrap();
        let doc: Vec<&str> = text.lines().take_while(|l| l.starts_with("//!")).collect();
        assert!(
            doc.iter().any(|l| l.starts_with("//! On the job's path: ")),
            "{name} ({}) does not say its place on the job's path",
            lib.display()
        );
    }
}

#[test]
fn no_library_crate_has_a_module_cycle() {
    let crates = library_crates();
    assert!(crates.len() >= 8, "{crates:?}");
    let mut uses = 0;
    let mut problems = Vec::new();
    for (name, lib_rs) in &crates {
        let graph = module_graph(lib_rs);
        uses += graph.values().map(BTreeMap::len).sum::<usize>();
        for cycle in cycles(&graph) {
            problems.push(format!("{name}: {cycle}"));
        }
    }
    // The modules of today's crates do use each other: the check reads something.
    assert!(uses > 20, "only {uses} uses between modules were found");
    assert!(
        problems.is_empty(),
        "modules that import each other in a circle:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_module_check_sees_a_cycle_and_only_code() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let write = |rel: &str, text: &str| {
        let path = src.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "lib.rs",
        "pub mod a;\npub mod b;\npub mod c;\npub mod d;\npub use d::{Thing as Other, More};\n",
    );
    // a -> b through a group, b -> c through a nested module's file, c -> a through a re-export
    // at the root: a cycle.
    write("a.rs", "use crate::{\n    b::X,\n    b,\n};\n");
    write("b/mod.rs", "mod inner;\n");
    write("b/inner.rs", "pub use crate::c::Y;\n");
    write(
        "c.rs",
        "#[cfg(test)]\n#[path = \"c_more_tests.rs\"]\nmod tests;\n",
    );
    write(
        "c_more_tests.rs",
        "fn t() { let _ = crate::Other::new(); }\n",
    );
    // d names the others only in comments, strings and characters, and its tests file only names
    // d: no use.
    write(
        "d.rs",
        concat!(
            "//! crate::a\n",
            "/// crate::b\n",
            "/* crate::c /* crate::a */ crate::b */\n",
            "const S: &str = \"crate::a \\\" crate::b\";\n",
            "const R: &str = r#\"crate::c \"# ;\n",
            "const Q: char = '\"'; fn f<'a>(x: &'a str) -> &'a str { x }\n",
            "const B: &[u8] = b\"crate::a\";\n",
            "pub struct Thing; pub struct More;\n",
        ),
    );
    write("d_tests.rs", "use crate::d::Thing;\n");
    let graph = module_graph(&src.join("lib.rs"));
    let edges: Vec<String> = graph
        .iter()
        .flat_map(|(from, to)| to.keys().map(move |t| format!("{from}->{t}")))
        .collect();
    assert_eq!(edges, ["a->b", "b->c", "c->d"], "{edges:?}");

    // The re-export's module takes part in a cycle when it uses a module back.
    write(
        "d.rs",
        "pub struct Thing; pub struct More;\nuse crate::a as _;\n",
    );
    let found = cycles(&module_graph(&src.join("lib.rs")));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("a -> b -> c -> d -> a (a uses b at a.rs:2; b uses c at b/inner.rs:1; c uses d at c_more_tests.rs:1; d uses a at d.rs:2)"),
        "{found:?}"
    );
}

// ---- Function length ----

/// The longest a production function may be, in lines from its `fn` to its closing brace: a longer
/// one is split into named steps.
const MAX_FUNCTION_LINES: usize = 80;

/// `code` (as [`code_only`] leaves it) with every `#[cfg(test)]` module's block blanked out, line
/// breaks kept.
fn without_test_modules(code: &str) -> String {
    let mut out: Vec<char> = code.chars().collect();
    let mut from = 0;
    loop {
        let text: String = out.iter().collect();
        let Some(at) = text[from..].find("#[cfg(test)]").map(|i| from + i) else {
            break;
        };
        from = at + 1;
        // The attribute's item: `mod name {` (a `mod name;` names a file, left to the caller).
        let rest = text[at + "#[cfg(test)]".len()..].trim_start();
        let Some(after_mod) = rest.strip_prefix("mod ") else {
            continue;
        };
        let after_mod: Vec<char> = after_mod.chars().collect();
        let Some((_, after_name)) = ident_at(&after_mod, 0) else {
            continue;
        };
        if after_mod[after_name..].iter().find(|c| !c.is_whitespace()) != Some(&'{') {
            continue;
        }
        let chars_before = text[..at].chars().count();
        let open = chars_before + text[at..].chars().position(|c| c == '{').unwrap();
        let end = block_end(&out, open);
        for c in &mut out[chars_before..=end] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    }
    out.into_iter().collect()
}

/// The position of the `}` that closes the `{` at `open`.
fn block_end(chars: &[char], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    chars.len() - 1
}

/// Each function with a body in `code` (as [`code_only`] leaves it): its name, its first line and
/// its length in lines.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let chars: Vec<char> = code.chars().collect();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let line_of = |i: usize| chars[..i].iter().filter(|c| **c == '\n').count() + 1;
    let mut found = Vec::new();
    for i in 0..chars.len().saturating_sub(2) {
        let keyword = chars[i] == 'f' && chars[i + 1] == 'n';
        let alone = (i == 0 || !is_ident(chars[i - 1])) && !is_ident(chars[i + 2]);
        if !(keyword && alone) {
            continue;
        }
        let Some((name, mut j)) = ident_at(&chars, i + 2) else {
            continue;
        };
        // The body opens at the first `{` outside the signature's brackets (`[u8; 2]`).
        let mut depth = 0i32;
        while j < chars.len() && !(depth == 0 && (chars[j] == '{' || chars[j] == ';')) {
            match chars[j] {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                _ => {}
            }
            j += 1;
        }
        if chars.get(j) != Some(&'{') {
            continue;
        }
        let (first, last) = (line_of(i), line_of(block_end(&chars, j)));
        found.push((name, first, last - first + 1));
    }
    found
}

/// The production sources: each workspace member's `src`, but the test kit's and the benchmark's,
/// without the files that only tests compile (`…tests.rs`).
fn production_sources() -> Vec<PathBuf> {
    let metadata: Value =
        serde_json::from_str(&cargo(&["metadata", "--format-version", "1", "--no-deps"])).unwrap();
    let mut out = Vec::new();
    for package in metadata["packages"].as_array().unwrap() {
        let name = package["name"].as_str().unwrap();
        if matches!(name, "pi-dispatch-testkit" | "pi-dispatch-bench") {
            continue;
        }
        let manifest = PathBuf::from(package["manifest_path"].as_str().unwrap());
        let src = manifest.parent().unwrap().join("src");
        out.extend(
            rust_files(&src)
                .into_iter()
                .filter(|f| !f.to_string_lossy().ends_with("tests.rs")),
        );
    }
    out
}

#[test]
fn no_production_function_is_longer_than_its_bound() {
    let mut measured = 0;
    let mut long = Vec::new();
    for file in production_sources() {
        let code = without_test_modules(&code_only(&std::fs::read_to_string(&file).unwrap()));
        for (name, line, lines) in functions(&code) {
            measured += 1;
            if lines > MAX_FUNCTION_LINES {
                long.push(format!("{}:{line} {name}: {lines} lines", file.display()));
            }
        }
    }
    // The workspace has well over a thousand functions: the check read them.
    assert!(measured > 1000, "only {measured} functions were measured");
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_length_check_measures_bodies_and_leaves_tests_out() {
    let src = concat!(
        "/// fn in_a_comment() {\n",
        "pub fn three(x: u8) -> u8 {\n",
        "    let s = \"fn in_a_string() { }\";\n",
        "    x }\n",
        "trait T { fn declared(&self); }\n",
        "fn nested() {\n",
        "    fn inner() -> [u8; 2] { [0; 2] }\n",
        "    let _ = '{';\n",
        "}\n",
        "#[cfg(test)]\n",
        "mod tests {\n",
        "    fn a_test() {}\n",
        "}\n",
    );
    let found = functions(&without_test_modules(&code_only(src)));
    let expected = [("three", 2, 3), ("nested", 6, 4), ("inner", 7, 1)];
    let expected: Vec<(String, usize, usize)> = expected
        .iter()
        .map(|(n, l, len)| ((*n).to_owned(), *l, *len))
        .collect();
    assert_eq!(found, expected);
}

// ---- The command modules ----

/// The modules under `pi-dispatch`'s `src/cmd`, each with the command modules it uses (through
/// `crate::cmd::` or `super::`).
fn command_module_graph() -> BTreeMap<String, BTreeMap<String, Edge>> {
    let cmd = workspace_root().join("crates/pi-dispatch/src/cmd");
    let files: Vec<PathBuf> = rust_files(&cmd)
        .into_iter()
        .filter(|f| !f.ends_with("mod.rs"))
        .collect();
    let module = |f: &Path| f.file_stem().unwrap().to_string_lossy().into_owned();
    let names: BTreeSet<String> = files.iter().map(|f| module(f)).collect();
    let mut graph: BTreeMap<String, BTreeMap<String, Edge>> =
        names.iter().map(|m| (m.clone(), BTreeMap::new())).collect();
    for file in &files {
        let from = module(file);
        let code = without_test_modules(&code_only(&std::fs::read_to_string(file).unwrap()))
            .replace("crate::cmd::", "crate::")
            .replace("super::", "crate::");
        for (to, line) in crate_paths(&code) {
            if names.contains(&to) && to != from {
                let at = format!("cmd/{from}.rs:{line}");
                graph
                    .entry(from.clone())
                    .or_default()
                    .entry(to.clone())
                    .or_insert(Edge { to, at });
            }
        }
    }
    graph
}

#[test]
fn no_command_module_imports_another_in_a_circle() {
    let graph = command_module_graph();
    let uses: usize = graph.values().map(BTreeMap::len).sum();
    // Commands share some steps (`runs::records`, `run::queue_job`): the check reads something.
    assert!(
        graph.len() > 15 && uses > 5,
        "{} modules, {uses} uses",
        graph.len()
    );
    assert!(
        graph["rerun"].contains_key("run"),
        "{:?}",
        graph["rerun"].keys()
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "command modules that import each other in a circle:\n{}",
        found.join("\n")
    );
}

// ---- The worker's record and steps ----

/// Where `code` writes a field of a value named `record` (`record.outcome = …`, not `==`), or
/// takes a record to change it (`&mut Record`, `mut record`): each with its line.
fn record_changes(code: &str) -> Vec<(usize, String)> {
    let line_of = |i: usize| code[..i].matches('\n').count() + 1;
    let mut found = Vec::new();
    for (at, _) in code.match_indices("record.") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + "record.".len()..];
        let field: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let after = rest[field.len()..].trim_start();
        let assigned =
            after.starts_with('=') && !after.starts_with("==") && !after.starts_with("=>");
        if !field.is_empty() && assigned {
            found.push((line_of(at), format!("record.{field} =")));
        }
    }
    for pattern in ["&mut Record", "mut record"] {
        for (at, _) in code.match_indices(pattern) {
            found.push((line_of(at), pattern.to_owned()));
        }
    }
    found
}

/// The worker finishes a job's record once, from what its steps returned (`Draft::finish_at`):
/// none of its production code changes a record after that, and the sandbox step is a type of its
/// own rather than more of `impl Worker` in another file.
#[test]
fn the_worker_finishes_a_record_once_and_its_sandbox_step_is_its_own_type() {
    let src = workspace_root().join("crates/worker/src");
    let mut changes = Vec::new();
    let mut worker_impls = Vec::new();
    for file in rust_files(&src) {
        if file.to_string_lossy().ends_with("tests.rs") {
            continue;
        }
        let code = without_test_modules(&code_only(&std::fs::read_to_string(&file).unwrap()));
        let name = file.strip_prefix(&src).unwrap().display().to_string();
        for (line, what) in record_changes(&code) {
            changes.push(format!("{name}:{line} {what}"));
        }
        if code.contains("impl Worker {") {
            worker_impls.push(name);
        }
    }
    assert!(
        changes.is_empty(),
        "a finished record is changed:\n{}",
        changes.join("\n")
    );
    assert_eq!(worker_impls, ["pipeline.rs"]);
    // The check sees a change where there is one.
    let probe = "fn f(record: Record) { let mut record = record; record.outcome = x; }";
    assert_eq!(record_changes(&code_only(probe)).len(), 2);
    assert!(record_changes("if record.outcome == x {}").is_empty());
    assert!(record_changes("match r { _ if record.done => 1 }").is_empty());
}
