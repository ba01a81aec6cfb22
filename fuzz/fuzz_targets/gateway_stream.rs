//! The model gateway's reading of a provider's answer as it passes (crates/hub gateway/wire.rs):
//! the first byte picks the wire format and whether the answer is an event stream or one JSON
//! body; the next byte, the sizes of the pieces the answer arrives in.
//!
//! - what is read does not depend on how the bytes were cut into pieces;
//! - the answer's text stays within its bound;
//! - the usage read is metered without overflow: its cost is a finite amount, it is held to the
//!   call's worst case, and the meter's counts only grow.
//!
//! Usage does not only grow as more bytes arrive: each format's later report replaces the earlier
//! one (an Anthropic `message_delta` replaces `message_start`'s counts), so that is not asserted.
#![no_main]

use config::catalog::ModelKind;
use config::model_rules::{Bound, Meter, Model, Rules, cost};
use config::prices::Prices;
use config::wire_format::Api;
use hub::gateway::wire::AnswerReader;
use libfuzzer_sys::fuzz_target;
use protocol::exit_line::MAX_FINAL_MESSAGE;

const ALL: [Api; 6] = [
    Api::OpenAiCompletions,
    Api::OpenAiResponses,
    Api::AnthropicMessages,
    Api::OpenAiDecisions,
    Api::SystemOne,
    Api::OpenRouterImages,
];

fn model() -> Model {
    Model {
        provider: "openai".into(),
        id: "gpt-x".into(),
        kind: ModelKind::Chat,
        api: "openai-completions".into(),
        base_url: "https://api.openai.com/v1".into(),
        cost: Prices {
            input: 1.25,
            output: 10.0,
            cache_read: 0.125,
            cache_write: 0.0,
        },
        tiers: vec![config::prices::Tier {
            above: 200_000,
            prices: Prices {
                input: 2.5,
                output: 15.0,
                cache_read: 0.25,
                cache_write: 0.0,
            },
        }],
        max_tokens: Some(128_000),
    }
}

fuzz_target!(|data: &[u8]| {
    let [pick, piece, answer @ ..] = data else {
        return;
    };
    let api = ALL[usize::from(pick % 6)];
    let stream = pick & 0x80 != 0;
    let mut whole = AnswerReader::new(api, stream);
    whole.feed(answer);
    let whole = whole.finish();
    let mut cut = AnswerReader::new(api, stream);
    for chunk in answer.chunks(usize::from(*piece).max(1)) {
        cut.feed(chunk);
    }
    let cut = cut.finish();
    assert_eq!(cut, whole, "the reading depends on the pieces");
    assert!(whole.text.len() <= MAX_FINAL_MESSAGE);
    let Some(used) = whole.usage else {
        return;
    };
    let model = model();
    let spent = cost(&model, &used);
    assert!(spent.is_finite() && spent >= 0.0, "a cost of {spent}");
    let rules = Rules::new(None, Some(5.0)).unwrap();
    let bound = Bound {
        usd: 1.0,
        input: 100_000,
        output: 8_192,
    };
    let _ = rules.within(&model, &bound, &used);
    let mut meter = Meter::default();
    meter.hold(1.0);
    meter.settle(1.0, Some((used, spent)), true);
    let first = (meter.input_tokens, meter.output_tokens, meter.total_tokens);
    meter.settle(0.0, Some((used, spent)), true);
    let second = (meter.input_tokens, meter.output_tokens, meter.total_tokens);
    assert!(second.0 >= first.0 && second.1 >= first.1 && second.2 >= first.2);
    assert!(meter.committed().is_finite());
});
