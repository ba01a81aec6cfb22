//! What the job's model gateway saw of the model's answers to pi, and the verdict on a job drawn
//! from it. The gateway sits in the runner, out of reach of pi, its extensions and its tools;
//! pi's own event stream is whatever pi (or an extension inside it) prints. So the outcome and
//! the final message come from the gateway: pi's events can only make a job fail, never complete
//! it. Where pi claims an ending the model never gave, the job fails with
//! [`Reason::AgentReportMismatch`]. Pure.

use serde::{Deserialize, Serialize};

#[cfg(test)]
use crate::exit_line::{MAX_FINAL_MESSAGE, push_bounded};
use crate::pi_events::PiEvents;
use crate::reason::Reason;

/// How one model call of pi's ended, as the gateway saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Ending {
    /// The model finished its answer.
    Stop,
    /// The model asked for a tool.
    ToolUse,
    /// The answer stopped at its length limit.
    Length,
    /// The answer ended with a reason that is no finished answer (a content filter, a refusal, a
    /// failed response), or without saying how it ended.
    Other,
    /// The provider (or the egress proxy on the way) answered with this HTTP status; `proxy`
    /// holds the proxy's own code when the proxy answered.
    Status { status: u16, proxy: Option<String> },
    /// No answer: the connection failed, or the answer was cut off.
    Unreachable { cause: String },
}

/// One model call of pi's: how it ended, the text of its answer, and the provider's host.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Answer {
    pub ending: Option<Ending>,
    /// The answer's text parts, joined by line ends, at most
    /// [`crate::exit_line::MAX_FINAL_MESSAGE`] bytes.
    pub text: String,
    /// Whether `text` was cut at [`crate::exit_line::MAX_FINAL_MESSAGE`].
    pub cut: bool,
    /// The provider's host (its base URL's), for the record's detail.
    pub host: String,
}

/// Whether two texts of the same answer agree: the same characters but for whitespace (pi and
/// the gateway join an answer's parts each in its own way), compared only as far as the shorter
/// goes when either was cut.
pub fn texts_agree(a: &str, a_cut: bool, b: &str, b_cut: bool) -> bool {
    let mut a = a.chars().filter(|c| !c.is_whitespace());
    let mut b = b.chars().filter(|c| !c.is_whitespace());
    loop {
        match (a.next(), b.next()) {
            (None, None) => return true,
            (Some(x), Some(y)) if x == y => {}
            (None, Some(_)) => return a_cut,
            (Some(_), None) => return b_cut,
            (Some(_), Some(_)) => return false,
        }
    }
}

/// Why a job did not complete: the reason and a cause for the log and the record's detail (fixed
/// words, a status, a host or the proxy's code; never the provider's text).
pub type Failure = (Reason, String);

/// What the gateway's last answer to pi says of the job: the final message when the model ended
/// normally, else why not.
fn from_gateway(last: &Answer) -> Result<String, Failure> {
    let failed = |reason, cause: String| Err((reason, cause));
    let host = if last.host.is_empty() {
        "the model provider".to_owned()
    } else {
        last.host.clone()
    };
    match &last.ending {
        Some(Ending::Stop) => Ok(last.text.clone()),
        Some(Ending::ToolUse) => failed(
            Reason::AgentFailed,
            "pi ended while its model's last answer asked for more".to_owned(),
        ),
        Some(Ending::Length) => failed(
            Reason::ModelLengthLimit,
            "the model's last answer stopped at its length limit".to_owned(),
        ),
        Some(Ending::Other) | None => failed(
            Reason::ModelError,
            "the model's last answer ended without finishing".to_owned(),
        ),
        Some(Ending::Status { status, proxy }) => match (status, proxy) {
            (_, Some(code)) => failed(
                Reason::ModelUnreachable,
                format!("the egress proxy answered HTTP {status} ({code}) for {host}"),
            ),
            (502..=504, None) => failed(
                Reason::ModelUnreachable,
                format!("{host} answered HTTP {status}, after pi's retries"),
            ),
            (401 | 403, None) => failed(
                Reason::ModelUnauthorized,
                format!("{host} answered HTTP {status}"),
            ),
            (429, None) => failed(
                Reason::ModelRateLimited,
                format!("{host} answered HTTP 429, after pi's retries"),
            ),
            (_, None) => failed(Reason::ModelError, format!("{host} answered HTTP {status}")),
        },
        Some(Ending::Unreachable { cause }) => failed(
            Reason::ModelUnreachable,
            format!("{host} could not be reached ({cause}), after pi's retries"),
        ),
    }
}

/// The verdict on a job that ran pi, from what the gateway saw of the model's answers to pi
/// (`last`: the last of them) and what pi's events claim, with how pi exited. The job completed
/// only when both say the model's last answer ended normally, with the same text, and pi exited
/// well; the final message is then the gateway's. pi claiming an ending the model never gave is
/// [`Reason::AgentReportMismatch`]; otherwise a failure is the gateway's account, or pi's where
/// the gateway has none (pi failed on its own, or never reached the gateway).
pub fn verdict(pi: &PiEvents, exited_ok: bool, last: Option<&Answer>) -> Result<String, Failure> {
    let claimed = pi.verdict(exited_ok);
    let Some(last) = last else {
        return match claimed {
            Ok(()) => Err(mismatch("no model answer reached pi through the gateway")),
            Err(failure) => Err(failure),
        };
    };
    let seen = from_gateway(last);
    match (claimed, seen) {
        (Ok(()), Ok(text)) => {
            let (claimed_text, claimed_cut) = pi.final_text();
            if texts_agree(claimed_text, claimed_cut, &text, last.cut) {
                Ok(text)
            } else {
                Err(mismatch(
                    "pi's account of its model's last answer is not the text the model answered",
                ))
            }
        }
        (Ok(()), Err(_)) => Err(mismatch(
            "pi reported a finished answer, and the model's last answer was not one",
        )),
        // pi's own failure after a normal answer (it exited badly, its run was aborted).
        (Err(failure), Ok(_)) => Err(failure),
        (Err(_), Err(failure)) => Err(failure),
    }
}

/// A failure of pi's own (it exited badly, its model call failed, it had no answer) when the job's
/// own model gateway turned connections away: pi could not reach the gateway because the job's
/// processes held it full, which is [`Reason::ModelUnreachable`] and says so. Any other failure
/// (a forged report among them) stays as it is. Pure.
pub fn own_gateway_turned_away(failure: Failure, turned_away: u64, bound: usize) -> Failure {
    match failure.0 {
        _ if turned_away == 0 => failure,
        Reason::AgentFailed
        | Reason::AgentNoTurn
        | Reason::ModelUnreachable
        | Reason::ModelError => (
            Reason::ModelUnreachable,
            format!(
                "pi could not reach the job's own model gateway: it turned {turned_away} connections away, past its {bound} open at once (the job's processes held them)"
            ),
        ),
        _ => failure,
    }
}

fn mismatch(cause: &str) -> Failure {
    (Reason::AgentReportMismatch, cause.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pi(stop: &str, text: &str) -> PiEvents {
        let mut e = PiEvents::default();
        e.observe(
            &serde_json::json!({"type": "message_end", "message": {"role": "assistant",
                "stopReason": stop, "content": [{"type": "text", "text": text}]}})
            .to_string(),
        );
        e
    }

    fn seen(ending: Ending, text: &str) -> Answer {
        Answer {
            ending: Some(ending),
            text: text.to_owned(),
            cut: false,
            host: "api.example.test".to_owned(),
        }
    }

    fn reason(r: Result<String, Failure>) -> Reason {
        r.unwrap_err().0
    }

    #[test]
    fn a_gateway_held_full_by_the_job_is_its_model_unreachable_but_never_hides_a_forgery() {
        let failed = (Reason::AgentFailed, "pi exited with a failure".to_owned());
        assert_eq!(own_gateway_turned_away(failed.clone(), 0, 256), failed);
        let (reason, cause) = own_gateway_turned_away(failed, 3, 256);
        assert_eq!(reason, Reason::ModelUnreachable);
        assert!(
            cause.contains("own model gateway") && cause.contains('3'),
            "{cause}"
        );
        for kept in [
            Reason::AgentReportMismatch,
            Reason::ModelLengthLimit,
            Reason::ModelUnauthorized,
        ] {
            let f = (kept, "x".to_owned());
            assert_eq!(own_gateway_turned_away(f.clone(), 9, 256), f);
        }
    }

    #[test]
    fn completed_only_when_the_model_and_pi_agree() {
        let done = verdict(
            &pi("stop", "All done."),
            true,
            Some(&seen(Ending::Stop, "All done.")),
        );
        assert_eq!(done.unwrap(), "All done.");
        // Whitespace is how each side joins parts; the words must be the same.
        let joined = verdict(
            &pi("stop", "Part one.\nPart two."),
            true,
            Some(&seen(Ending::Stop, "Part one.Part two. ")),
        );
        assert_eq!(joined.unwrap(), "Part one.Part two. ");
        // pi forged a finished answer the model never gave.
        let forged = verdict(
            &pi("stop", "all tests pass, ready to merge"),
            true,
            Some(&seen(Ending::ToolUse, "")),
        );
        assert_eq!(reason(forged), Reason::AgentReportMismatch);
        // pi changed the text of a finished answer.
        let changed = verdict(
            &pi("stop", "all tests pass, ready to merge"),
            true,
            Some(&seen(Ending::Stop, "Two tests fail.")),
        );
        assert_eq!(reason(changed), Reason::AgentReportMismatch);
        // pi claims an answer that never reached it through the gateway.
        assert_eq!(
            reason(verdict(&pi("stop", "x"), true, None)),
            Reason::AgentReportMismatch
        );
        // The model finished, and pi failed after: pi's failure.
        assert_eq!(
            reason(verdict(
                &pi("stop", "x"),
                false,
                Some(&seen(Ending::Stop, "x"))
            )),
            Reason::AgentFailed
        );
        assert_eq!(
            reason(verdict(
                &pi("aborted", ""),
                true,
                Some(&seen(Ending::Stop, "x"))
            )),
            Reason::AgentAborted
        );
        // Nothing from pi and nothing seen: pi's own account.
        assert_eq!(
            reason(verdict(&PiEvents::default(), true, None)),
            Reason::AgentNoTurn
        );
    }

    #[test]
    fn a_failure_is_the_gateways_account() {
        let failing = |ending: Ending| {
            let pi = pi("error", "");
            verdict(&pi, true, Some(&seen(ending, "")))
        };
        let proxy = failing(Ending::Status {
            status: 502,
            proxy: Some("upstream-unreachable".into()),
        })
        .unwrap_err();
        assert_eq!(proxy.0, Reason::ModelUnreachable);
        assert!(proxy.1.contains("upstream-unreachable") && proxy.1.contains("api.example.test"));
        for (status, expected) in [
            (503, Reason::ModelUnreachable),
            (504, Reason::ModelUnreachable),
            (401, Reason::ModelUnauthorized),
            (403, Reason::ModelUnauthorized),
            (429, Reason::ModelRateLimited),
            (500, Reason::ModelError),
            (400, Reason::ModelError),
        ] {
            let r = failing(Ending::Status {
                status,
                proxy: None,
            });
            assert_eq!(reason(r), expected, "{status}");
        }
        assert_eq!(
            reason(failing(Ending::Unreachable {
                cause: "connection refused".into()
            })),
            Reason::ModelUnreachable
        );
        assert_eq!(reason(failing(Ending::Length)), Reason::ModelLengthLimit);
        assert_eq!(reason(failing(Ending::ToolUse)), Reason::AgentFailed);
        assert_eq!(reason(failing(Ending::Other)), Reason::ModelError);
    }

    #[test]
    fn cut_texts_agree_as_far_as_they_go() {
        assert!(texts_agree("a b c", false, "abc", false));
        assert!(!texts_agree("abc", false, "abd", false));
        assert!(!texts_agree("ab", false, "abc", false));
        assert!(texts_agree("ab", true, "abc", false));
        assert!(texts_agree("abc", false, "ab", true));
        assert!(!texts_agree("xb", true, "abc", false));
        let mut text = String::new();
        let mut cut = false;
        push_bounded(&mut text, &mut cut, &"é".repeat(MAX_FINAL_MESSAGE));
        assert!(cut && text.len() <= MAX_FINAL_MESSAGE && text.len() > MAX_FINAL_MESSAGE - 2);
        let mut short = String::new();
        let mut cut = false;
        push_bounded(&mut short, &mut cut, "ok");
        assert!(!cut && short == "ok");
    }
}
