//! The OpenAPI 3.1 document of the HTTP API, served at `GET /openapi.json`.
//! Paths come from the handlers' `#[utoipa::path]` attributes as the router
//! registers them (see `routes::api`); this adds what is document-wide.

use std::sync::OnceLock;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::RefOr;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::schema::{Object, ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use crate::ApiError;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "keel",
        description = "keel's HTTP API: runs of guarded agents with their resumable SSE event \
                       stream, approvals, tools, sessions, long-term memory, and an OpenAI \
                       Responses-compatible endpoint. With API keys configured, every route but \
                       the health ones needs `Authorization: Bearer <key>`; without keys (a \
                       loopback-only server) none does. keel's own routes answer errors as \
                       `{\"error\": {\"code\", \"message\"}}`; the `/v1` ones in OpenAI's shape.",
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "runs", description = "Start, inspect, stream and steer runs"),
        (name = "approvals", description = "Human decisions runs wait for"),
        (name = "tools", description = "The tools agents may call"),
        (name = "sessions", description = "Conversations across runs"),
        (name = "memory", description = "Long-term memory search and documents"),
        (name = "openai", description = "OpenAI Responses API compatibility"),
        (name = "health", description = "Liveness, readiness, metrics and this document"),
    )
)]
pub struct ApiDoc;

/// API keys are sent as bearer tokens.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut scheme = Http::new(HttpAuthScheme::Bearer);
        scheme.description = Some("An API key configured under `[[auth.keys]]`.".into());
        components.add_security_scheme("bearer", SecurityScheme::Http(scheme));
    }
}

/// This OpenAPI document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "health",
    security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json", body = Object))
)]
pub async fn document() -> Response {
    // Built once: the document is fixed for the life of the process.
    static JSON: OnceLock<Result<String, String>> = OnceLock::new();
    match JSON.get_or_init(|| crate::openapi().to_json().map_err(|e| e.to_string())) {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json.as_str()).into_response(),
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the OpenAPI document could not be written: {e}"),
        )
        .into_response(),
    }
}

/// One Server-Sent Event of a stream, as an object with the frame's fields
/// (`id`, `event`, `data`), the form OpenAPI 3.2 gives `text/event-stream`
/// items and the one schemathesis checks each frame against. `data` is JSON
/// text; `contentSchema` says what it decodes to.
fn sse_frame(description: &str, data_schema: &str, with_id: bool) -> RefOr<Schema> {
    let mut data = Object::with_type(Type::String);
    data.content_media_type = "application/json".into();
    data.description = Some("JSON text of the event".into());
    data.extensions = Some(Extensions::from_iter([(
        "contentSchema",
        serde_json::json!({"$ref": format!("#/components/schemas/{data_schema}")}),
    )]));
    let mut frame = ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(description))
        .property(
            "event",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some("The event's type")),
        )
        .required("event")
        .property("data", data)
        .required("data");
    if with_id {
        frame = frame
            .property(
                "id",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some("^[0-9]+$"))
                    .description(Some(
                        "The event's `seq`: send it back as `Last-Event-ID` to resume",
                    )),
            )
            .required("id");
    }
    RefOr::T(Schema::Object(frame.build()))
}

/// A frame of a run's event stream: `data` is an [`keel_protocol::Event`].
pub struct RunEventFrame;

impl PartialSchema for RunEventFrame {
    fn schema() -> RefOr<Schema> {
        sse_frame(
            "One frame of a run's event stream: `id: <seq>`, `event: <type>`, `data: <Event>`",
            "Event",
            true,
        )
    }
}

impl ToSchema for RunEventFrame {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        use keel_protocol::Event;
        schemas.push((Event::name().into_owned(), Event::schema()));
        Event::schemas(schemas);
    }
}

/// A frame of a streamed `/v1/responses`: `data` is a Responses API
/// stream event.
pub struct ResponseEventFrame;

impl PartialSchema for ResponseEventFrame {
    fn schema() -> RefOr<Schema> {
        sse_frame(
            "One frame of a streamed response: `event: <type>`, `data: <ResponseStreamEvent>`",
            "ResponseStreamEvent",
            false,
        )
    }
}

impl ToSchema for ResponseEventFrame {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        use crate::routes::ResponseStreamEvent;
        schemas.push((
            ResponseStreamEvent::name().into_owned(),
            ResponseStreamEvent::schema(),
        ));
        ResponseStreamEvent::schemas(schemas);
    }
}
