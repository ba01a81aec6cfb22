//! The runner's first step on the job's path, before anything of the job starts: with egress on,
//! the way out (the forwarder); the guard; the watch for SIGTERM; and, with pi, the model gateway.
//! What it holds is the job's [`Runner`].

use protocol::job_dir;
use protocol::reason::Reason;

use crate::finish::Stopped;
use crate::gateway::PiGateway;
use crate::job_file::Stop;
use crate::runner::{Agent, Forwarding, Held, JobOptions, Runner};

/// Starts the job's runner: the way out, the runner's pid on every process it starts (the meter's
/// variable), so the guard can find them if the runner is killed outright; the guard; and, from
/// the first moment, the watch for SIGTERM, which then ends everything in order and still says so
/// on the exit line; then the model gateway.
pub(crate) async fn start(mut job: JobOptions) -> Result<Runner, Stopped> {
    let forwarding = start_egress(&job).await?;
    let guard = start_guard(&mut job)?;
    let term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| {
            setup(format!(
                "the runner cannot watch for SIGTERM ({})",
                e.kind()
            ))
        })?;
    let held = Held {
        _forwarding: forwarding,
        _guard: guard,
    };
    let gateway = start_gateway(&mut job).await?;
    Ok(Runner {
        job,
        gateway,
        term: tokio::sync::Mutex::new(term),
        _held: held,
        saying: std::sync::Mutex::new(Vec::new()),
    })
}

fn setup(why: String) -> Stop {
    Stop::new(Reason::RunnerSetupFailed, None, why)
}

/// With egress on (the job's folder holds its socket to the proxy): the proxy variables' loopback
/// port, and each of the job's endpoints on the worker's own machine at its own address and port,
/// carried to the proxy. Nothing else of the job starts until they listen; a port that cannot be
/// had fails the job (it would reach nothing, its model included), which is tried again.
async fn start_egress(job: &JobOptions) -> Result<Option<Forwarding>, Stop> {
    let socket = job.job_dir.join(job_dir::EGRESS_SOCKET);
    if !egress::forward::has_socket(&socket) {
        return Ok(None);
    }
    let cannot = |what: String, e: std::io::Error| {
        Stop::new(
            Reason::ModelUnreachable,
            None,
            format!(
                "the egress forwarder cannot listen on {what} inside the sandbox ({}), so the job would reach nothing",
                e.kind()
            ),
        )
    };
    let listener = egress::forward::bind()
        .await
        .map_err(|e| cannot(format!("127.0.0.1:{}", egress::forward::PORT), e))?;
    let mut tasks = vec![tokio::spawn(egress::forward::serve(
        listener,
        socket.clone(),
    ))];
    let declared = egress::forward::loopback_endpoints(&job.input.loopback);
    for endpoint in declared {
        let listeners = egress::forward::bind_endpoint(&endpoint)
            .await
            .map_err(|e| cannot(endpoint.authority.clone(), e))?;
        for l in listeners {
            tasks.push(tokio::spawn(egress::forward::serve_endpoint(
                l,
                socket.clone(),
                endpoint.authority.clone(),
            )));
        }
    }
    Ok(Some(Forwarding(tasks)))
}

/// The runner's pid on every process it starts, and the guard that ends them if the runner is
/// killed outright (when the job has one).
fn start_guard(job: &mut JobOptions) -> Result<Option<crate::guard::Guard>, Stop> {
    let me = std::process::id();
    job.env.retain(|(k, _)| k != crate::guard::MARK);
    job.env
        .push((crate::guard::MARK.to_owned(), me.to_string()));
    match job.guard.as_deref().map(|p| crate::guard::start(p, me)) {
        None => Ok(None),
        Some(Ok(g)) => Ok(Some(g)),
        Some(Err(e)) => Err(setup(format!(
            "the runner's guard did not start ({})",
            e.kind()
        ))),
    }
}

/// With pi, the model gateway: started before the servers (a pi a stdio server starts is pointed
/// at it by the meter's variables, which the servers get from the runner's environment) and
/// before pi, whose `models.json` points at it.
async fn start_gateway(job: &mut JobOptions) -> Result<Option<PiGateway>, Stop> {
    let Agent::Pi(pi) = &job.agent else {
        return Ok(None);
    };
    let gateway = crate::gateway::start_for_pi(pi, &job.input, &job.env, &job.agent_dir).await?;
    for (name, value) in &gateway.meter {
        job.env.retain(|(k, _)| k != name);
        job.env.push((name.clone(), value.clone()));
    }
    Ok(Some(gateway))
}
