//! The reading of a `POST /v1/responses` body, as the handler does it
//! before it touches a run: the body, its enumerations, the input items,
//! the client tools, and the keel ids it names. For the fuzz targets under
//! `fuzz/`; not part of the supported API.

pub use super::error::OaiError;
pub use super::request::{CreateResponse, FunctionTool, Item, Role};

/// A body the handler would go on with.
#[derive(Debug)]
pub struct Read {
    pub request: CreateResponse,
    pub items: Vec<Item>,
    pub tools: Vec<FunctionTool>,
    /// The run `previous_response_id` names, when keel issued it.
    pub previous: Option<(String, u64)>,
    /// The run each replayed item keel issued belongs to.
    pub replayed_runs: Vec<String>,
}

/// The handler's checks in its order; `Err` is the 400 it answers.
pub fn read_request(body: &[u8]) -> Result<Read, OaiError> {
    let request = super::request::parse_body(body)?;
    super::request::check_choices(&request)?;
    let items = super::request::parse_input(request.input.as_ref())?;
    let tools = super::request::parse_tools(request.tools.as_deref())?;
    let previous = request
        .previous_response_id
        .as_deref()
        .and_then(super::ids::parse_response_id);
    let replayed_runs = items
        .iter()
        .filter_map(|i| super::ids::run_of_item(i.id()?))
        .collect();
    Ok(Read {
        request,
        items,
        tools,
        previous,
        replayed_runs,
    })
}
