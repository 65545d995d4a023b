//! Threads that work behind the async runtime's thread (the store's writer
//! and checkpointer, the blocking pool that runs the store's reads) let it
//! run on when they are woken.
//!
//! Linux lets a thread that an event wakes take the CPU from the thread
//! running there at once (wake-up preemption). Where keel has one CPU, the
//! runtime's thread wakes the writer with the first commit it queues, and
//! the writer then ran before the other runs ready beside it had queued
//! theirs: batches of two or three commits, and two thread switches for
//! each (bench/README.md counted them). Under `SCHED_BATCH` a woken thread
//! waits until the running one blocks or its time slice ends, so a batch
//! carries every commit queued by then. Its share of the CPU is unchanged:
//! the policy keeps the nice value and gives up only the wake-up
//! preemption (sched(7)).

/// Puts the calling thread under `SCHED_BATCH`. Best effort: a thread that
/// cannot be changed (another OS, a sandbox that forbids it) runs as it
/// was, and a keel started with a nice value of its own keeps its threads
/// as they are.
pub fn yield_when_woken() {
    #[cfg(target_os = "linux")]
    linux::set_batch();
}

#[cfg(target_os = "linux")]
mod linux {
    use thread_priority::unix::{
        NormalThreadSchedulePolicy, ThreadSchedulePolicy, set_thread_priority_and_policy,
        thread_native_id,
    };
    use thread_priority::{ThreadPriority, ThreadPriorityValue};

    const BATCH: ThreadSchedulePolicy =
        ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Batch);

    pub(super) fn set_batch() {
        // Setting the policy also sets the thread's nice value, from a
        // portable priority mapped onto it: only the default, 0, is set
        // back as it was.
        if nice() != Some(0) {
            return;
        }
        let Some(priority) = nice_zero() else {
            return;
        };
        if let Err(e) = set_thread_priority_and_policy(thread_native_id(), priority, BATCH) {
            tracing::debug!(error = ?e, "thread left under its default scheduling policy");
        }
    }

    /// The portable priority that the crate maps onto nice 0 under
    /// `SCHED_BATCH`, found through its own mapping rather than by
    /// restating it.
    fn nice_zero() -> Option<ThreadPriority> {
        (*ThreadPriorityValue::MIN..=*ThreadPriorityValue::MAX)
            .filter_map(|p| ThreadPriorityValue::try_from(p).ok())
            .map(ThreadPriority::Crossplatform)
            .find(|p| matches!(p.to_posix(BATCH), Ok(0)))
    }

    /// The calling thread's nice value, field 19 of `/proc/thread-self/stat`
    /// (after the command name, which may hold spaces, in parentheses).
    fn nice() -> Option<i64> {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
        let (_, fields) = stat.rsplit_once(") ")?;
        // `fields` starts at field 3 (the state).
        fields.split(' ').nth(19 - 3)?.parse().ok()
    }

    #[cfg(test)]
    mod tests {
        #![allow(clippy::unwrap_used)]

        /// Field `n` (1-based, as proc(5) numbers them) of the calling
        /// thread's stat line.
        fn stat_field(n: usize) -> String {
            let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
            let (_, fields) = stat.rsplit_once(") ").unwrap();
            fields.split(' ').nth(n - 3).unwrap().to_owned()
        }

        #[test]
        fn a_thread_is_put_under_sched_batch_and_keeps_its_nice_value() {
            std::thread::spawn(|| {
                let before = super::nice().unwrap();
                super::set_batch();
                // Field 41 is the policy: SCHED_BATCH is 3, SCHED_OTHER 0.
                let expected = if before == 0 { "3" } else { "0" };
                assert_eq!(stat_field(41), expected);
                assert_eq!(super::nice(), Some(before));
                assert_eq!(stat_field(19), before.to_string());
            })
            .join()
            .unwrap();
        }
    }
}
