//! The runner's last step on the job's path, and the one place a job's ending becomes its exit
//! line: how the agent ended, held against what the gateway saw, with the hub's and the gateway's
//! counts; or the stop of the step that ended the job first.

use protocol::exit_line::{ExitLine, ServerState};
use protocol::pi_events::PiEvents;
use protocol::reason::Reason;

use crate::gateway::{PiGateway, Seen};
use crate::job_file::Stop;
use crate::output::line;
use crate::relay;

/// How the agent's part ended: exited (well or not), stopped by the runner, or told to stop. pi's
/// events are there when the agent was pi.
pub(crate) enum AgentEnd {
    Exited(bool, Option<PiEvents>),
    Stopped(Stop, Option<PiEvents>),
    Terminated,
}

/// The reason of a runner stopped by SIGTERM.
pub const TERMINATED: &str = "terminated";

/// What stopped the job: a stop with its reason, or the runner told to stop (SIGTERM).
pub(crate) enum Halt {
    Stop(Stop),
    Terminated,
}

/// A step that stopped the job: what stopped it, and the servers' states as they were then.
pub(crate) struct Stopped {
    pub(crate) halt: Halt,
    pub(crate) servers: Vec<ServerState>,
}

/// A stop before any server has a state.
impl From<Stop> for Stopped {
    fn from(stop: Stop) -> Stopped {
        Stopped::by(stop, Vec::new())
    }
}

impl Stopped {
    pub(crate) fn by(stop: Stop, servers: Vec<ServerState>) -> Stopped {
        Stopped {
            halt: Halt::Stop(stop),
            servers,
        }
    }

    pub(crate) fn terminated(servers: Vec<ServerState>) -> Stopped {
        Stopped {
            halt: Halt::Terminated,
            servers,
        }
    }

    /// The exit line that says so: the stop's code, reason, server and cause; SIGTERM's code 1
    /// (the worker decides what follows).
    pub(crate) fn line(self, job_id: &str) -> ExitLine {
        match self.halt {
            Halt::Stop(stop) => line(
                job_id,
                stop.reason.code().unwrap_or(2),
                Some(&stop),
                self.servers,
            ),
            Halt::Terminated => ExitLine {
                reason: Some(TERMINATED.to_owned()),
                cause: Some("the runner was told to stop (SIGTERM)".to_owned()),
                ..line(job_id, 1, None, self.servers)
            },
        }
    }
}

/// The exit line of a runner that cannot begin the job: its input from the worker unusable.
pub fn setup_failed(job_id: &str, cause: String) -> ExitLine {
    Stopped::from(Stop::new(Reason::RunnerSetupFailed, None, cause)).line(job_id)
}

/// How the agent's part of the job ended, with what served it: the hub (once it served) and the
/// servers' states.
pub(crate) struct Ended {
    pub(crate) agent: AgentEnd,
    pub(crate) hub: Option<relay::Hub>,
    pub(crate) states: Vec<ServerState>,
}

/// The exit line once the agent's part has ended: the hub's and the gateway's counts taken and
/// both stopped, and the verdict on how the agent ended.
pub(crate) async fn finish(job_id: &str, ended: Ended, gateway: Option<PiGateway>) -> ExitLine {
    let Ended { agent, hub, states } = ended;
    let mut tool_calls = Vec::new();
    if let Some(hub) = hub {
        tool_calls = hub.tool_calls();
        hub.shutdown().await;
    }
    let seen = match gateway {
        Some(g) => Some(g.gateway.finish().await),
        None => None,
    };
    let (done, events) = verdict(job_id, agent, states, seen.as_ref());
    // The final message is the model's, as the gateway read it (whatever pi printed); an agent
    // other than pi has none. Only a completed job's is ever posted.
    let final_message = seen
        .as_ref()
        .and_then(|s| s.last_answer.as_ref())
        .map(|a| a.text.clone())
        .filter(|t| !t.is_empty());
    ExitLine {
        tool_calls,
        final_message,
        usage: merged_usage(events.as_ref(), seen.as_ref().map(|s| &s.meter)),
        ..done
    }
}

/// How the agent ended, as the exit line says it (counts aside), with pi's events when it was pi.
fn verdict(
    job_id: &str,
    agent: AgentEnd,
    states: Vec<ServerState>,
    seen: Option<&Seen>,
) -> (ExitLine, Option<PiEvents>) {
    let last_answer = seen.and_then(|s| s.last_answer.as_ref());
    match agent {
        // pi: the task is done only when the gateway saw its model's last answer end normally,
        // and pi's account agrees.
        AgentEnd::Exited(ok, Some(events)) => {
            match protocol::model_answer::verdict(&events, ok, last_answer) {
                Ok(_) => (line(job_id, 0, None, states), Some(events)),
                Err(failure) => {
                    let turned_away = seen.map_or(0, |s| s.turned_away);
                    let (reason, cause) = protocol::model_answer::own_gateway_turned_away(
                        failure,
                        turned_away,
                        crate::gateway::MAX_CONNECTIONS,
                    );
                    let stop = Stop::new(reason, None, cause);
                    (Stopped::by(stop, states).line(job_id), Some(events))
                }
            }
        }
        // Another agent: its exit status says.
        AgentEnd::Exited(true, None) => (line(job_id, 0, None, states), None),
        AgentEnd::Exited(false, None) => {
            let stop = Stop::new(Reason::AgentFailed, None, "the agent exited with a failure");
            (Stopped::by(stop, states).line(job_id), None)
        }
        AgentEnd::Stopped(stop, events) => (Stopped::by(stop, states).line(job_id), events),
        AgentEnd::Terminated => (Stopped::terminated(states).line(job_id), None),
    }
}

/// What the exit line says was used: the turns, provider and model from pi's events, the tokens
/// and cost from the gateway, which saw every call (pi's own, codemode's, a nested pi's).
fn merged_usage(
    events: Option<&PiEvents>,
    meter: Option<&crate::gateway::rules::Meter>,
) -> Option<protocol::usage::Usage> {
    let Some(meter) = meter else {
        return events.map(|e| e.usage.clone());
    };
    let from_pi = events.map(|e| e.usage.clone()).unwrap_or_default();
    Some(protocol::usage::Usage {
        input_tokens: meter.input_tokens,
        output_tokens: meter.output_tokens,
        total_tokens: meter.total_tokens,
        cost_usd: meter.cost_usd,
        ..from_pi
    })
}
