//! Checks on the chat gateway: each channel has the secrets its kind needs
//! and nothing it would ignore, bindings name agents and channels that
//! exist, and identity links never join people across tenants.

use std::collections::BTreeMap;

use crate::env::Env;
use crate::findings::Findings;
use crate::gateway::{ChannelConfig, ChannelKind, HookPoint, IdentityLink, RouteBinding};
use crate::model::Config;
use crate::tree::KeyPath;

use super::{check_env_var_named, check_http_url, root, unique_names};

pub(super) fn check(config: &Config, env: &dyn Env, found: &mut Findings) {
    let ids: Vec<&str> = config.channels.iter().map(|c| c.id.as_str()).collect();
    unique_names(found, "channels", "id", "channel id", &ids);
    for (i, channel) in config.channels.iter().enumerate() {
        check_channel(found, env, &root("channels").index(i), channel);
    }
    check_routing(config, found);
    check_hooks(config, env, found);
}

/// Channel ids appear in URL paths and in `:`-separated session keys.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn check_channel(found: &mut Findings, env: &dyn Env, at: &KeyPath, channel: &ChannelConfig) {
    let id_key = at.key("id");
    if !channel.id.is_empty() && !valid_id(&channel.id) && !found.is_invalid(&id_key) {
        found.error_at(
            &id_key,
            format!(
                "{:?} may hold only letters, digits, '-' and '_' (it is a URL path segment and part of session keys)",
                channel.id
            ),
        );
    }
    if channel.tenant.is_empty() {
        found.error_at(&at.key("tenant"), "must not be empty".into());
    }
    if found.is_invalid(&at.key("kind")) {
        return;
    }
    let kind = channel.kind.as_str();
    for (key, what) in needed_secrets(channel.kind) {
        match field(channel, key) {
            Some(var) => check_env_var_named(
                found,
                env,
                &at.key(key),
                var,
                &format!("{what} of channel {:?}", channel.id),
            ),
            None => found.error_at(
                &at.key(key),
                format!("a {kind} channel needs {key} (the variable holding {what})"),
            ),
        }
    }
    for key in unused_keys(channel.kind) {
        if field(channel, key).is_some() {
            found.error_at(&at.key(key), format!("is not used by a {kind} channel"));
        }
    }
    if channel.kind == ChannelKind::Telegram
        && let Some(var) = &channel.secret_token_env
        && let Some(value) = env.var(var).filter(|v| !v.is_empty())
        && !telegram_secret_ok(&value)
    {
        found.warning_at(
            &at.key("secret_token_env"),
            format!(
                "the value of {var} is not a Telegram secret token: 1 to 256 of A-Z, a-z, 0-9, '_' and '-'"
            ),
        );
    }
    if let Some(url) = &channel.api_base {
        check_http_url(found, &at.key("api_base"), url);
    }
    match (&channel.reply_url, channel.kind) {
        (Some(url), ChannelKind::Webhook) => check_http_url(found, &at.key("reply_url"), url),
        (None, ChannelKind::Webhook) => found.error_at(
            &at.key("reply_url"),
            "a webhook channel needs reply_url (where answers are POSTed)".into(),
        ),
        _ => {}
    }
    if channel.approvers_chat.as_deref() == Some("") {
        found.error_at(&at.key("approvers_chat"), "must not be empty".into());
    }
}

/// The `*_env` keys a kind needs, with what each variable holds.
fn needed_secrets(kind: ChannelKind) -> &'static [(&'static str, &'static str)] {
    match kind {
        ChannelKind::Telegram => &[
            ("bot_token_env", "the bot token"),
            ("secret_token_env", "the webhook secret token"),
        ],
        ChannelKind::Slack => &[
            ("bot_token_env", "the bot token"),
            ("signing_secret_env", "the signing secret"),
        ],
        ChannelKind::Webhook => &[("signing_secret_env", "the signing secret")],
    }
}

/// Keys a kind never reads: setting one is a mistake worth naming.
fn unused_keys(kind: ChannelKind) -> &'static [&'static str] {
    match kind {
        ChannelKind::Telegram => &["signing_secret_env", "reply_url"],
        ChannelKind::Slack => &["secret_token_env", "reply_url"],
        ChannelKind::Webhook => &["bot_token_env", "secret_token_env", "api_base"],
    }
}

fn field<'a>(channel: &'a ChannelConfig, key: &str) -> Option<&'a String> {
    match key {
        "bot_token_env" => channel.bot_token_env.as_ref(),
        "secret_token_env" => channel.secret_token_env.as_ref(),
        "signing_secret_env" => channel.signing_secret_env.as_ref(),
        "api_base" => channel.api_base.as_ref(),
        "reply_url" => channel.reply_url.as_ref(),
        _ => None,
    }
}

/// What Telegram's `setWebhook` accepts as `secret_token`.
fn telegram_secret_ok(value: &str) -> bool {
    (1..=256).contains(&value.len())
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn known(names: &[&str]) -> String {
    if names.is_empty() {
        "none are configured".into()
    } else {
        format!("known: {}", names.join(", "))
    }
}

fn check_routing(config: &Config, found: &mut Findings) {
    let routing = root("routing");
    let agents: Vec<&str> = config.agents.iter().map(|a| a.id.as_str()).collect();
    let channels: Vec<&str> = config
        .channels
        .iter()
        .map(|c| c.id.as_str())
        .filter(|id| !id.is_empty())
        .collect();
    if let Some(agent) = &config.routing.default_agent
        && !agents.contains(&agent.as_str())
    {
        found.error_at(
            &routing.key("default_agent"),
            format!("no agent with id {agent:?} ({})", known(&agents)),
        );
    }

    let mut first: Vec<(usize, Conditions)> = Vec::new();
    for (i, binding) in config.routing.bindings.iter().enumerate() {
        let at = routing.key("bindings").index(i);
        check_binding(found, &at, binding, &agents, &channels);
        let conditions = Conditions::of(binding);
        if let Some((j, _)) = first.iter().find(|(_, c)| *c == conditions) {
            let first_key = routing.key("bindings").index(*j);
            found.warning_at(
                &at,
                format!(
                    "never matches: {} has the same conditions and comes first",
                    first_key.render()
                ),
            );
        } else {
            first.push((i, conditions));
        }
    }
    check_identity_links(config, found, &channels);
}

fn check_binding(
    found: &mut Findings,
    at: &KeyPath,
    binding: &RouteBinding,
    agents: &[&str],
    channels: &[&str],
) {
    let agent_key = at.key("agent");
    if !found.is_invalid(&agent_key) && !agents.contains(&binding.agent.as_str()) {
        found.error_at(
            &agent_key,
            format!("no agent with id {:?} ({})", binding.agent, known(agents)),
        );
    }
    let channel_key = at.key("channel");
    if !found.is_invalid(&channel_key) && !channels.contains(&binding.channel.as_str()) {
        found.error_at(
            &channel_key,
            format!(
                "no channel with id {:?} ({})",
                binding.channel,
                known(channels)
            ),
        );
    }
    for (key, value) in [
        ("account", &binding.account),
        ("peer", &binding.peer),
        ("guild", &binding.guild),
        ("team", &binding.team),
    ] {
        if value.as_deref() == Some("") {
            found.error_at(
                &at.key(key),
                "must not be empty (leave it out to match any)".into(),
            );
        }
    }
    if !binding.roles.is_empty() && binding.guild.is_none() {
        found.error_at(
            &at.key("roles"),
            "roles are a sender's roles in a guild: set guild too".into(),
        );
    }
    for (j, role) in binding.roles.iter().enumerate() {
        if role.is_empty() {
            found.error_at(&at.key("roles").index(j), "must not be empty".into());
        }
    }
}

/// What a binding matches on; two bindings with equal conditions are one
/// too many, since the first always wins.
#[derive(PartialEq)]
struct Conditions {
    channel: String,
    account: Option<String>,
    peer: Option<String>,
    guild: Option<String>,
    roles: Vec<String>,
    team: Option<String>,
}

impl Conditions {
    fn of(b: &RouteBinding) -> Self {
        let mut roles = b.roles.clone();
        roles.sort();
        roles.dedup();
        Self {
            channel: b.channel.clone(),
            // `*` and no account both match any account.
            account: b.account.clone().filter(|a| a != "*"),
            peer: b.peer.clone(),
            guild: b.guild.clone(),
            roles,
            team: b.team.clone(),
        }
    }
}

fn check_identity_links(config: &Config, found: &mut Findings, channels: &[&str]) {
    let links = root("routing").key("identity_links");
    let persons: Vec<&str> = config
        .routing
        .identity_links
        .iter()
        .map(|l| l.person.as_str())
        .collect();
    unique_names(
        found,
        "routing.identity_links",
        "person",
        "person id",
        &persons,
    );
    let tenant_of: BTreeMap<&str, &str> = config
        .channels
        .iter()
        .map(|c| (c.id.as_str(), c.tenant.as_str()))
        .collect();
    // (channel, sender) → where it was first named.
    let mut seen: BTreeMap<(&str, &str), KeyPath> = BTreeMap::new();
    for (i, link) in config.routing.identity_links.iter().enumerate() {
        let at = links.index(i);
        if link.person.contains(':') {
            found.error_at(
                &at.key("person"),
                format!(
                    "{:?} contains ':', which separates the parts of session keys",
                    link.person
                ),
            );
        }
        if link.identities.is_empty() && !found.is_invalid(&at.key("identities")) {
            found.error_at(&at.key("identities"), "needs at least one identity".into());
        }
        let tenant = check_identities(found, &at, link, channels, &tenant_of, &mut seen);
        if let (Some(principal), Some(tenant)) = (&link.principal, tenant) {
            check_principal(config, found, &at.key("principal"), principal, tenant);
        } else if link.principal.as_deref() == Some("") {
            found.error_at(&at.key("principal"), "must not be empty".into());
        }
    }
}

/// Checks a link's identities and returns the tenant they belong to (that
/// of the first identity whose channel exists).
fn check_identities<'a>(
    found: &mut Findings,
    at: &KeyPath,
    link: &'a IdentityLink,
    channels: &[&str],
    tenant_of: &BTreeMap<&str, &'a str>,
    seen: &mut BTreeMap<(&'a str, &'a str), KeyPath>,
) -> Option<&'a str> {
    let mut tenant: Option<(&str, &str)> = None;
    for (j, identity) in link.identities.iter().enumerate() {
        let id_at = at.key("identities").index(j);
        if identity.sender.is_empty() && !found.is_invalid(&id_at.key("sender")) {
            found.error_at(&id_at.key("sender"), "must not be empty".into());
        }
        let channel_key = id_at.key("channel");
        if found.is_invalid(&channel_key) {
            continue;
        }
        let Some(&channel_tenant) = tenant_of.get(identity.channel.as_str()) else {
            found.error_at(
                &channel_key,
                format!(
                    "no channel with id {:?} ({})",
                    identity.channel,
                    known(channels)
                ),
            );
            continue;
        };
        match tenant {
            None => tenant = Some((channel_tenant, identity.channel.as_str())),
            Some((t, first_channel)) if t != channel_tenant => found.error_at(
                &channel_key,
                format!(
                    "channel {:?} belongs to tenant {channel_tenant:?} but channel {first_channel:?} to tenant {t:?}: a person is linked only across channels of one tenant",
                    identity.channel
                ),
            ),
            Some(_) => {}
        }
        let pair = (identity.channel.as_str(), identity.sender.as_str());
        match seen.get(&pair) {
            Some(first) => found.error_at(
                &id_at,
                format!(
                    "sender {:?} of channel {:?} is already linked at {}",
                    identity.sender,
                    identity.channel,
                    first.render()
                ),
            ),
            None => {
                seen.insert(pair, id_at.clone());
            }
        }
    }
    tenant.map(|(t, _)| t)
}

/// With API keys, a principal is someone a key speaks for, in the tenant
/// of the link's channels; without keys keel has no principals to check.
fn check_principal(
    config: &Config,
    found: &mut Findings,
    key: &KeyPath,
    principal: &str,
    tenant: &str,
) {
    if principal.is_empty() {
        found.error_at(key, "must not be empty".into());
        return;
    }
    let keys = &config.auth.keys;
    if keys.is_empty() {
        return;
    }
    if !keys
        .iter()
        .any(|k| k.principal == principal && k.tenant == tenant)
    {
        found.error_at(
            key,
            format!(
                "no [[auth.keys]] entry has principal {principal:?} in tenant {tenant:?}, the tenant of the linked channels"
            ),
        );
    }
}

/// `[[routing.hooks]]`: a URL keel can POST to, a secret that is set, and
/// channels that exist.
fn check_hooks(config: &Config, env: &dyn Env, found: &mut Findings) {
    let channels: Vec<&str> = config.channels.iter().map(|c| c.id.as_str()).collect();
    for (i, hook) in config.routing.hooks.iter().enumerate() {
        let at = root("routing").key("hooks").index(i);
        check_http_url(found, &at.key("url"), &hook.url);
        if hook.timeout_ms == 0 {
            found.error_at(&at.key("timeout_ms"), "must be at least 1".into());
        }
        if let Some(var) = &hook.secret_env {
            check_env_var_named(
                found,
                env,
                &at.key("secret_env"),
                var,
                &format!("the secret of {} hook {i}", hook.point.as_str()),
            );
        }
        match hook.point {
            HookPoint::BeforeToolCall if !hook.channels.is_empty() => found.error_at(
                &at.key("channels"),
                "before_tool_call hooks apply to the calls of every run; choose calls with tools"
                    .into(),
            ),
            HookPoint::MessageReceived | HookPoint::BeforePromptBuild if !hook.tools.is_empty() => {
                found.error_at(
                    &at.key("tools"),
                    format!(
                        "only before_tool_call hooks look at tools; a {} hook is about messages",
                        hook.point.as_str()
                    ),
                )
            }
            _ => {}
        }
        for (j, channel) in hook.channels.iter().enumerate() {
            if !channels.contains(&channel.as_str()) {
                found.error_at(
                    &at.key("channels").index(j),
                    format!("no channel with id {channel:?} ({})", known(&channels)),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_ids_and_telegram_secrets() {
        assert!(valid_id("tg-main_2"));
        assert!(!valid_id("tg:main"));
        assert!(!valid_id("tg/main"));
        assert!(!valid_id(""));
        assert!(telegram_secret_ok("Abc_123-x"));
        assert!(!telegram_secret_ok("has space"));
        assert!(!telegram_secret_ok(&"a".repeat(257)));
    }
}
