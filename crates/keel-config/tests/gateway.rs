#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_config::{
    ChannelKind, ConfigErrors, DmScope, Loaded, MapEnv, Severity, load_str, secret_from_env,
};
use secrecy::ExposeSecret;

const BASE: &str = r#"
[[providers]]
name = "main"
kind = "openai"
model = "m"

[[agents]]
id = "default"
provider = "main"

[[agents]]
id = "ops"
provider = "main"
"#;

fn env() -> MapEnv {
    MapEnv::new()
        .with("TG_TOKEN", "123456:ABC")
        .with("TG_SECRET", "tg-secret_1")
        .with("SLACK_TOKEN", "xoxb-1")
        .with("SLACK_SECRET", "8f742231b10e8888abcd99yyyzzz85a5")
        .with("HOOK_SECRET", "hook")
        .with("KEEL_KEY_ACME", "k")
}

fn load(text: &str) -> Result<Loaded, ConfigErrors> {
    load_str(&format!("{BASE}{text}"), "keel.toml", &env())
}

fn keys(result: &Result<Loaded, ConfigErrors>) -> Vec<(Severity, String)> {
    let problems = match result {
        Ok(l) => &l.warnings,
        Err(e) => &e.0,
    };
    problems
        .iter()
        .map(|p| (p.severity, p.key.clone()))
        .collect()
}

fn messages(result: &Result<Loaded, ConfigErrors>) -> String {
    match result {
        Ok(l) => l.warnings.iter().map(|p| format!("{p}\n")).collect(),
        Err(e) => e.to_string(),
    }
}

use Severity::{Error as E, Warning as W};

fn k(s: Severity, key: &str) -> (Severity, String) {
    (s, key.to_string())
}

const CHANNELS: &str = r#"
[[channels]]
id = "tg"
kind = "telegram"
tenant = "acme"
bot_token_env = "TG_TOKEN"
secret_token_env = "TG_SECRET"
approvers_chat = "-1001234567890"

[[channels]]
id = "slack"
kind = "slack"
tenant = "acme"
bot_token_env = "SLACK_TOKEN"
signing_secret_env = "SLACK_SECRET"
api_base = "http://127.0.0.1:9/api"

[[channels]]
id = "hook"
kind = "webhook"
signing_secret_env = "HOOK_SECRET"
reply_url = "https://bridge.example/keel"
"#;

#[test]
fn a_complete_gateway_configuration_loads() {
    let r = load(&format!(
        r#"{CHANNELS}
[routing]
default_agent = "default"
dm_scope = "per-peer"

[[routing.bindings]]
agent = "ops"
channel = "slack"
team = "T0001"

[[routing.bindings]]
agent = "ops"
channel = "hook"
guild = "g1"
roles = ["admin"]

[[routing.identity_links]]
person = "alice"
principal = "alice"
identities = [
  {{ channel = "tg", sender = "111" }},
  {{ channel = "slack", sender = "U0ALICE" }},
]

[[auth.keys]]
key_env = "KEEL_KEY_ACME"
tenant = "acme"
principal = "alice"
roles = ["approver"]
"#
    ));
    let loaded = r.unwrap_or_else(|e| panic!("{e}"));
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = &loaded.config;
    assert_eq!(c.channels.len(), 3);
    assert_eq!(c.channels[0].kind, ChannelKind::Telegram);
    assert_eq!(c.channels[0].api_base(), Some("https://api.telegram.org"));
    assert_eq!(c.channels[1].api_base(), Some("http://127.0.0.1:9/api"));
    assert_eq!(c.channels[2].api_base(), None);
    assert_eq!(c.channels[2].tenant, "default", "tenant defaults");
    assert_eq!(c.routing.dm_scope, DmScope::PerPeer);
    assert_eq!(c.routing.identity_links[0].identities.len(), 2);
    let var = c.channels[0].inbound_secret_env().unwrap();
    assert_eq!(
        secret_from_env(&env(), var).unwrap().expose_secret(),
        "tg-secret_1"
    );
    // Names, never values.
    assert!(!format!("{c:?}").contains("tg-secret_1"));
}

#[test]
fn dm_scope_defaults_to_one_session_per_person_and_channel() {
    let c = load("").unwrap().config;
    assert_eq!(c.routing.dm_scope, DmScope::PerChannelPeer);
    assert!(c.channels.is_empty());
}

#[test]
fn each_kind_needs_its_secrets_and_rejects_keys_it_would_ignore() {
    let r = load(
        r#"
[[channels]]
id = "tg"
kind = "telegram"
signing_secret_env = "X"

[[channels]]
id = "slack"
kind = "slack"
bot_token_env = "SLACK_TOKEN"
secret_token_env = "TG_SECRET"
signing_secret_env = "UNSET_VAR"
reply_url = "http://x/"

[[channels]]
id = "hook"
kind = "webhook"
signing_secret_env = "HOOK_SECRET"
bot_token_env = "TG_TOKEN"
api_base = "http://x/"
"#,
    );
    assert_eq!(
        keys(&r),
        vec![
            k(E, "channels[0].bot_token_env"),
            k(E, "channels[0].secret_token_env"),
            k(E, "channels[0].signing_secret_env"),
            k(E, "channels[1].secret_token_env"),
            k(W, "channels[1].signing_secret_env"),
            k(E, "channels[1].reply_url"),
            k(E, "channels[2].reply_url"),
            k(E, "channels[2].bot_token_env"),
            k(E, "channels[2].api_base"),
        ],
        "{}",
        messages(&r)
    );
    let text = messages(&r);
    assert!(
        text.contains("channels[0].bot_token_env: a telegram channel needs bot_token_env (the variable holding the bot token)"),
        "{text}"
    );
    assert!(
        text.contains("keel.toml:26:1: channels[1].reply_url: is not used by a slack channel"),
        "{text}"
    );
    assert!(
        text.contains(
            "environment variable UNSET_VAR (the signing secret of channel \"slack\") is not set"
        ),
        "{text}"
    );
    assert!(
        text.contains("channels[2].reply_url: a webhook channel needs reply_url"),
        "{text}"
    );
}

#[test]
fn channel_ids_are_unique_path_segments_and_urls_are_checked() {
    let r = load(
        r#"
[[channels]]
id = "a:b"
kind = "webhook"
signing_secret_env = "HOOK_SECRET"
reply_url = "ftp://x"

[[channels]]
id = "a:b"
kind = "webhook"
tenant = ""
signing_secret_env = "HOOK_SECRET"
reply_url = "http://x/"
approvers_chat = ""

[[channels]]
id = "tg"
kind = "telegrm"
"#,
    );
    assert_eq!(
        keys(&r),
        vec![
            k(E, "channels[0].id"),
            k(E, "channels[0].reply_url"),
            k(E, "channels[1].id"),
            k(E, "channels[1].id"),
            k(E, "channels[1].tenant"),
            k(E, "channels[1].approvers_chat"),
            k(E, "channels[2].kind"),
        ],
        "{}",
        messages(&r)
    );
    let text = messages(&r);
    assert!(
        text.contains("duplicate channel id \"a:b\" (first at channels[0].id, keel.toml:"),
        "{text}"
    );
    assert!(
        text.contains("expected one of \"telegram\", \"slack\", \"webhook\", found \"telegrm\""),
        "{text}"
    );
}

#[test]
fn a_telegram_secret_telegram_would_refuse_is_a_warning() {
    let env = env().with("TG_SECRET", "has spaces!");
    let text = format!(
        "{BASE}\n[[channels]]\nid = \"tg\"\nkind = \"telegram\"\nbot_token_env = \"TG_TOKEN\"\nsecret_token_env = \"TG_SECRET\"\n"
    );
    let r = load_str(&text, "keel.toml", &env);
    assert_eq!(
        keys(&r),
        vec![k(W, "channels[0].secret_token_env")],
        "{}",
        messages(&r)
    );
    // The message names the variable, never its value.
    assert!(!messages(&r).contains("has spaces"));
}

#[test]
fn bindings_name_agents_and_channels_that_exist() {
    let r = load(&format!(
        r#"{CHANNELS}
[routing]
default_agent = "nobody"

[[routing.bindings]]
agent = "opz"
channel = "tg"

[[routing.bindings]]
agent = "ops"
channel = "discord"

[[routing.bindings]]
agent = "ops"
channel = "hook"
roles = ["admin"]
peer = ""

[[routing.bindings]]
agent = "ops"
channel = "slack"
account = "*"
team = "T1"

[[routing.bindings]]
agent = "default"
channel = "slack"
team = "T1"
"#
    ));
    assert_eq!(
        keys(&r),
        vec![
            k(E, "routing.default_agent"),
            k(E, "routing.bindings[0].agent"),
            k(E, "routing.bindings[1].channel"),
            k(E, "routing.bindings[2].roles"),
            k(E, "routing.bindings[2].peer"),
            k(W, "routing.bindings[4]"),
        ],
        "{}",
        messages(&r)
    );
    let text = messages(&r);
    assert!(
        text.contains("routing.bindings[0].agent: no agent with id \"opz\" (known: default, ops)"),
        "{text}"
    );
    assert!(
        text.contains("no channel with id \"discord\" (known: tg, slack, hook)"),
        "{text}"
    );
    assert!(
        text.contains(
            "routing.bindings[4]: never matches: routing.bindings[3] has the same conditions"
        ),
        "{text}"
    );
}

#[test]
fn identity_links_stay_within_one_tenant() {
    let r = load(&format!(
        r#"{CHANNELS}
[[routing.identity_links]]
person = "alice"
identities = [
  {{ channel = "tg", sender = "111" }},
  {{ channel = "hook", sender = "alice@bridge" }},
]

[[routing.identity_links]]
person = "bob:x"
identities = [
  {{ channel = "tg", sender = "111" }},
  {{ channel = "irc", sender = "bob" }},
]

[[routing.identity_links]]
person = "alice"
identities = []
"#
    ));
    assert_eq!(
        keys(&r),
        vec![
            k(E, "routing.identity_links[0].identities[1].channel"),
            k(E, "routing.identity_links[1].person"),
            k(E, "routing.identity_links[1].identities[0]"),
            k(E, "routing.identity_links[1].identities[1].channel"),
            k(E, "routing.identity_links[2].person"),
            k(E, "routing.identity_links[2].identities"),
        ],
        "{}",
        messages(&r)
    );
    let text = messages(&r);
    assert!(
        text.contains("channel \"hook\" belongs to tenant \"default\" but channel \"tg\" to tenant \"acme\": a person is linked only across channels of one tenant"),
        "{text}"
    );
    assert!(
        text.contains("sender \"111\" of channel \"tg\" is already linked at routing.identity_links[0].identities[0]"),
        "{text}"
    );
}

#[test]
fn a_linked_principal_must_be_a_key_of_the_links_tenant() {
    let link = r#"
[[routing.identity_links]]
person = "alice"
principal = "alice"
identities = [{ channel = "tg", sender = "111" }]
"#;
    // Without API keys there are no principals to check against.
    assert!(load(&format!("{CHANNELS}{link}")).is_ok());

    let r = load(&format!(
        r#"{CHANNELS}{link}
[[auth.keys]]
key_env = "KEEL_KEY_ACME"
tenant = "other"
principal = "alice"
"#
    ));
    assert_eq!(
        keys(&r),
        vec![k(E, "routing.identity_links[0].principal")],
        "{}",
        messages(&r)
    );
    assert!(
        messages(&r).contains("no [[auth.keys]] entry has principal \"alice\" in tenant \"acme\""),
        "{}",
        messages(&r)
    );
}

#[test]
fn unknown_gateway_keys_are_named_with_hints() {
    let r = load(
        r#"
[[channels]]
id = "tg"
kind = "telegram"
bot_token = "123:abc"
bot_token_env = "TG_TOKEN"
secret_token_env = "TG_SECRET"

[routing]
dm_scope = "per_peer"

[[routing.bindings]]
agent = "ops"
channel = "tg"
parent = "x"
"#,
    );
    assert_eq!(
        keys(&r),
        vec![
            k(E, "channels[0].bot_token"),
            k(E, "routing.dm_scope"),
            k(E, "routing.bindings[0].parent"),
        ],
        "{}",
        messages(&r)
    );
    let text = messages(&r);
    assert!(
        text.contains("secrets are read from env: use bot_token_env = \"VAR_NAME\""),
        "{text}"
    );
}

#[test]
fn channels_can_be_overridden_from_the_environment_by_id() {
    let env = env().with("KEEL_CHANNELS__TG__API_BASE", "http://127.0.0.1:8081");
    let text = format!(
        "{BASE}\n[[channels]]\nid = \"tg\"\nkind = \"telegram\"\nbot_token_env = \"TG_TOKEN\"\nsecret_token_env = \"TG_SECRET\"\n"
    );
    let c = load_str(&text, "keel.toml", &env).unwrap().config;
    assert_eq!(c.channels[0].api_base(), Some("http://127.0.0.1:8081"));
}

#[test]
fn dispatch_hooks_name_a_url_a_set_secret_and_known_channels() {
    let ok = load(&format!(
        r#"{CHANNELS}
[[routing.hooks]]
point = "before_prompt_build"
url = "http://127.0.0.1:9000/context"
secret_env = "HOOK_SECRET"
channels = ["tg"]
"#
    ));
    assert!(ok.is_ok(), "{}", messages(&ok));
    let hook = &ok.unwrap().config.routing.hooks[0];
    assert_eq!(hook.timeout_ms, 2000, "the default timeout");

    let bad = load(&format!(
        r#"{CHANNELS}
[[routing.hooks]]
point = "message_received"
url = "ftp://example.com/x"
timeout_ms = 0
secret_env = "NOT_SET_ANYWHERE"
channels = ["nope"]

[[routing.hooks]]
point = "before_tool_call"
url = "http://127.0.0.1:9000/x"
channels = ["tg"]

[[routing.hooks]]
point = "before_prompt_build"
url = "http://127.0.0.1:9000/y"
tools = ["plant.*"]

[[routing.hooks]]
point = "after_everything"
url = "http://127.0.0.1:9000/z"
"#
    ));
    assert_eq!(
        keys(&bad),
        vec![
            k(E, "routing.hooks[0].url"),
            k(E, "routing.hooks[0].timeout_ms"),
            k(W, "routing.hooks[0].secret_env"),
            k(E, "routing.hooks[0].channels[0]"),
            k(E, "routing.hooks[1].channels"),
            k(E, "routing.hooks[2].tools"),
            k(E, "routing.hooks[3].point"),
        ],
        "{}",
        messages(&bad)
    );
}
