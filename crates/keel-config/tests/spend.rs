//! Prices and spend limits (docs/spend.md): they load, values that cannot
//! work are errors naming their key, and an unpriced model under a spend
//! limit is a warning of `keel check`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use keel_config::{ConfigErrors, Loaded, MapEnv, Severity, load_str};

fn load(text: &str) -> Result<Loaded, ConfigErrors> {
    load_str(text, "keel.toml", &MapEnv::new())
}

fn errors(result: &Result<Loaded, ConfigErrors>) -> Vec<String> {
    match result {
        Ok(l) => panic!("loaded, with warnings {:?}", l.warnings),
        Err(e) => {
            e.0.iter()
                .filter(|p| p.severity == Severity::Error)
                .map(|p| p.to_string())
                .collect()
        }
    }
}

/// Asserts an error starts with each of `keys` (a key and its message).
fn assert_errors(found: &[String], keys: &[&str]) {
    for key in keys {
        assert!(
            found.iter().any(|e| e.contains(key)),
            "no error for {key}: {found:#?}"
        );
    }
}

#[test]
fn prices_and_limits_load_in_usd() {
    let loaded = load(
        r#"
[[providers]]
name = "main"
kind = "openai"
model = "gpt-4o-mini"
price = { input_usd_per_mtok = 0.15, output_usd_per_mtok = 0.6 }

[[agents]]
id = "default"
provider = "main"
spend_usd_per_day = 50

[[tenants]]
id = "acme"
spend_usd_per_day = 2.5
spend_usd_per_month = 40
"#,
    )
    .unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let config = &loaded.config;
    let price = config.providers[0].price.unwrap();
    assert_eq!(price.input_usd_per_mtok, 0.15);
    assert_eq!(price.cost_micros(1_000_000, 1_000_000), 750_000);
    assert_eq!(config.agents[0].spend_usd_per_day, Some(50.0));
    assert_eq!(config.agents[0].spend_usd_per_month, None);
    assert_eq!(config.tenants[0].spend_usd_per_day, Some(2.5));
    assert_eq!(config.tenants[0].spend_usd_per_month, Some(40.0));
}

#[test]
fn bad_prices_and_limits_are_errors_naming_the_key() {
    // Wrong types and missing keys, found by the schema walk.
    let found = errors(&load(
        r#"
[[providers]]
name = "main"
kind = "openai"
model = "m"
price = { input_usd_per_mtok = 1, output_usd_per_mtok = "cheap" }

[[providers]]
name = "other"
kind = "openai"
model = "m"
price = { input_usd_per_mtok = 1 }
"#,
    ));
    assert_errors(
        &found,
        &[
            "providers[0].price.output_usd_per_mtok: expected a number",
            "providers[1].price.output_usd_per_mtok: missing required key",
        ],
    );
    // Values that cannot be a price or a limit.
    let found = errors(&load(
        r#"
[[providers]]
name = "main"
kind = "openai"
model = "m"
price = { input_usd_per_mtok = -1, output_usd_per_mtok = 0 }

[[agents]]
id = "default"
provider = "main"
spend_usd_per_month = 0

[[tenants]]
id = "acme"
spend_usd_per_day = -3
"#,
    ));
    assert_errors(
        &found,
        &[
            "providers[0].price.input_usd_per_mtok: must be a price of 0 or more USD",
            "agents[0].spend_usd_per_month: must be more than 0 USD",
            "tenants[0].spend_usd_per_day: must be more than 0 USD",
        ],
    );
    // A free model is a price.
    assert!(
        !found.iter().any(|e| e.contains("output_usd_per_mtok")),
        "{found:#?}"
    );
}

#[test]
fn an_unpriced_model_under_a_spend_limit_is_a_warning() {
    let loaded = load(
        r#"
[[providers]]
name = "main"
kind = "openai"
model = "m"

[[providers]]
name = "embedded"
kind = "local"
model = "smollm2-135m"

[[agents]]
id = "default"
provider = "main"

[[agents]]
id = "offline"
provider = "embedded"

[[tenants]]
id = "acme"
spend_usd_per_day = 1
"#,
    )
    .unwrap();
    let warnings: Vec<String> = loaded.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0].contains("agents[0].provider") && warnings[0].contains("no `price`"),
        "{warnings:#?}"
    );
    // Without any spend limit, nobody needs a price.
    let loaded =
        load("[[providers]]\nname = \"main\"\nkind = \"openai\"\nmodel = \"m\"\n").unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
}
