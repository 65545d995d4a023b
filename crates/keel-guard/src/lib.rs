//! keel-guard: checks that stand between what the model emits and what keel
//! executes (SPEC §4).

pub mod drift;
pub mod hooks;
pub mod loop_detect;
pub mod policy;
pub mod provenance;
pub mod schema;
pub mod verify;
