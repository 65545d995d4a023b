use keel_config::{ChannelKind, Config, DmScope, MapEnv, load_str};
use keel_gateway::{ChatType, Inbound, MatchedBy, ReplyTarget, Router, session_key};

const BASE: &str = r#"
[[providers]]
name = "main"
kind = "openai"
model = "m"

[[agents]]
id = "first"
provider = "main"
[[agents]]
id = "default"
provider = "main"
[[agents]]
id = "peer"
provider = "main"
[[agents]]
id = "parent"
provider = "main"
[[agents]]
id = "roles"
provider = "main"
[[agents]]
id = "guild"
provider = "main"
[[agents]]
id = "team"
provider = "main"
[[agents]]
id = "account"
provider = "main"
[[agents]]
id = "channel"
provider = "main"

[[channels]]
id = "tg"
kind = "telegram"
tenant = "acme"
bot_token_env = "T"
secret_token_env = "S"

[[channels]]
id = "slack"
kind = "slack"
tenant = "acme"
bot_token_env = "T"
signing_secret_env = "S"

[[channels]]
id = "hook"
kind = "webhook"
tenant = "acme"
signing_secret_env = "S"
reply_url = "http://127.0.0.1:1/"

[[channels]]
id = "other"
kind = "webhook"
tenant = "globex"
signing_secret_env = "S"
reply_url = "http://127.0.0.1:1/"
"#;

fn load(routing: &str) -> keel_config::Loaded {
    let env = MapEnv::new().with("T", "t").with("S", "s");
    load_str(&format!("{BASE}{routing}"), "keel.toml", &env).unwrap_or_else(|e| panic!("{e}"))
}

fn config(routing: &str) -> Config {
    let loaded = load(routing);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    loaded.config
}

fn inbound(channel: &str, chat_type: ChatType, sender: &str, chat: &str) -> Inbound {
    Inbound {
        channel: channel.into(),
        kind: ChannelKind::Webhook,
        tenant: "acme".into(),
        account: channel.into(),
        sender: sender.into(),
        sender_name: None,
        chat_type,
        chat: chat.into(),
        guild: None,
        team: None,
        roles: Vec::new(),
        thread: None,
        peer: match chat_type {
            ChatType::Direct => sender.into(),
            _ => chat.into(),
        },
        parent_peer: None,
        reply_to: None,
        text: "hi".into(),
        dedupe_id: "1".into(),
        reply: ReplyTarget {
            chat: chat.into(),
            thread: None,
            message: None,
        },
        command: None,
        command_authorized: false,
    }
}

/// One binding per tier, written least specific first so that the order
/// in the file cannot be what decides.
const TIERS: &str = r#"
[[routing.bindings]]
agent = "channel"
channel = "hook"

[[routing.bindings]]
agent = "account"
channel = "hook"
account = "bot-a"

[[routing.bindings]]
agent = "team"
channel = "hook"
team = "team-1"

[[routing.bindings]]
agent = "guild"
channel = "hook"
guild = "g-1"

[[routing.bindings]]
agent = "roles"
channel = "hook"
guild = "g-1"
roles = ["admin"]

[[routing.bindings]]
agent = "parent"
channel = "hook"
peer = "room"

[[routing.bindings]]
agent = "peer"
channel = "hook"
peer = "room:t-1"
"#;

#[test]
fn each_tier_beats_the_ones_below_it() {
    let router = Router::new(&config(TIERS));
    let mut m = inbound("hook", ChatType::Group, "u-1", "room");
    m.thread = Some("t-1".into());
    m.peer = "room:t-1".into();
    m.parent_peer = Some("room".into());
    m.guild = Some("g-1".into());
    m.roles = vec!["ops".into(), "admin".into()];
    m.team = Some("team-1".into());
    m.account = "bot-a".into();

    let expect = |m: &Inbound, agent: &str, tier: MatchedBy| {
        let route = router.route(m).unwrap();
        assert_eq!(
            (route.agent.as_str(), route.matched_by),
            (agent, tier),
            "{m:?}"
        );
    };
    expect(&m, "peer", MatchedBy::Peer);
    // Another thread of the same room: the room's binding, via the parent.
    m.thread = Some("t-2".into());
    m.peer = "room:t-2".into();
    expect(&m, "parent", MatchedBy::ParentPeer);
    // Outside the room (and any thread).
    m.thread = None;
    m.peer = "hall".into();
    m.parent_peer = None;
    m.chat = "hall".into();
    expect(&m, "roles", MatchedBy::GuildRoles);
    m.roles = vec!["ops".into()];
    expect(&m, "guild", MatchedBy::Guild);
    m.guild = None;
    expect(&m, "team", MatchedBy::Team);
    m.team = None;
    expect(&m, "account", MatchedBy::Account);
    m.account = "bot-b".into();
    expect(&m, "channel", MatchedBy::Channel);
    m.channel = "slack".into();
    expect(&m, "default", MatchedBy::Default);
}

#[test]
fn matched_by_names_are_snake_case() {
    let names: Vec<&str> = [
        MatchedBy::Peer,
        MatchedBy::ParentPeer,
        MatchedBy::GuildRoles,
        MatchedBy::Guild,
        MatchedBy::Team,
        MatchedBy::Account,
        MatchedBy::Channel,
        MatchedBy::Default,
    ]
    .iter()
    .map(|m| m.as_str())
    .collect();
    assert_eq!(
        names,
        [
            "peer",
            "parent_peer",
            "guild_roles",
            "guild",
            "team",
            "account",
            "channel",
            "default"
        ]
    );
    assert_eq!(
        serde_json::to_string(&MatchedBy::GuildRoles).unwrap(),
        "\"guild_roles\""
    );
}

#[test]
fn within_a_tier_the_first_binding_whose_conditions_hold_wins() {
    let loaded = load(
        r#"
[[routing.bindings]]
agent = "peer"
channel = "hook"
peer = "u-1"
account = "bot-x"

[[routing.bindings]]
agent = "parent"
channel = "hook"
peer = "u-1"

[[routing.bindings]]
agent = "team"
channel = "hook"
peer = "u-1"

[[routing.bindings]]
agent = "channel"
channel = "hook"
account = "*"

[[routing.bindings]]
agent = "account"
channel = "hook"
"#,
    );
    // The check says which bindings can never win.
    let never: Vec<&str> = loaded.warnings.iter().map(|w| w.key.as_str()).collect();
    assert_eq!(never, ["routing.bindings[2]", "routing.bindings[4]"]);
    let router = Router::new(&loaded.config);
    let m = inbound("hook", ChatType::Direct, "u-1", "u-1");
    // The first peer binding wants another account; the second holds.
    let route = router.route(&m).unwrap();
    assert_eq!(
        (route.agent.as_str(), route.matched_by),
        ("parent", MatchedBy::Peer)
    );
    assert_eq!(route.binding, Some(1));
    let other = inbound("hook", ChatType::Direct, "u-2", "u-2");
    let route = router.route(&other).unwrap();
    assert_eq!(
        (route.agent.as_str(), route.matched_by),
        ("channel", MatchedBy::Channel),
        "account = \"*\" is the channel tier"
    );
    assert_eq!(route.binding, Some(3));
}

#[test]
fn the_default_agent_is_configured_or_the_runtimes_default() {
    let m = inbound("tg", ChatType::Direct, "1", "1");
    let configured = Router::new(&config("[routing]\ndefault_agent = \"team\"\n"));
    let route = configured.route(&m).unwrap();
    assert_eq!(
        (route.agent.as_str(), route.matched_by),
        ("team", MatchedBy::Default)
    );
    assert_eq!(route.binding, None);
    // Unset: `default` if there is one (there is, after `first`).
    assert_eq!(Router::new(&config("")).route(&m).unwrap().agent, "default");
    // No agents at all: nowhere to go.
    assert!(Router::new(&Config::default()).route(&m).is_none());
}

#[test]
fn each_dm_scope_has_its_session_key() {
    let mut m = inbound("slack", ChatType::Direct, "U1", "D1");
    m.account = "A9".into();
    let key = |scope| session_key("ops", &m, scope, None);
    assert_eq!(key(DmScope::Main), "agent:ops:main");
    assert_eq!(key(DmScope::PerPeer), "agent:ops:direct:slack:U1");
    assert_eq!(key(DmScope::PerChannelPeer), "agent:ops:slack:direct:U1");
    assert_eq!(
        key(DmScope::PerAccountChannelPeer),
        "agent:ops:slack:A9:direct:U1"
    );
    assert_eq!(
        session_key("ops", &m, DmScope::PerPeer, Some("alice")),
        "agent:ops:direct:alice"
    );
}

#[test]
fn groups_channels_and_threads_have_their_own_sessions_whatever_the_scope() {
    let mut g = inbound("tg", ChatType::Group, "1", "-100777");
    for scope in [DmScope::Main, DmScope::PerPeer, DmScope::PerChannelPeer] {
        assert_eq!(
            session_key("ops", &g, scope, Some("alice")),
            "agent:ops:tg:group:-100777"
        );
    }
    g.thread = Some("42".into());
    assert_eq!(
        session_key("ops", &g, DmScope::Main, None),
        "agent:ops:tg:group:-100777:thread:42"
    );
    let c = inbound("tg", ChatType::Channel, "-100555", "-100555");
    assert_eq!(
        session_key("ops", &c, DmScope::Main, None),
        "agent:ops:tg:channel:-100555"
    );
}

const LINKS: &str = r#"
[[routing.identity_links]]
person = "alice"
principal = "alice"
identities = [
  { channel = "tg", sender = "111" },
  { channel = "slack", sender = "U0ALICE" },
]
"#;

#[test]
fn two_linked_identities_share_one_session() {
    let router = Router::new(&config(&format!(
        "[routing]\ndm_scope = \"per-peer\"\n{LINKS}"
    )));
    let from_tg = inbound("tg", ChatType::Direct, "111", "111");
    let from_slack = inbound("slack", ChatType::Direct, "U0ALICE", "D0ALICE");
    let a = router.route(&from_tg).unwrap();
    let b = router.route(&from_slack).unwrap();
    assert_eq!(a.session_key, "agent:default:direct:alice");
    assert_eq!(a.session_key, b.session_key);
    assert_eq!(a.person.as_deref(), Some("alice"));
    assert_eq!(a.tenant, "acme");

    // An unlinked sender whose raw id happens to be "alice" keeps apart.
    let stranger = inbound("hook", ChatType::Direct, "alice", "alice");
    let c = router.route(&stranger).unwrap();
    assert_eq!(c.session_key, "agent:default:direct:hook:alice");
    assert_eq!(c.person, None);

    assert_eq!(
        router.identities().principal("slack", "U0ALICE"),
        Some("alice")
    );
    assert_eq!(router.identities().principal("slack", "U0BOB"), None);
    assert_eq!(router.identities().principal("tg", "U0ALICE"), None);
}

#[test]
fn channel_scopes_keep_raw_sender_ids_even_for_linked_people() {
    let router = Router::new(&config(LINKS));
    assert_eq!(router.dm_scope(), DmScope::PerChannelPeer);
    let from_tg = inbound("tg", ChatType::Direct, "111", "111");
    let route = router.route(&from_tg).unwrap();
    assert_eq!(route.session_key, "agent:default:tg:direct:111");
    assert_eq!(route.person.as_deref(), Some("alice"));
}

#[test]
fn links_never_join_tenants_even_unchecked() {
    // Configuration checks refuse this; the router still never applies it.
    let mut c = config("");
    c.routing.dm_scope = DmScope::PerPeer;
    c.routing.identity_links = vec![keel_config::IdentityLink {
        person: "mallory".into(),
        principal: None,
        identities: vec![
            keel_config::ChannelIdentity {
                channel: "tg".into(),
                sender: "1".into(),
            },
            keel_config::ChannelIdentity {
                channel: "other".into(),
                sender: "1".into(),
            },
        ],
    }];
    let router = Router::new(&c);
    let acme = router
        .route(&inbound("tg", ChatType::Direct, "1", "1"))
        .unwrap();
    let mut globex_msg = inbound("other", ChatType::Direct, "1", "1");
    globex_msg.tenant = "globex".into();
    let globex = router.route(&globex_msg).unwrap();
    assert_eq!(acme.session_key, "agent:default:direct:mallory");
    assert_eq!(globex.session_key, "agent:default:direct:other:1");
    assert_eq!(globex.person, None);
}
