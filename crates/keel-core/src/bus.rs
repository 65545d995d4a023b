//! Live fan-out of persisted events to subscribers (SSE clients, the CLI).
//!
//! Only events already written to the store are published here, so a
//! subscriber that lags or connects late catches up from the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use keel_protocol::Event;
use tokio::sync::broadcast;

/// Events a subscriber may fall behind by before it reads the rest from the
/// store. tokio allocates every slot when the channel is made, one channel
/// per followed run, so this is memory per run: with 512 slots, peak RSS at
/// 2,000 concurrent followed runs was about 12 MB higher (bench/README.md).
/// A commit publishes a handful of events; a follower that lags catches up
/// from the store, losing nothing.
const CAPACITY: usize = 64;

#[derive(Default)]
pub struct EventBus {
    channels: Mutex<HashMap<String, broadcast::Sender<Arc<Event>>>>,
}

impl EventBus {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn subscribe(&self, run_id: &str) -> broadcast::Receiver<Arc<Event>> {
        let mut map = self.lock();
        map.entry(run_id.to_owned())
            .or_insert_with(|| broadcast::channel(CAPACITY).0)
            .subscribe()
    }

    /// Sends a run's newly stored events to its followers. Taken by value:
    /// each goes out as it is, with its JSON if the store made it, not as
    /// a copy.
    pub fn publish(&self, events: Vec<Event>) {
        let Some(first) = events.first() else {
            return;
        };
        let run_id = first.run_id.clone();
        let terminal = events.iter().any(Event::is_terminal);
        let mut map = self.lock();
        if let Some(tx) = map.get(&run_id) {
            for e in events {
                // No receiver is fine: nobody is watching this run right now.
                let _ = tx.send(Arc::new(e));
            }
        }
        if terminal {
            // Receivers still drain what was sent, then see the channel close.
            map.remove(&run_id);
        }
    }

    /// Whether anyone here follows the run right now.
    pub fn is_watched(&self, run_id: &str) -> bool {
        self.lock()
            .get(run_id)
            .is_some_and(|tx| tx.receiver_count() > 0)
    }

    /// Runs someone here follows right now.
    pub fn watched(&self) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, tx)| tx.receiver_count() > 0)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Drops the channel of a run nobody watches any more.
    pub fn release(&self, run_id: &str) {
        let mut map = self.lock();
        if map.get(run_id).is_some_and(|tx| tx.receiver_count() == 0) {
            map.remove(run_id);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, broadcast::Sender<Arc<Event>>>> {
        // A poisoned lock only means another thread panicked mid-insert; the map is still usable.
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }
}
