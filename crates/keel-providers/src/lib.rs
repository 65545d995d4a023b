//! keel-providers
