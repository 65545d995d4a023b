//! The Responses API objects as the OpenAPI document describes them. The
//! encoder builds them field by field as a run's events arrive (streamed
//! and whole responses come from the same code), so these types only
//! describe what it writes; a test checks encoded responses against them.

#![allow(dead_code)]

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// A response: one stretch of a keel run, until it answers, stops for the
/// client (function calls, a question) or fails. Besides these fields it
/// echoes the request's sampling settings, which the agent's configuration
/// overrides.
#[derive(Serialize, ToSchema)]
pub struct ResponseObject {
    /// `resp_<run id>_<seq>`; usable as `previous_response_id`.
    id: String,
    object: ResponseKind,
    /// Unix seconds.
    created_at: i64,
    status: ResponseStatus,
    /// Unix seconds; `null` while in progress.
    completed_at: Option<i64>,
    /// The keel agent that answered.
    model: String,
    output: Vec<OutputItem>,
    error: Option<ResponseError>,
    /// `null` while in progress.
    usage: Option<ResponseUsage>,
    previous_response_id: Option<String>,
    instructions: Option<String>,
    #[schema(value_type = Option<Object>)]
    incomplete_details: Option<Value>,
    /// The client function tools of the request, as declared.
    #[schema(value_type = Vec<Object>)]
    tools: Vec<Value>,
    /// As requested (`auto` by default).
    tool_choice: Value,
    truncation: String,
    parallel_tool_calls: bool,
    #[schema(value_type = Object)]
    text: Map<String, Value>,
    temperature: f64,
    top_p: f64,
    presence_penalty: f64,
    frequency_penalty: f64,
    top_logprobs: u32,
    #[schema(value_type = Option<Object>)]
    reasoning: Option<Value>,
    max_output_tokens: Option<u64>,
    max_tool_calls: Option<u64>,
    /// Always `true`: keel keeps every run (its audit trail).
    store: bool,
    background: bool,
    service_tier: String,
    #[schema(value_type = Object)]
    metadata: Map<String, Value>,
    safety_identifier: Option<String>,
    prompt_cache_key: Option<String>,
    user: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum ResponseKind {
    Response,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum ResponseStatus {
    InProgress,
    Completed,
    Failed,
    Cancelled,
}

/// Why a response failed.
#[derive(Serialize, ToSchema)]
struct ResponseError {
    code: String,
    message: String,
}

#[derive(Serialize, ToSchema)]
struct ResponseUsage {
    input_tokens: u64,
    input_tokens_details: InputTokensDetails,
    output_tokens: u64,
    output_tokens_details: OutputTokensDetails,
    total_tokens: u64,
}

#[derive(Serialize, ToSchema)]
struct InputTokensDetails {
    cached_tokens: u64,
    cache_write_tokens: u64,
}

#[derive(Serialize, ToSchema)]
struct OutputTokensDetails {
    reasoning_tokens: u64,
}

/// An output item: an assistant message, or a call of a client function
/// tool for the caller to run.
#[derive(Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutputItem {
    Message {
        /// `msg_<run id>_<seq>`.
        id: String,
        status: ItemStatus,
        role: AssistantRole,
        content: Vec<OutputText>,
    },
    FunctionCall {
        /// `fc_<run id>_<seq>`.
        id: String,
        call_id: String,
        name: String,
        /// The arguments as JSON text.
        arguments: String,
        status: ItemStatus,
    },
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum ItemStatus {
    InProgress,
    Completed,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum AssistantRole {
    Assistant,
}

#[derive(Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutputText {
    OutputText {
        text: String,
        #[schema(value_type = Vec<Object>)]
        annotations: Vec<Value>,
        #[schema(value_type = Vec<Object>)]
        logprobs: Vec<Value>,
    },
}

/// An event of a streamed response (`response.created`,
/// `response.output_text.delta`, `response.completed`, …). Events that
/// report the whole response carry it in `response`; the others carry the
/// fields of their type (`item_id`, `output_index`, `delta`, …).
#[derive(Serialize, ToSchema)]
pub struct ResponseStreamEvent {
    /// The event's type, also its SSE `event` name.
    #[serde(rename = "type")]
    kind: String,
    /// 0, 1, 2, … in the order sent.
    sequence_number: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<ResponseObject>,
}
