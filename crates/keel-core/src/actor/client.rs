//! Client tools (SPEC §5, §7): functions the caller executes itself. Their
//! calls pass the same pipeline as any other (see `apply`); instead of
//! running here, the run waits for the caller's outputs, which are then
//! observed (verified, fenced) like any tool result.

use keel_guard::loop_detect::call_fingerprint;
use keel_protocol::{EventKind, Pending, RunStatus, ToolOutput};

use super::{Exit, Flow, RunActor, synthetic_result};
use crate::pipeline::parse_arguments;
use crate::runtime::{ClientToolOutput, Command};

impl RunActor {
    /// The run waits (status `waiting_input`) until the caller sends the outputs.
    pub(super) async fn enter_client_wait(&mut self) -> Result<(), Exit> {
        let calls = self.client_calls();
        let pending = Pending::ClientTool {
            calls: calls.clone(),
        };
        let event = EventKind::WaitingClientTool { calls };
        self.commit_status(
            vec![event],
            Vec::new(),
            RunStatus::WaitingInput,
            Some(pending),
        )
        .await
    }

    pub(super) async fn wait_for_tool_outputs(&mut self) -> Result<Vec<ClientToolOutput>, Exit> {
        let since = tokio::time::Instant::now();
        let outputs = loop {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(Exit::Cancelled),
                cmd = self.commands.recv() => match cmd {
                    Some(Command::ToolOutputs(outputs)) => break outputs,
                    Some(other) => self.accept(other),
                    None => return Err(Exit::Detached),
                },
            }
        };
        let waited = since.elapsed();
        self.state.waited_s += waited.as_secs_f64();
        self.started += waited;
        Ok(outputs)
    }

    /// Each waiting call gets exactly one result: the caller's output, or a
    /// note that none was given.
    pub(super) async fn resolve_tool_outputs(
        &mut self,
        outputs: Vec<ClientToolOutput>,
    ) -> Result<Flow, Exit> {
        let waiting = std::mem::take(&mut self.state.client_waiting);
        self.commit_status(Vec::new(), Vec::new(), RunStatus::Running, None)
            .await?;
        for call in waiting {
            let Some(out) = outputs.iter().find(|o| o.call_id == call.id) else {
                let result =
                    synthetic_result(&call, "Error: the client returned no output for this call");
                self.commit(Vec::new(), vec![result]).await?;
                continue;
            };
            // An Arc of its own, so the tool can be read while the run records its result.
            let client_tools = self.client_tools.clone();
            let Some(reg) = client_tools.get(&call.name) else {
                let result = synthetic_result(&call, "Error: no such client tool");
                self.commit(Vec::new(), vec![result]).await?;
                continue;
            };
            let args = parse_arguments(&call.arguments).unwrap_or_default();
            let fingerprint = call_fingerprint(&call.name, &args);
            let observed = self.observe(
                &call,
                reg,
                &fingerprint,
                &call.arguments,
                Ok(ToolOutput::text(out.output.clone())),
                0,
            );
            self.commit(observed.events, vec![observed.message]).await?;
        }
        Ok(Flow::Continue)
    }
}
