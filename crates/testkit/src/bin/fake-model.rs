//! `fake-model --port N --script FILE`: the scripted model provider of the tests as a program, for
//! the README's demo on a machine that reaches no real provider. It answers
//! `/v1/chat/completions` on 127.0.0.1:N with the script's steps in order (each
//! `{"call": TOOL, "args": {...}}` or `{"text": "..."}`), then "done" to anything more.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use testkit::fake_model::{FakeModel, Step};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .unwrap_or_else(|| {
                panic!("usage: fake-model --port N --script FILE ({flag} is missing)")
            })
            .clone()
    };
    let port: u16 = value("--port").parse().expect("--port is a port number");
    let text = std::fs::read_to_string(value("--script")).expect("the script file can be read");
    let script = Step::script_from_json(&text).unwrap_or_else(|e| panic!("{e}"));
    let model = FakeModel::start_on(port, script);
    println!("fake-model listening on {}", model.base_url());
    loop {
        std::thread::park();
    }
}
