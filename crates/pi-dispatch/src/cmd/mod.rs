pub mod cancel;
pub mod completions;
pub mod doctor;
pub mod egress_proxy;
pub mod explain;
pub mod http_service;
pub mod image;
pub mod import_pi;
pub mod init;
pub mod job;
pub mod live;
pub mod mcp_check;
pub mod panel;
pub mod prune;
pub mod receiver;
pub mod rerun;
pub mod run;
pub mod runs;
pub mod status;
pub mod triggers_check;
pub mod worker;

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    /// Each command module, and the command modules it names (`crate::cmd::NAME`, `super::NAME`).
    fn uses() -> BTreeMap<String, BTreeSet<String>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cmd");
        let sources: BTreeMap<String, String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "rs"))
            .map(|path| {
                let name = path.file_stem().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read_to_string(&path).unwrap())
            })
            .filter(|(name, _)| name != "mod")
            .collect();
        let word = |text: &str| -> String {
            text.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        sources
            .iter()
            .map(|(name, text)| {
                let mut named = BTreeSet::new();
                for prefix in ["crate::cmd::", "super::"] {
                    for (at, _) in text.match_indices(prefix) {
                        let rest = &text[at + prefix.len()..];
                        let words: Vec<String> = match rest.strip_prefix('{') {
                            Some(list) => list[..list.find('}').unwrap_or(0)]
                                .split(',')
                                .map(|w| word(w.trim()))
                                .collect(),
                            None => vec![word(rest)],
                        };
                        named.extend(
                            words
                                .into_iter()
                                .filter(|w| w != name && sources.contains_key(w)),
                        );
                    }
                }
                (name.clone(), named)
            })
            .collect()
    }

    #[test]
    fn command_modules_do_not_import_each_other_in_circles() {
        let uses = uses();
        assert!(uses["rerun"].contains("run"), "{uses:?}");
        // Each module is done once every module it names is: a circle leaves some never done.
        let mut done: BTreeSet<&str> = BTreeSet::new();
        while done.len() < uses.len() {
            let next: Vec<&str> = uses
                .iter()
                .filter(|(name, named)| {
                    !done.contains(name.as_str()) && named.iter().all(|n| done.contains(n.as_str()))
                })
                .map(|(name, _)| name.as_str())
                .collect();
            assert!(
                !next.is_empty(),
                "command modules import each other in a circle: {:?}",
                uses.iter()
                    .filter(|(name, _)| !done.contains(name.as_str()))
                    .collect::<Vec<_>>()
            );
            done.extend(next);
        }
    }
}
