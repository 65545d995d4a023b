//! Persistence for keel: the [`keel_protocol::Store`] port over SQLite or
//! PostgreSQL.
//!
//! SQLite is the default, embedded store (one file, nothing to install);
//! PostgreSQL is the store several nodes share. Both follow the same
//! conformance suite (`keel_test_support::store_suite`). The schema is
//! versioned by SQL files under `migrations/<backend>/`, one dialect each.

mod background;
mod node;
mod numbering;
mod open;
mod postgres;
mod sqlite;

pub use background::yield_when_woken;
pub use node::{NodeSettings, migrate, open_node};
pub use open::open;
pub use postgres::{PgNode, PostgresStore};
pub use sqlite::SqliteStore;
