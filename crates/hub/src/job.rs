//! One job, start to end, as one [`Runner`] going through its steps, each in a module of its own:
//! the runner's first step (`hold`: the way out, the guard, the watch for SIGTERM, the model
//! gateway), the job's servers planned (`plan`), pi's folder prepared (`pi_agent`), the servers
//! connected (`connect_all`), held to their pins (`pins`) and served to pi (`serve`: over the relay or over HTTP), the agent run
//! (`agent`), and the exit line (`finish`). [`Runner::run`] is the one place that comes back
//! between steps; a step that stops the job says so as a value, which `finish` turns into the exit
//! line.

use protocol::exit_line::ExitLine;

use crate::finish::{self, Ended, Stopped};
use crate::{agent, connect_all, hold, pi_agent, pins, plan, serve};

pub use crate::runner::{Agent, JobOptions, RUNTIME_WORKERS, Runner};

pub use crate::agent::CUT_MARKER;
pub use crate::finish::{TERMINATED, setup_failed};
pub use crate::serve::HUB_SOCKET;

/// Runs the job and says how it ended.
pub async fn run(job: JobOptions) -> ExitLine {
    let job_id = job.job_id.clone();
    match hold::start(job).await {
        Ok(runner) => runner.run().await,
        Err(stopped) => stopped.line(&job_id),
    }
}

impl Runner {
    /// Takes the job through its steps and says how it ended: the exit line of the step that
    /// stopped it, or of how the agent ended.
    pub async fn run(mut self) -> ExitLine {
        if self.job.input.list_only {
            return self.list().await;
        }
        let steps = self.steps().await;
        // The definitions lines go before the exit line.
        self.said().await;
        match steps {
            Ok(ended) => finish::finish(&self.job.job_id, ended, self.gateway.take()).await,
            Err(stopped) => stopped.line(&self.job.job_id),
        }
    }

    /// A run that only lists (`mcp pin`): the servers planned, connected and held to their pins,
    /// what they listed said (definitions, and the listings on the exit line), and no agent.
    async fn list(&self) -> ExitLine {
        let listed = async {
            let (planned, plan) = plan::read(&self.job)?;
            let Some(planned) = planned else {
                return Ok(Vec::new());
            };
            let stopped = |(stop, states)| Stopped::by(stop, states);
            let connected = connect_all::connect_servers(&self.job, planned, plan.wait)
                .await
                .map_err(stopped)?;
            let listed = pins::listings(&connected);
            pins::say_definitions(self, &connected, &listed);
            let held = pins::hold_listed(connected, &self.job.input, listed).map_err(stopped)?;
            Ok::<_, Stopped>(held.states)
        };
        let listed = listed.await;
        self.said().await;
        match listed {
            Ok(states) => crate::output::line(&self.job.job_id, 0, None, states),
            Err(stopped) => stopped.line(&self.job.job_id),
        }
    }

    /// The job's path, one step after another: its servers planned, pi's folder prepared, the
    /// servers connected, held to their pins and served to pi, the agent run.
    async fn steps(&self) -> Result<Ended, Stopped> {
        let (planned, plan) = plan::read(&self.job)?;
        let folder = pi_agent::prepare_folder(
            &self.job.agent_dir,
            self.pi(),
            plan.codemode_models,
            self.job.confine.as_deref(),
        )?;
        let connecting = planned.map(|planned| {
            Box::pin(async move {
                let connected = connect_all::connect_servers(&self.job, planned, plan.wait).await?;
                let listed = pins::listings(&connected);
                pins::say_definitions(self, &connected, &listed);
                pins::hold_listed(connected, &self.job.input, listed)
            }) as serve::Connecting<'_>
        });
        let (start, serving) = serve::serve(self, &folder, &plan, connecting).await?;
        let ended = agent::run(self, &folder, &plan.secrets, start).await;
        Ok(serving.ended(ended))
    }
}
