//! keel-tools
