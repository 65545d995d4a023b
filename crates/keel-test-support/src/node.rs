//! A node whose commits and lease renewals a test can intercept.
//!
//! Tests that need a node to do something at an exact moment (stall right
//! after a commit, refuse one as a taken-over run, record what was written)
//! implement [`NodeHooks`] for what they change; [`HookedNode`] forwards
//! everything else to the single node over the test's store.

use std::sync::Arc;
use std::time::Duration;

use keel_protocol::{
    Commit, Coordination, Event, Notices, QueuedCommand, RunRecord, SingleNode, Store, StoreError,
};
use serde_json::Value;

/// What a test changes about a node. Each method gets the single node it
/// would otherwise have gone to, and forwards to it by default.
#[async_trait::async_trait]
pub trait NodeHooks: Send + Sync + 'static {
    async fn commit(
        &self,
        node: &SingleNode,
        run_id: &str,
        commit: Commit,
    ) -> Result<Vec<Event>, StoreError> {
        node.commit(run_id, commit).await
    }

    async fn renew(
        &self,
        node: &SingleNode,
        run_ids: &[String],
    ) -> Result<Vec<String>, StoreError> {
        node.renew(run_ids).await
    }
}

/// How the node presents itself: the single node as it is, or a member of
/// a cluster, whose runs are leased and may be lost.
#[derive(Clone, Debug)]
pub enum Membership {
    Single,
    Shared { node_id: String, lease: Duration },
}

/// The single node over a test's store, with [`NodeHooks`] in front of
/// its commits and renewals.
pub struct HookedNode<H> {
    inner: SingleNode,
    membership: Membership,
    hooks: Arc<H>,
}

impl<H: NodeHooks> HookedNode<H> {
    pub fn new(store: Arc<dyn Store>, membership: Membership, hooks: Arc<H>) -> Self {
        Self {
            inner: SingleNode::new(store),
            membership,
            hooks,
        }
    }
}

#[async_trait::async_trait]
impl<H: NodeHooks> Coordination for HookedNode<H> {
    fn node_id(&self) -> &str {
        match &self.membership {
            Membership::Single => self.inner.node_id(),
            Membership::Shared { node_id, .. } => node_id,
        }
    }

    fn is_shared(&self) -> bool {
        match self.membership {
            Membership::Single => self.inner.is_shared(),
            Membership::Shared { .. } => true,
        }
    }

    fn lease(&self) -> Duration {
        match self.membership {
            Membership::Single => self.inner.lease(),
            Membership::Shared { lease, .. } => lease,
        }
    }

    async fn acquire(&self, run_id: &str) -> Result<bool, StoreError> {
        self.inner.acquire(run_id).await
    }

    async fn renew(&self, run_ids: &[String]) -> Result<Vec<String>, StoreError> {
        self.hooks.renew(&self.inner, run_ids).await
    }

    async fn claim(&self, limit: u32) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.claim(limit).await
    }

    async fn release_all(&self) -> Result<(), StoreError> {
        self.inner.release_all().await
    }

    async fn owned_count(&self) -> Result<u64, StoreError> {
        self.inner.owned_count().await
    }

    async fn commit(&self, run_id: &str, commit: Commit) -> Result<Vec<Event>, StoreError> {
        self.hooks.commit(&self.inner, run_id, commit).await
    }

    async fn post_command(
        &self,
        run_id: &str,
        tenant: &str,
        body: &Value,
    ) -> Result<(), StoreError> {
        self.inner.post_command(run_id, tenant, body).await
    }

    async fn take_commands(&self) -> Result<Vec<QueuedCommand>, StoreError> {
        self.inner.take_commands().await
    }

    async fn listen(&self) -> Result<Box<dyn Notices>, StoreError> {
        self.inner.listen().await
    }
}
