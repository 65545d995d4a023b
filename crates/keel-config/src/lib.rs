//! keel's configuration: one TOML file (SPEC §9, §12), overridable by
//! `KEEL_*` environment variables, with secrets read only through env
//! references. Loading collects every problem instead of stopping at the first.

pub mod env;
mod findings;
pub mod gateway;
mod load;
pub mod model;
mod overrides;
pub mod problem;
pub mod reference;
mod report;
mod schema;
pub mod secrets;
mod semantic;
pub mod spend;
pub mod tenants;
mod tree;

pub use env::{Env, MapEnv, ProcessEnv, expand_env_refs, secret_from_env};
pub use gateway::*;
pub use load::{load_file, load_str};
pub use model::*;
pub use problem::{ConfigErrors, Loaded, Problem, Severity};
pub use report::render_report;
pub use secrets::{SecretValue, secret_values};
pub use semantic::BUILTIN_TOOLS;
pub use spend::Price;
pub use tenants::TenantConfig;
