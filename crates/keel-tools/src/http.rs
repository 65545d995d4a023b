//! HTTP tools (SPEC §5): an endpoint described in configuration, called
//! with the model's arguments. Path parameters go into the URL template,
//! the rest into the query string or a JSON body depending on the method.

use std::sync::Arc;
use std::time::Duration;

use keel_config::HttpToolConfig;
use keel_guard::schema::{CompiledSchema, normalize};
use keel_protocol::{
    CallPlace, Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSource, ToolSpec,
};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use serde_json::{Map, Value};
use tokio::sync::Semaphore;

use crate::ToolsError;
use crate::env::expand;

/// Largest response body read; more would only be truncated again before
/// the model sees it, and an unbounded read lets a remote exhaust memory.
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// How much of an error body the model is shown.
const ERROR_SNIPPET_CHARS: usize = 2000;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Calls in flight per tool unless `max_concurrent_calls` says otherwise.
const DEFAULT_MAX_CONCURRENT_CALLS: usize = 64;

/// Everything but RFC 3986 unreserved characters, so an argument can never
/// add a path segment, a query or a fragment.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One configured HTTP endpoint as a tool.
#[derive(Debug)]
pub struct HttpTool {
    spec: ToolSpec,
    method: Method,
    url: UrlTemplate,
    headers: HeaderMap,
    client: reqwest::Client,
    /// Bounds the calls in flight (`max_concurrent_calls`), through
    /// [`Tool::place`]: each holds a connection to the endpoint, and a
    /// burst of runs would otherwise open one each.
    in_flight: Arc<Semaphore>,
}

/// The risk and approval an HTTP tool's own entry gives it: `read` and no
/// approval unless it says otherwise, since the operator wrote the entry.
pub(crate) fn own_trust(cfg: &HttpToolConfig) -> (Risk, bool) {
    (
        cfg.risk.unwrap_or(Risk::Read),
        cfg.requires_approval.unwrap_or(false),
    )
}

impl HttpTool {
    /// Builds the tool; header `${VAR}` references are resolved here, once,
    /// so a missing secret is a startup error rather than a failing call.
    pub fn from_config(
        cfg: &HttpToolConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<HttpTool, ToolsError> {
        let invalid = |reason: String| ToolsError::InvalidHttpTool {
            tool: cfg.name.clone(),
            reason,
        };

        let method = match cfg.method.to_ascii_uppercase().as_str() {
            "GET" => Method::GET,
            "DELETE" => Method::DELETE,
            "POST" => Method::POST,
            "PUT" => Method::PUT,
            "PATCH" => Method::PATCH,
            other => return Err(invalid(format!("unsupported method {other}"))),
        };

        let parameters = normalize(&cfg.parameters);
        CompiledSchema::compile(&parameters).map_err(|e| ToolsError::InvalidSchema {
            tool: cfg.name.clone(),
            reason: e.to_string(),
        })?;

        let url = UrlTemplate::parse(&cfg.url).map_err(&invalid)?;
        let declared = parameters.get("properties").and_then(Value::as_object);
        for name in url.params() {
            if !declared.is_some_and(|p| p.contains_key(name)) {
                return Err(invalid(format!(
                    "URL placeholder {{{name}}} is not a declared parameter"
                )));
            }
        }

        let mut headers = HeaderMap::new();
        for (name, template) in &cfg.headers {
            let value = expand(template, &env).map_err(|var| ToolsError::HeaderEnv {
                tool: cfg.name.clone(),
                header: name.clone(),
                var,
            })?;
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| invalid(format!("header name {name}: {e}")))?;
            let mut value = HeaderValue::from_str(&value)
                .map_err(|_| invalid(format!("header {name} has an invalid value")))?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }

        let client = reqwest::Client::builder()
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| invalid(format!("HTTP client: {e}")))?;

        let (risk, requires_approval) = own_trust(cfg);
        let spec = ToolSpec {
            output_schema: cfg.output_schema.clone(),
            risk,
            requires_approval,
            idempotent: cfg.idempotent.unwrap_or(false),
            timeout: cfg.timeout_s.map_or(DEFAULT_TIMEOUT, Duration::from_secs),
            roles: cfg.roles.clone().unwrap_or_default(),
            poll: cfg.poll.unwrap_or(false),
            source: ToolSource::Http,
            output_trust: cfg.output_trust.unwrap_or_default(),
            ..ToolSpec::new(cfg.name.clone(), cfg.description.clone(), parameters)
        };

        Ok(HttpTool {
            spec,
            method,
            url,
            headers,
            client,
            in_flight: Arc::new(Semaphore::new(
                cfg.max_concurrent_calls
                    .map_or(DEFAULT_MAX_CONCURRENT_CALLS, |n| {
                        usize::try_from(n).unwrap_or(usize::MAX)
                    })
                    .clamp(1, Semaphore::MAX_PERMITS),
            )),
        })
    }

    pub(crate) fn spec_mut(&mut self) -> &mut ToolSpec {
        &mut self.spec
    }

    async fn execute(&self, arguments: Value) -> Result<ToolOutput, ToolError> {
        let mut args = match arguments {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            _ => return Err(ToolError::Failed("arguments must be a JSON object".into())),
        };
        let url = self.url.render(&mut args)?;
        let mut request = self
            .client
            .request(self.method.clone(), url.clone())
            .headers(self.headers.clone());
        if self.method == Method::GET || self.method == Method::DELETE {
            request = request.query(&query_pairs(&args));
        } else {
            request = request.json(&Value::Object(args));
        }

        let mut response = request
            .send()
            .await
            .map_err(|e| transport_error(&url, &e))?;
        let status = response.status();
        let is_json = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.contains("json"));

        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| transport_error(&url, &e))?
        {
            let room = MAX_RESPONSE_BYTES - body.len();
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let text = String::from_utf8_lossy(&body).into_owned();

        if !status.is_success() {
            let snippet: String = text.chars().take(ERROR_SNIPPET_CHARS).collect();
            let more = if snippet.len() < text.len() || truncated {
                " …"
            } else {
                ""
            };
            return Ok(ToolOutput {
                content: format!("HTTP {status}: {snippet}{more}"),
                structured: None,
                is_error: true,
            });
        }

        let structured = if truncated {
            None
        } else {
            parse_json(&text, is_json)
        };
        let content = if truncated {
            format!("{text}\n[response truncated at {MAX_RESPONSE_BYTES} bytes]")
        } else {
            text
        };
        Ok(ToolOutput {
            content,
            structured,
            is_error: false,
        })
    }
}

#[async_trait::async_trait]
impl Tool for HttpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, arguments: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let timeout = self.spec.timeout;
        match tokio::time::timeout(timeout, self.execute(arguments)).await {
            Ok(result) => result,
            Err(_) => Err(ToolError::Timeout(timeout)),
        }
    }

    async fn place(&self) -> Option<CallPlace> {
        let permit = match self.in_flight.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                tracing::debug!(tool = %self.spec.name, "max_concurrent_calls in flight; this call waits");
                // Never closed: the tool owns the semaphore.
                self.in_flight.clone().acquire_owned().await.ok()?
            }
        };
        Some(Box::new(permit))
    }
}

/// Body parsed as JSON when the server says it is JSON, or when it plainly
/// looks like a JSON document despite a missing content type.
fn parse_json(text: &str, declared_json: bool) -> Option<Value> {
    let trimmed = text.trim_start();
    if declared_json || trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::from_str(text).ok()
    } else {
        None
    }
}

fn transport_error(url: &Url, e: &reqwest::Error) -> ToolError {
    // The query may carry arguments; the origin and path are enough to debug.
    let mut shown = url.clone();
    shown.set_query(None);
    if e.is_timeout() {
        ToolError::Failed(format!("request to {shown} timed out"))
    } else if e.is_connect() {
        ToolError::Unavailable(format!("cannot connect to {shown}: {e}"))
    } else {
        ToolError::Failed(format!("request to {shown} failed: {e}"))
    }
}

fn scalar_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Arrays become repeated keys (`?id=1&id=2`), nulls are left out, objects
/// are sent as JSON text.
fn query_pairs(args: &Map<String, Value>) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    for (name, value) in args {
        match value {
            Value::Null => {}
            Value::Array(items) => {
                for item in items.iter().filter(|v| !v.is_null()) {
                    pairs.push((name.clone(), scalar_text(item)));
                }
            }
            other => pairs.push((name.clone(), scalar_text(other))),
        }
    }
    pairs
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    Param(String),
}

/// A URL with `{param}` placeholders, checked once at construction.
#[derive(Debug, Clone)]
struct UrlTemplate {
    pieces: Vec<Piece>,
    /// How a call makes its URL without parsing all of it again: parsing a
    /// URL costs more than the rest of a call's setup.
    shortcut: Shortcut,
}

#[derive(Debug, Clone)]
enum Shortcut {
    /// Placeholders before the query: the filled URL is parsed whole.
    None,
    /// No placeholders: every call uses the URL as it is.
    Fixed(Url),
    /// Placeholders in the query only (and no fragment, which would end a
    /// query parsed whole but not one set alone): the URL up to the `?`,
    /// parsed once, and the query's pieces; a call parses only its query.
    Query { base: Url, query: Vec<Piece> },
}

/// The literal text and `{name}` placeholders of `template`, in order.
fn pieces(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(len) = rest[open + 1..].find('}') else {
            return Err(format!("unclosed {{ in URL template {template}"));
        };
        let name = &rest[open + 1..open + 1 + len];
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!("bad placeholder {{{name}}} in URL template"));
        }
        if open > 0 {
            pieces.push(Piece::Literal(rest[..open].to_owned()));
        }
        pieces.push(Piece::Param(name.to_owned()));
        rest = &rest[open + 1 + len + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Literal(rest.to_owned()));
    }
    Ok(pieces)
}

fn fill(pieces: &[Piece], mut value: impl FnMut(&str) -> String) -> String {
    let mut out = String::new();
    for piece in pieces {
        match piece {
            Piece::Literal(text) => out.push_str(text),
            Piece::Param(name) => out.push_str(&value(name)),
        }
    }
    out
}

impl UrlTemplate {
    fn parse(template: &str) -> Result<Self, String> {
        let pieces = pieces(template)?;
        let sample = fill(&pieces, |_| "x".to_owned());
        let url = Url::parse(&sample).map_err(|e| format!("invalid URL {template}: {e}"))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(format!("URL {template} is not http or https"));
        }
        let shortcut = if !pieces.iter().any(|p| matches!(p, Piece::Param(_))) {
            Shortcut::Fixed(url)
        } else {
            match template.split_once('?') {
                Some((base, query)) if !base.contains('{') && !template.contains('#') => {
                    Shortcut::Query {
                        base: Url::parse(base)
                            .map_err(|e| format!("invalid URL {template}: {e}"))?,
                        query: self::pieces(query)?,
                    }
                }
                _ => Shortcut::None,
            }
        };
        Ok(Self { pieces, shortcut })
    }

    fn params(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Param(name) => Some(name.as_str()),
            Piece::Literal(_) => None,
        })
    }

    /// Fills the placeholders, removing the arguments it used from `args`.
    fn render(&self, args: &mut Map<String, Value>) -> Result<Url, ToolError> {
        match &self.shortcut {
            Shortcut::Fixed(url) => Ok(url.clone()),
            Shortcut::Query { base, query } => {
                let mut url = base.clone();
                url.set_query(Some(&fill_arguments(query, args)?));
                Ok(url)
            }
            Shortcut::None => {
                let text = fill_arguments(&self.pieces, args)?;
                Url::parse(&text).map_err(|e| ToolError::Failed(format!("invalid URL {text}: {e}")))
            }
        }
    }
}

/// `pieces` with each placeholder's argument taken out of `args`, encoded
/// so that it can never add a path segment, a query or a fragment.
fn fill_arguments(pieces: &[Piece], args: &mut Map<String, Value>) -> Result<String, ToolError> {
    let mut missing = None;
    let text = fill(pieces, |name| match args.remove(name) {
        Some(v) if !v.is_null() => utf8_percent_encode(&scalar_text(&v), PATH_SEGMENT).to_string(),
        _ => {
            missing.get_or_insert_with(|| name.to_owned());
            String::new()
        }
    });
    match missing {
        Some(name) => Err(ToolError::Failed(format!("missing path parameter {name}"))),
        None => Ok(text),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn template_encodes_path_segments() {
        let t = UrlTemplate::parse("http://127.0.0.1:9/f/{id}/x?k=1").unwrap();
        let mut args = json!({"id": "a/b c?#", "other": 1})
            .as_object()
            .unwrap()
            .clone();
        let url = t.render(&mut args).unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:9/f/a%2Fb%20c%3F%23/x?k=1");
        assert_eq!(args.len(), 1, "used arguments are removed");
    }

    #[test]
    fn a_template_without_placeholders_is_the_url_itself() {
        let t = UrlTemplate::parse("http://127.0.0.1:9/lookup?k=1").unwrap();
        let mut args = json!({"key": "a"}).as_object().unwrap().clone();
        let url = t.render(&mut args).unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:9/lookup?k=1");
        assert_eq!(
            args.len(),
            1,
            "the arguments are left for the query or body"
        );
        assert!(UrlTemplate::parse("ftp://h/x").is_err());
    }

    #[test]
    fn a_query_filled_alone_is_the_url_parsed_whole() {
        let args = json!({"key": "a b/&=?#é", "n": 7, "id": "x"});
        for template in [
            "http://127.0.0.1:9/lookup?key={key}",
            "http://127.0.0.1:9/lookup?key={key}&n={n}&fixed=1",
            "https://h?{key}",
            "http://h/a/../b/?k=%20{key}",
            "http://h/{id}?key={key}",
            "http://h/x?key={key}#frag",
        ] {
            let t = UrlTemplate::parse(template).unwrap();
            let mut filled = args.as_object().unwrap().clone();
            let got = t.render(&mut filled).unwrap();
            let whole = fill(&t.pieces, |name| {
                utf8_percent_encode(&scalar_text(&args[name]), PATH_SEGMENT).to_string()
            });
            assert_eq!(got, Url::parse(&whole).unwrap(), "{template}");
        }
        let t = UrlTemplate::parse("http://h/x?key={key}&n={n}").unwrap();
        assert!(matches!(t.shortcut, Shortcut::Query { .. }));
        let err = t.render(&mut Map::new()).unwrap_err();
        assert!(err.to_string().contains("key"), "{err}");
    }

    #[test]
    fn template_rejects_bad_input() {
        assert!(UrlTemplate::parse("http://h/{id").is_err());
        assert!(UrlTemplate::parse("http://h/{}").is_err());
        assert!(UrlTemplate::parse("ftp://h/{id}").is_err());
        let t = UrlTemplate::parse("http://h/{id}").unwrap();
        let err = t.render(&mut Map::new()).unwrap_err();
        assert!(err.to_string().contains("id"));
    }

    #[test]
    fn query_pairs_flatten_arrays_and_skip_nulls() {
        let args = json!({"a": [1, 2], "b": null, "c": "x", "d": true});
        let pairs = query_pairs(args.as_object().unwrap());
        let want: Vec<(String, String)> = [("a", "1"), ("a", "2"), ("c", "x"), ("d", "true")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(pairs, want);
    }
}
