//! `pi-dispatch import-pi` end to end, on a realistic host folder.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::common::{CANARIES, Deployment, HOST_MCP, Run, files_under, write_host_agent};

/// A deployment made by `init`, with a realistic host pi folder beside it.
fn deployment_with_host() -> (Deployment, PathBuf) {
    let d = Deployment::new();
    assert_eq!(d.run(&["init"]).code, 0);
    let host = write_host_agent(d.path());
    (d, host)
}

fn import(d: &Deployment, host: &Path, extra: &[&str]) -> Run {
    let mut args = vec!["import-pi", "--from", host.to_str().unwrap()];
    args.extend_from_slice(extra);
    d.run(&args)
}

fn overlay(d: &Deployment) -> PathBuf {
    d.path().join("pi-global")
}

/// The temporary files an interrupted write left in the overlay.
fn temp_files(d: &Deployment) -> Vec<String> {
    std::fs::read_dir(overlay(d))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".pi-dispatch-tmp"))
        .collect()
}

#[test]
fn stages_what_jobs_can_use_and_says_why_the_rest_stays() {
    let (d, host) = deployment_with_host();
    let run = import(&d, &host, &[]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    insta::assert_snapshot!("import_realistic", d.redact(&run.stdout));

    let staged = std::fs::read_to_string(overlay(&d).join("mcp.json")).unwrap();
    let check = d.run(&["mcp", "check", "--json"]);
    assert_eq!(check.code, 0, "the staged file is valid:\n{}", check.stdout);
    let report: serde_json::Value = serde_json::from_str(&check.stdout).unwrap();
    let names: Vec<&str> = report["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["docs", "memory", "wiki"]);
    assert!(!staged.contains("autoEnableCodemode"));

    assert!(overlay(&d).join("models.json").is_file());
    assert!(overlay(&d).join("APPEND_SYSTEM.md").is_file());
    assert!(overlay(&d).join("skills/review/SKILL.md").is_file());
    assert!(overlay(&d).join("skills/triage/SKILL.md").is_file());
    // The link inside skills/ is not copied, and pi's credential files never are.
    assert!(!overlay(&d).join("skills/review/notes.md").exists());
    for never in ["auth.json", "mcp-auth.json", "settings.json"] {
        assert!(!overlay(&d).join(never).exists(), "{never}");
    }
}

#[test]
fn no_credential_from_the_host_reaches_any_output_or_written_file() {
    let (d, host) = deployment_with_host();
    let mut outputs = vec![import(&d, &host, &[])];
    outputs.push(d.run(&["doctor"]));
    outputs.push(d.run(&["doctor", "--json"]));
    outputs.push(d.run(&["mcp", "check"]));
    outputs.push(d.run(&["mcp", "check", "--json"]));
    // A refused import prints too: a models.json with a literal key.
    std::fs::write(
        host.join("models.json"),
        r#"{"providers": {"p": {"apiKey": "CNRY-models-key-3e3e", "headers": {"Authorization": "Bearer CNRY-header-7f3a"}, "baseUrl": "https://u:CNRY-env-51b2@h.example.com/v1?k=CNRY-query-9c0d"}}}"#,
    )
    .unwrap();
    outputs.push(import(&d, &host, &[]));
    assert_eq!(outputs.last().unwrap().code, 1);
    for run in &outputs {
        for canary in CANARIES {
            assert!(!run.stdout.contains(canary), "{canary} in:\n{}", run.stdout);
            assert!(!run.stderr.contains(canary), "{canary} in:\n{}", run.stderr);
        }
    }
    // Every file pi-dispatch wrote: the whole deployment folder except the host's own files.
    for (path, bytes) in files_under(d.path()) {
        if path.starts_with(d.path().join("home")) || path.ends_with("outside-secret") {
            continue;
        }
        let text = String::from_utf8_lossy(&bytes);
        for canary in CANARIES {
            assert!(!text.contains(canary), "{canary} in {}", path.display());
        }
    }
}

#[test]
fn an_import_replaces_a_hand_written_overlay_file() {
    let (d, host) = deployment_with_host();
    let hand = r#"{"mcpServers": {"mine": {"url": "https://mine.example.com/mcp", "description": "Hand-written"}}}"#;
    std::fs::write(overlay(&d).join("mcp.json"), hand).unwrap();
    assert_eq!(import(&d, &host, &[]).code, 0);
    let now = std::fs::read_to_string(overlay(&d).join("mcp.json")).unwrap();
    assert!(!now.contains("mine"), "{now}");
    assert!(now.contains("\"docs\""));
}

#[test]
fn an_import_names_the_servers_and_providers_it_replaced_away() {
    let (d, host) = deployment_with_host();
    // Hand edits in the overlay: two servers and a provider the host does not have, beside ones it
    // has (docs, local), an odd name, and a value that must not be echoed.
    std::fs::write(
        overlay(&d).join("mcp.json"),
        r#"{"mcpServers": {
            "docs": {"url": "https://mcp.example.com/mcp", "description": "Docs"},
            "mine": {"url": "https://mine.example.com/mcp", "description": "Hand-written"},
            "x\u001b[2J": {"url": "https://x.example.com/mcp", "headers": {"A": "CNRY-header-7f3a"}, "description": "Odd"},
            "tickets": {"url": "https://tickets.example.com/mcp", "description": "Refused on the host"}
        }}"#,
    )
    .unwrap();
    std::fs::write(
        overlay(&d).join("models.json"),
        r#"{"providers": {"local": {"apiKey": "$LOCAL_LLM_KEY"}, "hand": {"apiKey": "CNRY-models-key-3e3e"}}}"#,
    )
    .unwrap();
    let run = import(&d, &host, &[]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    insta::assert_snapshot!("replaced_hand_edits", d.redact(&run.stdout));
    assert!(!run.stdout.contains('\u{1b}'), "{:?}", run.stdout);
    for canary in CANARIES {
        assert!(!run.stdout.contains(canary), "{canary}: {}", run.stdout);
    }
    // The files were replaced all the same.
    let mcp = std::fs::read_to_string(overlay(&d).join("mcp.json")).unwrap();
    assert!(!mcp.contains("mine"), "{mcp}");
    let models = std::fs::read_to_string(overlay(&d).join("models.json")).unwrap();
    assert!(!models.contains("hand"), "{models}");

    // The same import again drops nothing, and says nothing of it.
    let run = import(&d, &host, &[]);
    assert!(!run.stdout.contains("dropped"), "{}", run.stdout);

    // --no-mcp removes the file: every server it held is named.
    let run = import(&d, &host, &["--no-mcp"]);
    assert!(
        run.stdout.contains(
            "  dropped from the overlay's mcp.json (the import replaces it; hand edits there are lost): servers docs, memory, wiki\n"
        ),
        "{}",
        run.stdout
    );
    // A previous file that cannot be read is said to be so.
    std::fs::write(overlay(&d).join("mcp.json"), "{not json").unwrap();
    let run = import(&d, &host, &[]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(
        run.stdout
            .contains("the overlay's previous mcp.json could not be read"),
        "{}",
        run.stdout
    );
}

#[test]
fn the_overlay_ends_with_no_mcp_json_when_nothing_is_staged() {
    let hand =
        r#"{"mcpServers": {"mine": {"url": "https://mine.example.com/mcp", "description": "d"}}}"#;
    // --no-mcp.
    let (d, host) = deployment_with_host();
    std::fs::write(overlay(&d).join("mcp.json"), hand).unwrap();
    let run = import(&d, &host, &["--no-mcp"]);
    assert_eq!(run.code, 0);
    assert!(run.stdout.contains("--no-mcp"), "{}", run.stdout);
    assert!(!overlay(&d).join("mcp.json").exists());
    // No mcp.json on the host.
    std::fs::write(overlay(&d).join("mcp.json"), hand).unwrap();
    std::fs::remove_file(host.join("mcp.json")).unwrap();
    let run = import(&d, &host, &[]);
    assert_eq!(run.code, 0);
    assert!(run.stdout.contains("none on the host"), "{}", run.stdout);
    assert!(!overlay(&d).join("mcp.json").exists());
    // No server a job can use.
    std::fs::write(overlay(&d).join("mcp.json"), hand).unwrap();
    std::fs::write(
        host.join("mcp.json"),
        r#"{"mcpServers": {"x": {"url": "https://h.example.com/mcp", "headers": {"A": "literal"}, "description": "d"}}}"#,
    )
    .unwrap();
    let run = import(&d, &host, &[]);
    assert_eq!(run.code, 0);
    assert!(
        run.stdout.contains("0 servers staged, 1 left behind"),
        "{}",
        run.stdout
    );
    assert!(!overlay(&d).join("mcp.json").exists());
}

#[test]
fn an_unreadable_host_file_leaves_the_overlay_exactly_as_it_was() {
    let before =
        br#"{"mcpServers": {"mine": {"url": "https://mine.example.com/mcp", "description": "d"}}}"#;
    for host_text in [
        "{\"mcpServers\": {},}",
        "{\"mcpServers\": {\"a\": {\"url\": \"https://a/mcp\", \"url\": \"https://b/mcp\"}}}",
        "not json at all",
    ] {
        let (d, host) = deployment_with_host();
        std::fs::write(overlay(&d).join("mcp.json"), before).unwrap();
        std::fs::write(host.join("mcp.json"), host_text).unwrap();
        let snapshot = files_under(&overlay(&d));
        let run = import(&d, &host, &[]);
        assert_eq!(run.code, 2, "{host_text}");
        assert!(
            run.stdout.contains("mcp.json cannot be read"),
            "{}",
            run.stdout
        );
        assert!(run.stdout.contains("exactly as it was"), "{}", run.stdout);
        assert_eq!(std::fs::read(overlay(&d).join("mcp.json")).unwrap(), before);
        assert_eq!(
            files_under(&overlay(&d)),
            snapshot,
            "nothing else changed either"
        );
    }
}

#[test]
fn links_are_refused_for_the_host_file_the_host_folder_and_the_overlay() {
    // A linked host mcp.json.
    let (d, host) = deployment_with_host();
    std::fs::rename(host.join("mcp.json"), d.path().join("real-mcp.json")).unwrap();
    std::os::unix::fs::symlink(d.path().join("real-mcp.json"), host.join("mcp.json")).unwrap();
    let run = import(&d, &host, &[]);
    assert_eq!(run.code, 2);
    assert!(run.stdout.contains("link"), "{}", run.stdout);
    assert!(!overlay(&d).join("mcp.json").exists());

    // A linked host folder.
    let (d, host) = deployment_with_host();
    let linked = d.path().join("agent-link");
    std::os::unix::fs::symlink(&host, &linked).unwrap();
    let run = import(&d, &linked, &[]);
    assert_eq!(run.code, 2);
    assert!(run.stdout.contains("is a link"), "{}", run.stdout);

    // A linked overlay: nothing is written through it.
    let (d, host) = deployment_with_host();
    let real = d.path().join("real-overlay");
    std::fs::create_dir(&real).unwrap();
    let link = d.path().join("overlay-link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let run = import(&d, &host, &["--to", link.to_str().unwrap()]);
    assert_eq!(run.code, 2);
    assert!(run.stdout.contains("is a link"), "{}", run.stdout);
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);
}

#[test]
fn a_models_json_with_a_credential_stops_the_import_before_anything_is_written() {
    let (d, host) = deployment_with_host();
    std::fs::write(
        host.join("models.json"),
        r#"{"providers": {"p": {"baseUrl": "https://h.example.com/v1", "apiKey": "sk-literal"}}}"#,
    )
    .unwrap();
    let run = import(&d, &host, &[]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stdout.contains("providers.p.apiKey"), "{}", run.stdout);
    assert!(run.stdout.contains("Nothing was changed"), "{}", run.stdout);
    assert_eq!(std::fs::read_dir(overlay(&d)).unwrap().count(), 0);
}

#[test]
fn only_mcp_json_follows_the_host_other_parts_are_left_alone() {
    let (d, host) = deployment_with_host();
    assert_eq!(import(&d, &host, &[]).code, 0);
    std::fs::remove_file(host.join("models.json")).unwrap();
    std::fs::remove_file(host.join("APPEND_SYSTEM.md")).unwrap();
    std::fs::remove_dir_all(host.join("skills")).unwrap();
    let before = files_under(&overlay(&d));
    let run = import(&d, &host, &[]);
    assert_eq!(run.code, 0);
    for part in ["models.json", "skills/", "APPEND_SYSTEM.md"] {
        assert!(
            run.stdout.contains(&format!(
                "{part}: not on the host; the overlay's, if it has one, is left as it is"
            )),
            "{part}: {}",
            run.stdout
        );
    }
    assert_eq!(files_under(&overlay(&d)).len(), before.len());
    for kept in ["models.json", "APPEND_SYSTEM.md", "skills/review/SKILL.md"] {
        assert!(overlay(&d).join(kept).is_file(), "{kept}");
    }
}

#[test]
fn the_overlay_may_not_be_the_host_folder_or_hold_it() {
    let (d, host) = deployment_with_host();
    let host_mcp = std::fs::read(host.join("mcp.json")).unwrap();
    for to in [
        host.clone(),
        host.join("skills"),
        host.join("nested/overlay"),
        d.path().join("home"),
    ] {
        let run = import(&d, &host, &["--to", to.to_str().unwrap()]);
        assert_eq!(run.code, 2, "{}: {}", to.display(), run.stdout);
        assert!(run.stdout.contains("same folder"), "{}", run.stdout);
        assert!(run.stdout.contains("Nothing was changed"), "{}", run.stdout);
    }
    for flag in [&[][..], &["--no-mcp"][..]] {
        let mut args = vec!["--to", host.to_str().unwrap()];
        args.extend_from_slice(flag);
        assert_eq!(import(&d, &host, &args).code, 2);
    }
    assert_eq!(std::fs::read(host.join("mcp.json")).unwrap(), host_mcp);
    assert!(host.join("skills/review/notes.md").is_symlink());
}

#[test]
fn a_link_is_seen_as_a_link_even_with_a_trailing_slash() {
    let (d, host) = deployment_with_host();
    let real = d.path().join("real-overlay");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, d.path().join("overlay-link")).unwrap();
    let to = format!("{}/overlay-link/", d.path().display());
    let run = import(&d, &host, &["--to", &to]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);

    std::os::unix::fs::symlink(&host, d.path().join("host-link")).unwrap();
    let from = format!("{}/host-link/", d.path().display());
    let run = d.run(&["import-pi", "--from", &from]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert!(!overlay(&d).join("mcp.json").exists());
}

#[test]
fn a_failure_while_staging_changes_nothing() {
    // A host skill file over the size limit, found while copying skills/ after mcp.json was judged.
    let (d, host) = deployment_with_host();
    assert_eq!(import(&d, &host, &[]).code, 0);
    std::fs::write(host.join("mcp.json"), r#"{"mcpServers": {}}"#).unwrap();
    let big = std::fs::File::create(host.join("skills/review/data.bin")).unwrap();
    big.set_len(65 * 1024 * 1024).unwrap();
    let before = files_under(&overlay(&d));
    let run = import(&d, &host, &[]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert!(run.stdout.contains("skills/"), "{}", run.stdout);
    assert!(run.stdout.contains("Nothing was changed"), "{}", run.stdout);
    assert_eq!(files_under(&overlay(&d)), before);

    // The overlay's skills is a link: refused while staging, before anything is put in place.
    let (d, host) = deployment_with_host();
    std::fs::create_dir(d.path().join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(d.path().join("elsewhere"), overlay(&d).join("skills")).unwrap();
    let run = import(&d, &host, &[]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert!(run.stdout.contains("Nothing was changed"), "{}", run.stdout);
    assert!(!overlay(&d).join("mcp.json").exists());
    assert_eq!(
        std::fs::read_dir(d.path().join("elsewhere"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn the_host_folder_comes_from_the_flag_the_environment_or_home() {
    let (d, host) = deployment_with_host();
    let home = d.path().join("home");
    let out = d
        .command(&["import-pi"])
        .env("HOME", &home)
        .env_remove("PI_CODING_AGENT_DIR")
        .output()
        .unwrap();
    let run: Run = out.into();
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(
        run.stdout.contains(&format!("from {}", host.display())),
        "{}",
        run.stdout
    );

    let other = d.path().join("other-agent");
    std::fs::create_dir(&other).unwrap();
    let out = d
        .command(&["import-pi"])
        .env("HOME", &home)
        .env("PI_CODING_AGENT_DIR", &other)
        .output()
        .unwrap();
    let run: Run = out.into();
    assert!(
        run.stdout.contains(&format!("from {}", other.display())),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("none on the host"), "{}", run.stdout);

    let run = d.run(&[
        "import-pi",
        "--from",
        d.path().join("nowhere").to_str().unwrap(),
    ]);
    assert_eq!(run.code, 2);
    assert!(run.stdout.contains("does not exist"), "{}", run.stdout);
}

#[test]
fn unknown_flags_are_refused() {
    let (d, host) = deployment_with_host();
    let run = import(&d, &host, &["--force"]);
    assert_eq!(run.code, 1, "import-pi refuses an unknown flag with 1");
    assert!(!overlay(&d).join("mcp.json").exists());
}

/// Kills the import at moments spread over its whole run: the overlay's mcp.json is always the old
/// file or the new one, complete, never a part of either.
#[test]
fn a_crash_while_importing_never_leaves_a_half_file() {
    let (d, host) = deployment_with_host();
    // A large host file, so that writing the overlay's copy takes a while.
    let servers: Vec<String> = (0..3_000)
        .map(|i| {
            format!(
                r#""s{i}": {{"url": "https://h{i}.example.com/mcp", "headers": {{"Authorization": "Bearer ${{TOKEN_{i}}}"}}, "description": "Server number {i} with a description of some length"}}"#
            )
        })
        .collect();
    std::fs::write(
        host.join("mcp.json"),
        format!(r#"{{"mcpServers": {{{}}}}}"#, servers.join(",")),
    )
    .unwrap();
    let old =
        br#"{"mcpServers": {"old": {"url": "https://old.example.com/mcp", "description": "d"}}}"#;
    let target = overlay(&d).join("mcp.json");

    std::fs::write(&target, old).unwrap();
    let started = Instant::now();
    assert_eq!(import(&d, &host, &[]).code, 0);
    let full_run = started.elapsed();
    let new = std::fs::read(&target).unwrap();
    assert_ne!(new, old);

    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let (mut saw_old, mut saw_new) = (0, 0);
    // Kill points spread over the last part of the run, where the reading is done and the writing
    // happens, and a little past its end.
    for _ in 0..20 {
        std::fs::write(&target, old).unwrap();
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let at = full_run.mul_f64(0.6 + 0.45 * ((seed >> 11) as f64 / (1u64 << 53) as f64));
        let mut child = d
            .command(&["import-pi", "--from", host.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(at);
        let _ = child.kill();
        let _ = child.wait();
        let now = std::fs::read(&target).unwrap();
        if now == old {
            saw_old += 1;
        } else if now == new {
            saw_new += 1;
        } else {
            panic!(
                "a half-written mcp.json of {} bytes after a kill at {at:?}",
                now.len()
            );
        }
    }
    assert_eq!(saw_old + saw_new, 20);
    // A later import clears the temporary files a killed one left behind.
    assert_eq!(import(&d, &host, &[]).code, 0);
    assert_eq!(temp_files(&d), Vec::<String>::new());
}

/// A crash at the two moments that matter, made certain by the crash hook: halfway through writing
/// the new file, and after writing it but before renaming it into place.
#[test]
fn a_crash_mid_write_or_before_the_rename_leaves_the_old_file_whole() {
    for point in ["mid-write", "before-rename"] {
        let (d, host) = deployment_with_host();
        let old = br#"{"mcpServers": {"old": {"url": "https://old.example.com/mcp", "description": "d"}}}"#;
        let target = overlay(&d).join("mcp.json");
        std::fs::write(&target, old).unwrap();
        let out = d
            .command(&["import-pi", "--from", host.to_str().unwrap()])
            .env("PI_DISPATCH_TEST_CRASH", point)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            None,
            "{point}: the process was killed by the abort"
        );
        assert_eq!(std::fs::read(&target).unwrap(), old, "{point}");
        assert!(
            !temp_files(&d).is_empty(),
            "{point}: the crash left its temporary files"
        );
        // The next import finishes the job and clears the leftovers.
        assert_eq!(import(&d, &host, &[]).code, 0);
        assert_ne!(std::fs::read(&target).unwrap(), old);
        assert_eq!(temp_files(&d), Vec::<String>::new(), "{point}");
    }
}

#[test]
fn a_key_written_twice_in_a_host_file_is_named() {
    let (d, host) = deployment_with_host();
    std::fs::write(
        host.join("mcp.json"),
        "{\"mcpServers\": {\"docs\": {\"url\": \"https://a.example.com/mcp\",\n  \"description\": \"d\", \"description\": \"e\"}}}",
    )
    .unwrap();
    let run = import(&d, &host, &[]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    insta::assert_snapshot!("duplicate_key_human", d.redact(&run.stdout));
    // models.json is read by the same reader, and names its key too.
    std::fs::write(host.join("mcp.json"), HOST_MCP).unwrap();
    std::fs::write(
        host.join("models.json"),
        r#"{"providers": {"p": {"apiKey": "$K"}}, "providers": {}}"#,
    )
    .unwrap();
    let run = import(&d, &host, &[]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert!(
        run.stdout
            .contains("the key 'providers' is written twice in one object"),
        "{}",
        run.stdout
    );
}
