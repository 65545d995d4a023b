//! Identity links: channel identities (a channel and a sender id on it)
//! that are one person, and the keel principal that person is.

use std::collections::HashMap;

use keel_config::{ChannelConfig, IdentityLink};

/// One linked person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    /// The id that stands in for the sender in direct session keys.
    pub id: String,
    /// The keel principal the person is, for deciding approvals.
    pub principal: Option<String>,
    /// The tenant of the person's channels.
    pub tenant: String,
}

/// Looks up who a (channel, sender) pair is.
#[derive(Debug, Clone, Default)]
pub struct IdentityLinks {
    persons: Vec<Person>,
    by_identity: HashMap<(String, String), usize>,
}

impl IdentityLinks {
    /// Builds the lookup. Configuration checks reject links across tenants
    /// and identities linked twice; should an unchecked configuration get
    /// here anyway, an identity of another tenant than the link's first is
    /// left out and the first link naming an identity keeps it, so no
    /// session is ever shared across tenants.
    pub fn new(links: &[IdentityLink], channels: &[ChannelConfig]) -> Self {
        let tenant_of: HashMap<&str, &str> = channels
            .iter()
            .map(|c| (c.id.as_str(), c.tenant.as_str()))
            .collect();
        let mut out = Self::default();
        for link in links {
            let mut tenant: Option<&str> = None;
            let index = out.persons.len();
            for identity in &link.identities {
                let Some(&t) = tenant_of.get(identity.channel.as_str()) else {
                    continue;
                };
                if *tenant.get_or_insert(t) != t {
                    continue;
                }
                out.by_identity
                    .entry((identity.channel.clone(), identity.sender.clone()))
                    .or_insert(index);
            }
            out.persons.push(Person {
                id: link.person.clone(),
                principal: link.principal.clone(),
                tenant: tenant.unwrap_or_default().to_owned(),
            });
        }
        out
    }

    /// The person a sender on a channel is, if a link names them.
    pub fn person(&self, channel: &str, sender: &str) -> Option<&Person> {
        self.by_identity
            .get(&(channel.to_owned(), sender.to_owned()))
            .and_then(|&i| self.persons.get(i))
    }

    /// The keel principal a sender on a channel is, if a link says so.
    pub fn principal(&self, channel: &str, sender: &str) -> Option<&str> {
        self.person(channel, sender)?.principal.as_deref()
    }
}
