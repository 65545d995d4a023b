//! rmcp's streamable-HTTP transport over the workspace's reqwest.
//!
//! rmcp ships a client for reqwest 0.13; keel uses reqwest 0.12 everywhere
//! else. Plugging our own `StreamableHttpClient` in keeps one HTTP and TLS
//! stack (rustls with ring) in the binary instead of two, at the cost of
//! this module. It follows rmcp's built-in client in how it classifies
//! answers, so the transport's session, retry and discovery logic behave
//! the same.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{
    ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE,
};
use reqwest::{Response, StatusCode};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ErrorData, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, HttpStatusError, InsufficientScopeError, SseError, StreamableHttpClient,
    StreamableHttpError, StreamableHttpPostResponse,
};
use sse_stream::{Sse, SseStream};
use tokio::sync::Notify;

const SESSION_ID: &str = "mcp-session-id";
const LAST_EVENT_ID: &str = "last-event-id";
const EVENT_STREAM: &str = "text/event-stream";
const JSON: &str = "application/json";
/// Successful JSON bodies larger than this are refused, not truncated.
const MAX_JSON_BODY: usize = 16 * 1024 * 1024;
/// Error bodies are only read for a JSON-RPC error or a message.
const MAX_ERROR_BODY: usize = 64 * 1024;

type Error = StreamableHttpError<reqwest::Error>;

/// A reqwest 0.12 client speaking the streamable-HTTP side of MCP.
#[derive(Clone, Debug)]
pub(crate) struct HttpClient {
    inner: reqwest::Client,
    /// Woken when the server forgot our session (it restarted): rmcp opens
    /// a new one by itself, and the new process may offer other tools.
    session_lost: Arc<Notify>,
}

impl HttpClient {
    pub(crate) fn new(inner: reqwest::Client, session_lost: Arc<Notify>) -> Self {
        Self {
            inner,
            session_lost,
        }
    }
}

fn with_headers(
    mut request: reqwest::RequestBuilder,
    session_id: Option<&str>,
    auth: Option<String>,
    custom: HashMap<HeaderName, HeaderValue>,
) -> reqwest::RequestBuilder {
    if let Some(session_id) = session_id {
        request = request.header(SESSION_ID, session_id);
    }
    if let Some(token) = auth {
        request = request.bearer_auth(token);
    }
    for (name, value) in custom {
        request = request.header(name, value);
    }
    request
}

/// 401 and 403 with a challenge are the auth errors rmcp's lifecycle knows.
fn auth_error(response: &Response) -> Option<Error> {
    let challenge = response.headers().get(WWW_AUTHENTICATE)?;
    let challenge = String::from_utf8_lossy(challenge.as_bytes()).into_owned();
    match response.status() {
        StatusCode::UNAUTHORIZED => Some(StreamableHttpError::AuthRequired(
            AuthRequiredError::new(challenge),
        )),
        StatusCode::FORBIDDEN => {
            let scope = scope_of(&challenge);
            Some(StreamableHttpError::InsufficientScope(
                InsufficientScopeError::new(challenge, scope),
            ))
        }
        _ => None,
    }
}

fn scope_of(challenge: &str) -> Option<String> {
    let start = challenge.find("scope=\"")? + "scope=\"".len();
    let rest = &challenge[start..];
    Some(rest[..rest.find('"')?].to_owned())
}

/// Rate limits and server errors keep only status and `Retry-After`.
fn status_error(status: StatusCode, headers: &HeaderMap) -> Option<HttpStatusError> {
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let retry_after = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Some(HttpStatusError::new(status.as_u16(), retry_after))
}

fn content_type(response: &Response) -> Option<String> {
    response
        .headers()
        .get(CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

async fn read_bounded(response: Response, max: usize) -> Result<Vec<u8>, Error> {
    if response.content_length().is_some_and(|n| n > max as u64) {
        return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
    }
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(StreamableHttpError::Client)?;
        if chunk.len() > max - body.len() {
            return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An SSE body as events, refusing any single event larger than `max`
/// bytes so a misbehaving server cannot make the client buffer without end.
///
/// The stream ends at its first error. The SSE parser drops the rest of
/// the read a bad line came in, blank line included, without ending the
/// event it was in, so the data lines that follow would join that event
/// and grow it past `max` while the byte count above sees events end.
pub(crate) fn sse_events(
    response: Response,
    max: usize,
) -> BoxStream<'static, Result<Sse, SseError>> {
    let mut event_bytes = 0usize;
    let mut line_len = 0usize;
    let bytes = response.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        for &b in chunk.iter() {
            match b {
                b'\n' if line_len == 0 => event_bytes = 0,
                b'\n' => line_len = 0,
                b'\r' => {}
                _ => {
                    line_len += 1;
                    event_bytes += 1;
                }
            }
            if event_bytes > max {
                return Err(std::io::Error::other(format!(
                    "SSE event larger than {max} bytes"
                )));
            }
        }
        Ok(chunk)
    });
    let mut failed = false;
    SseStream::from_bytes_stream(bytes)
        .take_while(move |event| {
            let more = !failed;
            failed |= event.is_err();
            std::future::ready(more)
        })
        .boxed()
}

fn is_notification_like(message: &ClientJsonRpcMessage) -> bool {
    matches!(
        message,
        ClientJsonRpcMessage::Notification(_)
            | ClientJsonRpcMessage::Response(_)
            | ClientJsonRpcMessage::Error(_)
    )
}

/// A sessionless `server/discover` refused with a 4xx is how a legacy
/// streamable-HTTP server answers; turn it into a JSON-RPC error correlated
/// with the request so rmcp's lifecycle falls back to `initialize`.
fn legacy_discover_answer(
    message: &ClientJsonRpcMessage,
    had_session: bool,
    status: StatusCode,
    body: &str,
) -> Option<StreamableHttpPostResponse> {
    if had_session
        || !status.is_client_error()
        || matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
    {
        return None;
    }
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    if !matches!(request.request, ClientRequest::DiscoverRequest(_)) {
        return None;
    }
    let error = match serde_json::from_str::<ServerJsonRpcMessage>(body) {
        Ok(ServerJsonRpcMessage::Error(e)) => e.error,
        _ => ErrorData::invalid_request(
            format!("server/discover rejected with HTTP {status}: {body}"),
            None,
        ),
    };
    Some(StreamableHttpPostResponse::Json(
        ServerJsonRpcMessage::error(error, Some(request.id.clone())),
        None,
    ))
}

/// The spec answers an unknown session with 404, which rmcp recovers from
/// by initializing again. The reference servers answer 400 with an error
/// that names no request instead; left as is, the request would wait for
/// an answer that never comes. Treat that like the 404: one new session,
/// one retry, and the error surfaces if it fails again.
fn lost_session(
    message: &ClientJsonRpcMessage,
    had_session: bool,
    status: StatusCode,
    body: &str,
) -> bool {
    if !had_session || !matches!(status, StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND) {
        return false;
    }
    let ClientJsonRpcMessage::Request(request) = message else {
        return true;
    };
    match serde_json::from_str::<ServerJsonRpcMessage>(body) {
        Ok(ServerJsonRpcMessage::Error(e)) => e.id.as_ref() != Some(&request.id),
        _ => true,
    }
}

impl HttpClient {
    async fn post(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth: Option<String>,
        custom: HashMap<HeaderName, HeaderValue>,
        max_event: usize,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let had_session = session_id.is_some();
        let request = self
            .inner
            .post(uri.as_ref())
            .header(ACCEPT, format!("{JSON}, {EVENT_STREAM}"));
        let response = with_headers(request, session_id.as_deref(), auth, custom)
            .json(&message)
            .send()
            .await
            .map_err(StreamableHttpError::Client)?;
        if let Some(e) = auth_error(&response) {
            return Err(e);
        }
        let status = response.status();
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && had_session {
            self.session_lost.notify_one();
            return Err(StreamableHttpError::SessionExpired);
        }
        let ctype = content_type(&response);
        let is_json = ctype.as_deref().is_some_and(|c| c.starts_with(JSON));
        let status_err = status_error(status, response.headers());
        if let Some(e) = &status_err
            && (!is_json || status == StatusCode::TOO_MANY_REQUESTS)
        {
            return Err(HttpStatusError::new(e.status, e.retry_after.clone()).into());
        }
        let new_session = response
            .headers()
            .get(SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if status.is_success()
            && response.content_length() == Some(0)
            && is_notification_like(&message)
        {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if !status.is_success() {
            let body = match read_bounded(response, MAX_ERROR_BODY).await {
                Ok(body) => String::from_utf8_lossy(&body).into_owned(),
                Err(e @ StreamableHttpError::ResponseBodyTooLarge { .. }) => {
                    return Err(status_err.map(StreamableHttpError::from).unwrap_or(e));
                }
                Err(_) => "<failed to read response body>".to_owned(),
            };
            if let Some(answer) = legacy_discover_answer(&message, had_session, status, &body) {
                return Ok(answer);
            }
            if lost_session(&message, had_session, status, &body) {
                self.session_lost.notify_one();
                return Err(StreamableHttpError::SessionExpired);
            }
            let is_auth = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
            if !is_auth
                && is_json
                && let Ok(error @ ServerJsonRpcMessage::Error(_)) = serde_json::from_str(&body)
            {
                return Ok(StreamableHttpPostResponse::Json(error, new_session));
            }
            if let Some(e) = status_err {
                return Err(e.into());
            }
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!("HTTP {status}: {body}"),
            )));
        }
        match ctype.as_deref() {
            Some(c) if c.starts_with(EVENT_STREAM) => Ok(StreamableHttpPostResponse::Sse(
                sse_events(response, max_event),
                new_session,
            )),
            Some(c) if c.starts_with(JSON) => {
                let body = read_bounded(response, MAX_JSON_BODY).await?;
                match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
                    Ok(parsed) => Ok(StreamableHttpPostResponse::Json(parsed, new_session)),
                    // Nothing waits for an answer to these; a body we cannot
                    // read is as good as none.
                    Err(_) if is_notification_like(&message) => {
                        Ok(StreamableHttpPostResponse::Accepted)
                    }
                    Err(e) => Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                        format!(
                            "not a JSON-RPC message: {e}: {}",
                            String::from_utf8_lossy(&body[..body.len().min(256)])
                        ),
                    ))),
                }
            }
            _ if is_notification_like(&message) => Ok(StreamableHttpPostResponse::Accepted),
            _ => Err(StreamableHttpError::UnexpectedContentType(ctype)),
        }
    }

    async fn get(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth: Option<String>,
        custom: HashMap<HeaderName, HeaderValue>,
        max_event: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Error> {
        let mut request = self
            .inner
            .get(uri.as_ref())
            .header(ACCEPT, format!("{EVENT_STREAM}, {JSON}"));
        if let Some(id) = last_event_id {
            request = request.header(LAST_EVENT_ID, id);
        }
        let response = with_headers(request, session_id.as_deref(), auth, custom)
            .send()
            .await
            .map_err(StreamableHttpError::Client)?;
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if let Some(e) = auth_error(&response) {
            return Err(e);
        }
        if let Some(e) = status_error(response.status(), response.headers()) {
            return Err(e.into());
        }
        let response = response
            .error_for_status()
            .map_err(StreamableHttpError::Client)?;
        match content_type(&response) {
            Some(c) if c.starts_with(EVENT_STREAM) || c.starts_with(JSON) => {
                Ok(sse_events(response, max_event))
            }
            other => Err(StreamableHttpError::UnexpectedContentType(other)),
        }
    }
}

/// Default SSE event limit when rmcp calls the size-less methods.
const DEFAULT_MAX_EVENT: usize = 16 * 1024 * 1024;

impl StreamableHttpClient for HttpClient {
    type Error = reqwest::Error;

    fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<StreamableHttpPostResponse, Error>> + Send + '_ {
        self.post(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            DEFAULT_MAX_EVENT,
        )
    }

    fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> impl Future<Output = Result<StreamableHttpPostResponse, Error>> + Send + '_ {
        self.post(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            max_sse_event_size,
        )
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error> {
        let request = self.inner.delete(uri.as_ref());
        let response = with_headers(request, Some(&session_id), auth_header, custom_headers)
            .send()
            .await
            .map_err(StreamableHttpError::Client)?;
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Ok(());
        }
        response
            .error_for_status()
            .map(drop)
            .map_err(StreamableHttpError::Client)
    }

    fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<Sse, SseError>>, Error>> + Send + '_
    {
        self.get(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            DEFAULT_MAX_EVENT,
        )
    }

    fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<Sse, SseError>>, Error>> + Send + '_
    {
        self.get(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            max_sse_event_size,
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn response(reads: Vec<Vec<u8>>) -> Response {
        let body = futures::stream::iter(reads.into_iter().map(Ok::<_, std::io::Error>));
        Response::from(http::Response::new(reqwest::Body::wrap_stream(body)))
    }

    /// Found by the `mcp_sse` fuzz target: a line the parser refuses (here
    /// an unknown field) swallows the blank line read with it, and the
    /// next event's data joined the first one past the limit.
    #[tokio::test]
    async fn no_event_grows_past_the_limit_across_a_parse_error() {
        let first = format!("data: {}", "a".repeat(300));
        let second = format!("data: {}", "b".repeat(300));
        let reads = vec![
            format!("{first}\n").into_bytes(),
            b"\xd3: comment\n\n".to_vec(),
            format!("{second}\n\n").into_bytes(),
        ];
        let events: Vec<Result<Sse, SseError>> = sse_events(response(reads), 512).collect().await;
        assert!(
            events
                .iter()
                .flatten()
                .all(|e| e.data.as_ref().is_none_or(|d| d.len() <= 512)),
            "{events:?}"
        );
        assert!(events.last().is_some_and(Result::is_err), "{events:?}");
    }

    #[tokio::test]
    async fn events_within_the_limit_pass() {
        let reads = vec![b"data: {\"a\":1}\n\n: ping\n\ndata: 2\n\n".to_vec()];
        let events: Vec<Option<String>> = sse_events(response(reads), 512)
            .map(|e| e.unwrap().data)
            .collect()
            .await;
        assert_eq!(events, [Some("{\"a\":1}".to_owned()), Some("2".to_owned())]);
    }
}
