//! Persistence for keel: the [`keel_protocol::Store`] port over SQLite.
//!
//! SQLite is the default, embedded store (one file, nothing to install). The
//! schema is versioned by SQL files under `migrations/<backend>/`, so a
//! PostgreSQL store can live next to it with its own dialect.

mod sqlite;

pub use sqlite::SqliteStore;
