//! keel's configuration: one TOML file (SPEC §9, §12), overridable by
//! `KEEL_*` environment variables, with secrets read only through env
//! references. Loading collects every problem instead of stopping at the first.

pub mod model;

pub use model::*;
