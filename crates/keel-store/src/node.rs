//! A keel node's view of its database: the store plus the coordination that
//! goes with it (SPEC §10). SQLite has one node, which owns everything;
//! PostgreSQL may be shared by many, each under its own id and leases.

use std::sync::Arc;
use std::time::Duration;

use keel_protocol::{Coordination, SingleNode, Store, StoreError};

use crate::{PostgresStore, SqliteStore};

/// Who this node is among the nodes sharing a database.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// Unique among live nodes; recorded as the owner of the runs it runs.
    pub node_id: String,
    /// How long a run stays this node's without a renewal.
    pub lease: Duration,
}

/// Opens the store at `url` (see [`crate::open`]) as node `node`.
pub async fn open_node(
    url: &str,
    node: NodeSettings,
) -> Result<(Arc<dyn Store>, Arc<dyn Coordination>), StoreError> {
    if is_postgres(url) {
        let store = Arc::new(PostgresStore::connect_node(url, node.lease).await?);
        let coord: Arc<dyn Coordination> = Arc::new(store.node(node.node_id, node.lease));
        return Ok((store, coord));
    }
    let store = crate::open(url).await?;
    let coord: Arc<dyn Coordination> = Arc::new(SingleNode::new(store.clone()));
    Ok((store, coord))
}

/// Brings the database at `url` to this build's schema and returns its
/// version; what every node also does when it starts.
pub async fn migrate(url: &str) -> Result<i64, StoreError> {
    if is_postgres(url) {
        let store = PostgresStore::connect(url).await?;
        store.close().await;
        return Ok(PostgresStore::schema_version());
    }
    drop(crate::open(url).await?);
    Ok(SqliteStore::schema_version())
}

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}
