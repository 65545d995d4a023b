//! Commits written behind the run: one task per run writes them in order
//! while the run goes on (see `RunActor::commit_behind`).
//!
//! A turn made while the previous one is still being written does not wait
//! for it: it is queued, merged with any other turn queued meanwhile, and
//! the task writes the lot in one commit once the write in progress is
//! done. A store whose commit takes longer than a turn (PostgreSQL, which
//! flushes its log on every commit) then costs the run one commit per few
//! turns instead of a wait on every one. At most [`MAX_UNSTORED_TURNS`] are
//! in flight or queued at once, which bounds what a node that dies can
//! lose: turns of idempotent calls, which the resumed run makes again.

use std::sync::{Arc, Mutex, PoisonError};

use keel_protocol::{Commit, StoreError};
use tokio::task::JoinHandle;

use crate::runtime::Shared;

/// Turns that may be on their way to the store at once, being written or
/// queued.
pub(super) const MAX_UNSTORED_TURNS: usize = 4;

/// The task writing a run's commits, and the turns queued for it.
pub(super) struct Behind {
    task: JoinHandle<Result<(), StoreError>>,
    queue: Arc<Mutex<Queue>>,
}

#[derive(Default)]
struct Queue {
    /// The queued turns, merged into one commit.
    next: Option<Commit>,
    queued: usize,
    /// Turns in the write in progress.
    writing: usize,
    /// The task has taken its last commit: nothing queued now would be
    /// written.
    done: bool,
}

impl Behind {
    /// Starts writing `commit`.
    pub(super) fn start(
        shared: Arc<Shared>,
        run_id: String,
        agent_id: String,
        commit: Commit,
    ) -> Self {
        let queue = Arc::new(Mutex::new(Queue {
            writing: 1,
            ..Queue::default()
        }));
        let taken = queue.clone();
        let write = async move {
            let mut commit = commit;
            loop {
                let published = shared.coord.commit(&run_id, commit).await;
                let mut queue = taken.lock().unwrap_or_else(PoisonError::into_inner);
                let published = match published {
                    Ok(published) => published,
                    Err(e) => {
                        // What was queued is dropped: the run stops at its
                        // next write, and whoever resumes it makes those
                        // turns again.
                        queue.done = true;
                        return Err(e);
                    }
                };
                let next = queue.next.take();
                queue.writing = std::mem::take(&mut queue.queued);
                queue.done = next.is_none();
                drop(queue);
                super::publish(&shared, &agent_id, published);
                match next {
                    Some(next) => commit = next,
                    None => return Ok(()),
                }
            }
        };
        Self {
            task: tokio::spawn(tracing::Instrument::in_current_span(write)),
            queue,
        }
    }

    /// Queues the turn `commit` behind the write in progress; gives it back
    /// when the task is done or [`MAX_UNSTORED_TURNS`] are unstored already.
    pub(super) fn queue(&self, commit: Commit) -> Option<Commit> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.done || queue.writing + queue.queued >= MAX_UNSTORED_TURNS {
            return Some(commit);
        }
        match &mut queue.next {
            Some(next) => next.absorb(commit),
            None => queue.next = Some(commit),
        }
        queue.queued += 1;
        None
    }

    pub(super) fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits until everything queued is written.
    pub(super) async fn written(self) -> Result<(), StoreError> {
        match self.task.await {
            Ok(written) => written,
            Err(e) => Err(StoreError::Backend(format!(
                "the task writing a commit failed: {e}"
            ))),
        }
    }
}
