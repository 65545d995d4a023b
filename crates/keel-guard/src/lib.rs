//! keel-guard
