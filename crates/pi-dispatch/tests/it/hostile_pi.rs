//! A hijacked tool against pi itself, in a real job through the worker: pi's bash tool looks for pi
//! to signal it for Node's inspector, rewrites pi's shell, settings and tools and moves its agent
//! folder away, raises its core limits and dumps a core, traces pi and reads its memory and
//! environment. Then a second command runs through pi's shell: had the shell been swapped, it would
//! have copied pi's environment (the hub's token) into the repository. Each probe prints that it
//! ran; the tool finds no pi at all (its commands run in a namespace of their own).

use serde_json::json;
use testkit::fake_model::Step;

use crate::worker::Service;

#[test]
fn a_tool_of_pis_cannot_take_pi_over() {
    let s = Service::new(
        vec![
            Step::call("bash", json!({"command": "sh /workspace/pi.sh"})),
            Step::call(
                "bash",
                json!({"command": "echo second command; ls /workspace/stolen-env 2>&1; true"}),
            ),
            Step::text("done"),
        ],
        |_| json!({"everything": crate::worker::stdio(Some("direct"))}),
        "",
    );
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/hostile/pi.sh"),
    )
    .unwrap();
    std::fs::write(s.repo.join("pi.sh"), text).unwrap();
    let (_, record, results, _) = s.complete("Look around.", "everything");
    assert_eq!(record["outcome"], "completed", "{record:#}");
    let attack = &results[1];
    if std::env::var_os("HOSTILE_SHOW").is_some() {
        eprintln!("{attack}\n{}", results[2]);
    }
    // The probes ran: every section reached, pi's shell named. pi itself is out of the tools'
    // sight: they run in a process namespace of their own, which holds the attack and nothing of
    // pi's (not pi, its relays or the runner).
    assert!(attack.contains("== end"), "{attack}");
    assert!(attack.contains("== pi none"), "a tool found pi: {attack}");
    assert!(!attack.contains("signalled pi"), "{attack}");
    let seen = attack
        .split("== processes")
        .nth(1)
        .and_then(|r| r.split("== inspector").next())
        .unwrap_or_default();
    assert!(
        seen.contains("sh /workspace/pi.sh"),
        "the tool sees itself: {seen}"
    );
    for hidden in ["job-relay", "pi-dispatch job ", "server-everything"] {
        assert!(!seen.contains(hidden), "a tool sees {hidden}: {seen}");
    }
    assert!(
        attack.contains("inspector closed: ECONNREFUSED"),
        "the inspector was probed: {attack}"
    );
    assert!(
        attack.contains("pi's shell: /opt/pi-dispatch-image/bin/pi-dispatch-shell"),
        "{attack}"
    );
    assert!(attack.contains("shell attempts done"), "{attack}");
    for broke in [
        "INSPECTOR-OPEN",
        "SHELL-REPLACED",
        "SHELL-REMOVED",
        "SETTINGS-REPLACED",
        "TOOL-PLANTED",
        "SHIM-PLANTED",
        "AGENT-MOVED",
        "PARENT-MOVED",
        "PI-CORE-RAISED",
        "CORE-RAISED",
        "ATTACHED",
        "MEM-READ",
        "ENVIRON-READ",
    ] {
        assert!(!attack.contains(broke), "{broke}:\n{attack}");
    }
    assert!(attack.contains("hard core limit: 0"), "{attack}");
    assert!(attack.contains("no core file"), "{attack}");
    assert!(attack.contains("ptrace pi: refused"), "{attack}");
    // The second command ran through pi's own shell, which copied nothing.
    let second = &results[2];
    assert!(second.contains("second command"), "{second}");
    assert!(second.contains("No such file"), "{second}");
    assert!(!s.repo.join("stolen-env").exists());
}

/// pi's compile cache (issue 32): made at `image install`, read by the job's pi from the
/// read-only image through a link in the runner's own read-only part of pi's folder. A tool of pi's
/// finds the cache it would poison and can change neither it nor the link.
#[test]
fn pi_reads_the_images_compile_cache_and_a_tool_cannot_poison_it() {
    let probe = r#"c="$NODE_COMPILE_CACHE"; echo "cache: $c"
for d in "$c"/*; do echo "entry: $(basename "$d") -> $(readlink "$d")"; echo "files: $(ls "$d" | wc -l)"; done
for d in "$c"/*; do touch "$d/planted" 2>/dev/null && echo CACHE-WRITTEN; for f in "$d"/*; do [ -f "$f" ] && { : > "$f"; } 2>/dev/null && echo ENTRY-TRUNCATED; break; done; done
rm -f "$c"/* 2>/dev/null && echo LINK-REMOVED; ln -s /tmp "$c/v22-planted-$(id -u)" 2>/dev/null && echo LINK-PLANTED
echo "accepted: $(NODE_DEBUG_NATIVE=COMPILE_CACHE node --disable-sigusr1 /opt/pi-dispatch-image/node_modules/@earendil-works/pi-coding-agent/dist/bundle/cli.js --version 2>&1 | grep -c 'was accepted')"
echo "uid: $(id -u)"; echo probe done"#;
    let s = Service::new(
        vec![
            Step::call("bash", json!({ "command": probe })),
            Step::text("done"),
        ],
        |_| json!({"everything": crate::worker::stdio(Some("direct"))}),
        "",
    );
    // The image holds one cache, named for no user.
    let cache = s.d.path().join("images/pi-job/node-compile-cache");
    let made: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(made.len(), 1, "{made:?}");
    let version = &made[0];
    assert!(version.starts_with("v22."), "{version}");
    let files = std::fs::read_dir(cache.join(version)).unwrap().count();
    assert!(files > 3, "the cache holds {files} entries");

    let (_, _, results, _) = s.complete("Look at the cache.", "everything");
    let seen = &results[1];
    // The control: the probe ran to its end.
    assert!(seen.contains("probe done"), "{seen}");
    let uid = seen
        .lines()
        .find_map(|l| l.strip_prefix("uid: "))
        .unwrap_or_else(|| panic!("{seen}"));
    assert!(
        seen.contains("cache: /") && seen.contains("/pi-dispatch/node-compile-cache"),
        "pi has no compile cache: {seen}"
    );
    assert!(
        seen.contains(&format!(
            "entry: {version}-{uid} -> /opt/pi-dispatch-image/node-compile-cache/{version}"
        )),
        "{seen}"
    );
    assert!(seen.contains(&format!("files: {files}")), "{seen}");
    // Node, started as pi is, takes the cache's entries.
    let accepted: usize = seen
        .lines()
        .find_map(|l| l.strip_prefix("accepted: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{seen}"));
    assert!(accepted > 3, "Node took {accepted} entries: {seen}");
    for broke in [
        "CACHE-WRITTEN",
        "ENTRY-TRUNCATED",
        "LINK-REMOVED",
        "LINK-PLANTED",
    ] {
        assert!(!seen.contains(broke), "{broke}:\n{seen}");
    }
    // Nor did pi's own exit add to it.
    assert_eq!(
        std::fs::read_dir(cache.join(version)).unwrap().count(),
        files
    );
}
