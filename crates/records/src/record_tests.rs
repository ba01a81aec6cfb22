use super::*;
use protocol::usage::Usage;

fn job() -> Job {
    serde_json::from_value(serde_json::json!({
        "id": "job-7", "triggerIndex": 2, "triggerType": "cron", "kind": "local",
        "flow": "fix", "mcp": ["docs"], "secrets": [], "provider": "fake", "model": "m1",
        "excludeTools": []
    }))
    .unwrap()
}

fn line(code: u8, reason: Option<&str>) -> ExitLine {
    ExitLine {
        event: "exit".into(),
        job_id: "job-7".into(),
        code,
        reason: reason.map(str::to_owned),
        server: Some("docs".into()),
        cause: Some("free text from the runner".into()),
        servers: vec![ServerState {
            name: "docs".into(),
            state: "ready".into(),
            ready_ms: Some(40),
            listing: None,
        }],
        tool_calls: vec![ToolCallCount {
            server: "docs".into(),
            tool: "search".into(),
            calls: 3,
            ok: 3,
            ..ToolCallCount::default()
        }],
        final_message: Some("All done.".into()),
        usage: Some(Usage {
            turns: 4,
            input_tokens: 100,
            output_tokens: 20,
            total_tokens: 120,
            cost_usd: 0.01,
            provider: Some("fake".into()),
            model: Some("fake-model".into()),
        }),
    }
}

#[test]
fn an_exit_line_becomes_a_record_with_usage_and_the_mcp_part() {
    let r = Draft::new(&job(), 1).from_exit_line(&line(0, None));
    assert_eq!(r.outcome, Outcome::Completed);
    assert_eq!(r.reason, None);
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.turns, Some(4));
    assert_eq!(r.tokens.as_ref().map(|t| t.total), Some(120));
    assert_eq!(r.model.as_deref(), Some("fake-model"));
    assert!(r.budget_reserved);
    assert_eq!(r.trigger_index, Some(2));
    assert_eq!(r.mcp.tool_calls[0].calls, 3);
    assert_eq!(r.mcp.servers[0].ready_ms, Some(40));
    assert!(r.spent);
    assert_eq!(r.final_message.as_deref(), Some("All done."));
    // A completed job has no reason, detail or fix.
    assert_eq!((r.reason, &r.detail, &r.fix), (None, &None, &None));
}

#[test]
fn only_known_reasons_are_copied() {
    let shadowed = Draft::new(&job(), 1).from_exit_line(&line(2, Some("mcp-shadowed")));
    assert_eq!(shadowed.outcome, Outcome::Policy);
    assert_eq!(shadowed.reason, Some(Reason::McpShadowed));
    // The runner's cause and server are the record's detail, with the reason's fix.
    let detail = shadowed.detail.unwrap();
    assert_eq!(detail.server.as_deref(), Some("docs"));
    assert_eq!(shadowed.fix.as_deref(), Some(Reason::McpShadowed.fix()));
    let odd = Draft::new(&job(), 1).from_exit_line(&line(2, Some("free words; rm -rf")));
    assert_eq!(odd.reason, Some(Reason::RunnerReasonUnknown));
    assert_eq!(odd.outcome, Outcome::Failed);
    let failed = Draft::new(&job(), 2).from_exit_line(&line(1, Some("agent-failed")));
    assert_eq!(failed.outcome, Outcome::Failed);
    assert_eq!(failed.reason, Some(Reason::AgentFailed));
    // A model that could not be reached is a failure, whatever the code.
    let down = Draft::new(&job(), 1).from_exit_line(&line(1, Some("model-unreachable")));
    assert_eq!(down.outcome, Outcome::Failed);
}

#[test]
fn the_runners_own_faults_reserve_nothing_and_page_nobody() {
    for token in [
        "runner-setup-failed",
        "job-prompt-unreadable",
        "agent-never-started",
    ] {
        let mut l = line(1, Some(token));
        l.usage = None;
        let r = Draft::new(&job(), 1).from_exit_line(&l);
        assert_eq!(r.outcome, Outcome::Failed, "{token}");
        assert_eq!(r.reason.map(Reason::as_str), Some(token));
        assert!(!r.budget_reserved, "{token}: the agent never started");
    }
    // An MCP server's refusal before the prompt is a paid stop, as the spec says.
    let refused = Draft::new(&job(), 1).from_exit_line(&line(2, Some("mcp-unavailable")));
    assert!(refused.budget_reserved);
}

/// The activity of one of pi's event lines, parsed as the worker parses it.
fn activity_of(line: &str, at_ms: u64) -> Option<Activity> {
    Activity::of_event(&PiEvent::parse(line)?, at_ms)
}

#[test]
fn pi_beginning_a_turn_or_a_tool_call_is_activity_and_nothing_else_is() {
    let turn = activity_of(r#"{"type":"turn_start"}"#, 7).unwrap();
    assert_eq!(
        (turn.at_ms, turn.kind.as_str(), turn.tool),
        (7, "turn", None)
    );
    let call = activity_of(
        r#"{"type":"tool_execution_start","toolCallId":"c1","toolName":"docs_search","args":{}}"#,
        9,
    )
    .unwrap();
    assert_eq!(
        (call.kind.as_str(), call.tool.as_deref()),
        ("tool", Some("docs_search"))
    );
    // A message that merely mentions the words is not one.
    let text = r#"{"type":"message_end","message":{"content":"\"turn_start\""}}"#;
    assert_eq!(activity_of(text, 1), None);
    let answer = r#"{"type":"message_end","message":{"role":"assistant","content":[]}}"#;
    assert!(PiEvent::parse(answer).is_some());
    assert_eq!(activity_of(answer, 1), None);
    assert_eq!(activity_of("not json \"turn_start\"", 1), None);
    let long = format!(
        r#"{{"type":"tool_execution_start","toolName":"{}"}}"#,
        "t".repeat(300)
    );
    assert_eq!(activity_of(&long, 1).unwrap().tool.unwrap().len(), 128);
}

/// Every ending goes through the one builder: a later step's ending replaces the first whole
/// (reason, detail and fix), and the record names its worker without the live view showing it.
#[test]
fn a_record_is_finished_once_from_its_ending() {
    let mut draft = Draft::new(&job(), 1);
    draft.written_by("host-a:7");
    assert_eq!(draft.record_now().worker, None);
    let reported = line(0, None);
    draft.reported(&reported, |m| m.replace("done", "[redacted]"));
    let completed = Ending::of_exit_line(&reported);
    assert!(completed.is_completed());
    let not_kept = Ending::failed(Reason::JobWriteBackFailed, Detail::new("copy failed"));
    let r = draft.finish_at(not_kept, 42);
    assert_eq!(r.outcome, Reason::JobWriteBackFailed.outcome());
    assert_eq!(r.reason, Some(Reason::JobWriteBackFailed));
    assert_eq!(r.fix.as_deref(), Some(Reason::JobWriteBackFailed.fix()));
    assert_eq!(r.detail.map(|d| d.why).as_deref(), Some("copy failed"));
    assert_eq!(
        (r.finished_at_ms, r.worker.as_deref()),
        (42, Some("host-a:7"))
    );
    assert_eq!(r.final_message.as_deref(), Some("All [redacted]."));
    // The same line through `from_exit_line` is the same record but for its ending.
    let whole = Draft::new(&job(), 1).from_exit_line(&reported);
    assert_eq!((whole.turns, whole.exit_code), (r.turns, r.exit_code));
}

#[test]
fn the_jobs_record_counts_what_its_earlier_attempts_spent() {
    let mut first = Draft::new(&job(), 1);
    first.started(1);
    let first = first
        .from_exit_line(&line(1, Some("agent-failed")))
        .as_earlier_attempt();
    let last = Draft::new(&job(), 2).from_exit_line(&line(0, None));
    let whole = last.with_earlier_attempts(vec![first]);
    assert_eq!(whole.turns, Some(8));
    assert_eq!(whole.tokens.map(|t| t.total), Some(240));
    assert_eq!(whole.earlier_attempts[0].record, "job-7.attempt-1");
}
