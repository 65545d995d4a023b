//! keel-test-support
