mod approvals;
mod health;
mod memory;
mod responses;
mod runs;
mod sessions;
mod tools;

use axum::Router;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::{AppState, console};

pub use responses::ResponseStreamEvent;
#[doc(hidden)]
pub use responses::fuzzing as responses_fuzzing;

/// Every route with its documentation. Routes are only ever added here with
/// `routes!`, which takes the path and method from the handler's
/// `#[utoipa::path]`: a route cannot be served without being in
/// `/openapi.json`, nor documented without being served (a test fails on a
/// plain `.route(...)`).
pub fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(crate::openapi::ApiDoc::openapi())
        .routes(routes!(runs::create, runs::list))
        .routes(routes!(runs::get))
        .routes(routes!(runs::events))
        .routes(routes!(runs::input))
        .routes(routes!(runs::steer))
        .routes(routes!(runs::follow_up))
        .routes(routes!(runs::restore))
        .routes(routes!(runs::cancel))
        .routes(routes!(approvals::list))
        .routes(routes!(approvals::get, approvals::decide))
        .routes(routes!(tools::list))
        .routes(routes!(sessions::get))
        .routes(routes!(sessions::reset))
        .routes(routes!(memory::search))
        .routes(routes!(memory::add_document))
        .routes(routes!(responses::create))
        .routes(routes!(responses::models))
        .routes(routes!(responses::model))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::metrics))
        .routes(routes!(crate::openapi::document))
        .routes(routes!(crate::gateway::webhook::webhook))
        .routes(routes!(console::index))
        .routes(routes!(console::file))
}

pub fn router() -> Router<AppState> {
    let (router, _) = api().split_for_parts();
    router.fallback(health::not_found)
}
