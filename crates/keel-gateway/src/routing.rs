//! Which agent answers a message, and in which session.
//!
//! `[[routing.bindings]]` are sorted once, when the [`Router`] is built,
//! into per-channel indexes by the field that makes each binding specific
//! (its tier). Resolving a message is then a handful of hash lookups, one
//! per tier, most specific first; among bindings of one tier the first in
//! the file wins. The indexes are the cache: what depends only on the
//! channel and account (the account and channel tiers) is one lookup, and
//! what depends on the peer, guild or team is looked up by exactly that
//! key. Nothing is filled in lazily, so nothing can go stale: a config
//! reload builds a new Router.

use std::collections::HashMap;

use keel_config::{Config, DmScope, RouteBinding};
use serde::{Deserialize, Serialize};

use crate::identity::IdentityLinks;
use crate::inbound::Inbound;
use crate::session::session_key;

/// Which tier of bindings chose the agent, most specific first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchedBy {
    /// A binding naming the message's conversation (`peer`).
    Peer,
    /// A binding naming the conversation a thread belongs to.
    ParentPeer,
    /// A binding naming the guild and one of the sender's roles there.
    GuildRoles,
    /// A binding naming the guild.
    Guild,
    /// A binding naming the team.
    Team,
    /// A binding naming the bot account.
    Account,
    /// A binding naming only the channel (or `account = "*"`).
    Channel,
    /// No binding: `routing.default_agent`.
    Default,
}

impl MatchedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Peer => "peer",
            Self::ParentPeer => "parent_peer",
            Self::GuildRoles => "guild_roles",
            Self::Guild => "guild",
            Self::Team => "team",
            Self::Account => "account",
            Self::Channel => "channel",
            Self::Default => "default",
        }
    }
}

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub agent: String,
    pub matched_by: MatchedBy,
    /// The index in `routing.bindings` of the binding that matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<usize>,
    /// The session the message continues (see [`session_key`]); unique
    /// within `tenant`.
    pub session_key: String,
    pub tenant: String,
    /// The linked person who sent it, if an identity link names the sender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub person: Option<String>,
}

/// A binding with its index, reduced to the conditions checked after the
/// index lookup that found it.
#[derive(Debug, Clone)]
struct Candidate {
    index: usize,
    agent: String,
    /// `None` matches any account (`*` or unset).
    account: Option<String>,
    guild: Option<String>,
    roles: Vec<String>,
    team: Option<String>,
}

impl Candidate {
    fn new(index: usize, b: &RouteBinding) -> Self {
        Self {
            index,
            agent: b.agent.clone(),
            account: b.account.clone().filter(|a| a != "*"),
            guild: b.guild.clone(),
            roles: b.roles.clone(),
            team: b.team.clone(),
        }
    }

    /// The conditions besides the one the index already matched.
    fn matches(&self, msg: &Inbound) -> bool {
        let same = |want: &Option<String>, have: &Option<String>| {
            want.as_ref().is_none_or(|w| have.as_ref() == Some(w))
        };
        self.account.as_ref().is_none_or(|a| *a == msg.account)
            && same(&self.guild, &msg.guild)
            && same(&self.team, &msg.team)
            && (self.roles.is_empty() || self.roles.iter().any(|r| msg.roles.contains(r)))
    }
}

/// One channel's bindings, by tier.
#[derive(Debug, Default)]
struct ChannelIndex {
    peers: HashMap<String, Vec<Candidate>>,
    guild_roles: HashMap<String, Vec<Candidate>>,
    guilds: HashMap<String, Vec<Candidate>>,
    teams: HashMap<String, Vec<Candidate>>,
    /// Account-only bindings: the first per account wins outright.
    accounts: HashMap<String, Candidate>,
    /// The first channel-only binding.
    wildcard: Option<Candidate>,
}

impl ChannelIndex {
    fn add(&mut self, index: usize, b: &RouteBinding) {
        let c = Candidate::new(index, b);
        let push = |map: &mut HashMap<String, Vec<Candidate>>, key: &str, c: Candidate| {
            map.entry(key.to_owned()).or_default().push(c);
        };
        if let Some(peer) = &b.peer {
            push(&mut self.peers, peer, c);
        } else if let Some(guild) = &b.guild {
            if b.roles.is_empty() {
                push(&mut self.guilds, guild, c);
            } else {
                push(&mut self.guild_roles, guild, c);
            }
        } else if let Some(team) = &b.team {
            push(&mut self.teams, team, c);
        } else if let Some(account) = c.account.clone() {
            self.accounts.entry(account).or_insert(c);
        } else if self.wildcard.is_none() {
            self.wildcard = Some(c);
        }
    }

    fn resolve(&self, msg: &Inbound) -> Option<(&Candidate, MatchedBy)> {
        let tiers = [
            (first(&self.peers, Some(&msg.peer), msg), MatchedBy::Peer),
            (
                first(&self.peers, msg.parent_peer.as_deref(), msg),
                MatchedBy::ParentPeer,
            ),
            (
                first(&self.guild_roles, msg.guild.as_deref(), msg),
                MatchedBy::GuildRoles,
            ),
            (
                first(&self.guilds, msg.guild.as_deref(), msg),
                MatchedBy::Guild,
            ),
            (
                first(&self.teams, msg.team.as_deref(), msg),
                MatchedBy::Team,
            ),
            (self.accounts.get(&msg.account), MatchedBy::Account),
            (self.wildcard.as_ref(), MatchedBy::Channel),
        ];
        tiers.into_iter().find_map(|(c, tier)| c.map(|c| (c, tier)))
    }
}

/// The first candidate under `key` whose other conditions hold.
fn first<'a>(
    map: &'a HashMap<String, Vec<Candidate>>,
    key: Option<&str>,
    msg: &Inbound,
) -> Option<&'a Candidate> {
    key.and_then(|k| map.get(k))
        .and_then(|cs| cs.iter().find(|c| c.matches(msg)))
}

/// Routes messages to agents and sessions, from one configuration.
#[derive(Debug)]
pub struct Router {
    channels: HashMap<String, ChannelIndex>,
    default_agent: Option<String>,
    dm_scope: DmScope,
    links: IdentityLinks,
}

impl Router {
    /// Builds the router. The default agent is `routing.default_agent`,
    /// else the agent that serves runs naming none (`default`, else the
    /// first agent).
    pub fn new(config: &Config) -> Self {
        let mut channels: HashMap<String, ChannelIndex> = HashMap::new();
        for (i, b) in config.routing.bindings.iter().enumerate() {
            channels.entry(b.channel.clone()).or_default().add(i, b);
        }
        let default_agent = config.routing.default_agent.clone().or_else(|| {
            config
                .agents
                .iter()
                .find(|a| a.id == "default")
                .or_else(|| config.agents.first())
                .map(|a| a.id.clone())
        });
        Self {
            channels,
            default_agent,
            dm_scope: config.routing.dm_scope,
            links: IdentityLinks::new(&config.routing.identity_links, &config.channels),
        }
    }

    /// The agent and session for a message; `None` only when no binding
    /// matches and there is no agent at all to default to.
    pub fn route(&self, msg: &Inbound) -> Option<Route> {
        let (agent, matched_by, binding) = match self
            .channels
            .get(&msg.channel)
            .and_then(|index| index.resolve(msg))
        {
            Some((c, tier)) => (c.agent.clone(), tier, Some(c.index)),
            None => (self.default_agent.clone()?, MatchedBy::Default, None),
        };
        let person = self
            .links
            .person(&msg.channel, &msg.sender)
            .map(|p| p.id.clone());
        Some(Route {
            session_key: session_key(&agent, msg, self.dm_scope, person.as_deref()),
            tenant: msg.tenant.clone(),
            agent,
            matched_by,
            binding,
            person,
        })
    }

    /// The identity links, to map a button click's sender to a principal.
    pub fn identities(&self) -> &IdentityLinks {
        &self.links
    }

    pub fn dm_scope(&self) -> DmScope {
        self.dm_scope
    }
}
