//! Sending a run's answer, questions and approval requests back to the
//! chat channel it came from (see `crate::outbound`).

use keel_protocol::EventKind;

use super::RunActor;
use crate::outbound::Outgoing;

impl RunActor {
    /// Sends `message` when the run came from a channel the runtime can
    /// answer; returns one `channel_delivery` event per attempt, for the
    /// caller to commit with what it commits next.
    pub(super) async fn deliver(&self, message: Outgoing) -> Vec<EventKind> {
        let (Some(origin), Some(outbound)) = (&self.origin, &self.shared.options.outbound) else {
            return Vec::new();
        };
        let Some(channel) = outbound.channel_of(origin) else {
            return Vec::new();
        };
        let what = message.kind();
        outbound
            .deliver(&self.principal.tenant, origin, message)
            .await
            .into_iter()
            .zip(1u32..)
            .map(|(a, attempt)| EventKind::ChannelDelivery {
                channel: channel.clone(),
                what,
                attempt,
                ok: a.ok,
                detail: a.detail,
            })
            .collect()
    }
}
