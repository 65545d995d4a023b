//! keel-guard: checks that stand between what the model emits and what keel
//! executes (SPEC §4).

pub mod schema;
