//! Session keys: which conversation with an agent a message continues.
//! Keys are unique within a tenant (channel ids belong to one tenant, and
//! so do the people identity links name), so sessions are stored under
//! the channel's tenant and key together.

use keel_config::DmScope;

use crate::inbound::{ChatType, Inbound};

/// The session a message belongs to, for `agent`.
///
/// Direct messages follow `dm_scope`:
/// - `main`: `agent:<id>:main`.
/// - `per-peer`: `agent:<id>:direct:<peer>`, where the peer is the linked
///   person's id (`person`) when an identity link names the sender, so one
///   person keeps one session across channels; an unlinked sender is
///   `<channel>:<sender>`, because raw ids of different services may
///   coincide and only a link says two identities are one person. Person
///   ids have no `:`, so the two forms never meet.
/// - `per-channel-peer`: `agent:<id>:<channel>:direct:<sender>`.
/// - `per-account-channel-peer`: `agent:<id>:<channel>:<account>:direct:<sender>`.
///
/// The channel scopes keep the raw sender id even for a linked person: the
/// channel already separates their sessions, and a person id could equal
/// another sender's raw id on the same channel.
///
/// Group and channel chats get `agent:<id>:<channel>:group:<chat>`
/// (`…:channel:<chat>`), with `:thread:<thread>` for a thread, whatever
/// `dm_scope` says: a group is one shared conversation.
pub fn session_key(agent: &str, msg: &Inbound, scope: DmScope, person: Option<&str>) -> String {
    let channel = &msg.channel;
    let sender = &msg.sender;
    match msg.chat_type {
        ChatType::Direct => match (scope, person) {
            (DmScope::Main, _) => format!("agent:{agent}:main"),
            (DmScope::PerPeer, Some(person)) => format!("agent:{agent}:direct:{person}"),
            (DmScope::PerPeer, None) => format!("agent:{agent}:direct:{channel}:{sender}"),
            (DmScope::PerChannelPeer, _) => format!("agent:{agent}:{channel}:direct:{sender}"),
            (DmScope::PerAccountChannelPeer, _) => {
                format!("agent:{agent}:{channel}:{}:direct:{sender}", msg.account)
            }
        },
        ChatType::Group | ChatType::Channel => {
            let kind = msg.chat_type.as_str();
            let mut key = format!("agent:{agent}:{channel}:{kind}:{}", msg.chat);
            if let Some(thread) = &msg.thread {
                key.push_str(":thread:");
                key.push_str(thread);
            }
            key
        }
    }
}
