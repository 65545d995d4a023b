//! The gateway's adapters, routing and outbound requests, against payloads
//! shaped like the services' own documentation shows them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod fuzz;
mod outbound;
mod routing;
mod slack;
mod telegram;
mod webhook;
