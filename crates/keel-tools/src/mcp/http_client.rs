//! rmcp's streamable-HTTP client for `reqwest::Client`, plus a wake-up
//! when the server forgot our session.
//!
//! rmcp's client does the HTTP side: auth challenges, rate limits and
//! server errors, body and SSE event size limits, the legacy answer to
//! `server/discover`, and a 404 on a session as
//! [`StreamableHttpError::SessionExpired`], after which the transport opens
//! a new session by itself. keel needs to hear of that last case: the
//! server restarted, and the new process may offer other tools.

use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, RequestId, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
};
use sse_stream::Sse;
use tokio::sync::Notify;

type Error = StreamableHttpError<reqwest::Error>;

/// A `reqwest::Client` speaking streamable HTTP through rmcp's own
/// implementation, which notifies `session_lost` when the server no longer
/// knows the session.
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

    /// Passes `answer` on, turning an unknown session into `SessionExpired`
    /// and waking `session_lost` for it. `sent` is the message's request
    /// id, `None` for a notification, response or error.
    fn after_post(
        &self,
        sent: Option<RequestId>,
        had_session: bool,
        answer: Result<StreamableHttpPostResponse, Error>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let lost = match &answer {
            Err(StreamableHttpError::SessionExpired) => true,
            // The spec answers an unknown session with 404, which rmcp
            // recognises above. The reference servers answer 400 with an
            // error that names no request instead; passed on, it would leave
            // the request waiting for an answer that never comes. As
            // `SessionExpired` it gets one new session and one retry, and
            // the error surfaces if that fails too.
            Ok(StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(error), _)) => {
                had_session && (sent.is_none() || error.id != sent)
            }
            _ => false,
        };
        if !lost {
            return answer;
        }
        self.session_lost.notify_one();
        Err(StreamableHttpError::SessionExpired)
    }
}

fn request_id(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        ClientJsonRpcMessage::Request(request) => Some(request.id.clone()),
        _ => None,
    }
}

impl StreamableHttpClient for HttpClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let (sent, had_session) = (request_id(&message), session_id.is_some());
        let answer = self
            .inner
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await;
        self.after_post(sent, had_session, answer)
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let (sent, had_session) = (request_id(&message), session_id.is_some());
        let answer = self
            .inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.after_post(sent, had_session, answer)
    }

    fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<(), Error>> + Send + '_ {
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
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
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
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
        self.inner.get_stream_with_max_sse_event_size(
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
    use axum::Router;
    use axum::http::{StatusCode, header};
    use axum::routing::post;
    use futures::FutureExt;
    use rmcp::model::{ClientRequest, PingRequest};

    use super::*;

    /// What the reference servers answer a session they do not know.
    const NO_SESSION: &str = r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":null}"#;
    /// An error about request 1 itself.
    const REFUSED: &str =
        r#"{"jsonrpc":"2.0","error":{"code":-32602,"message":"Invalid params"},"id":1}"#;

    async fn server() -> String {
        let json = |body: &'static str| {
            move || async move {
                (
                    StatusCode::BAD_REQUEST,
                    [(header::CONTENT_TYPE, "application/json")],
                    body,
                )
            }
        };
        let app = Router::new()
            .route("/gone", post(|| async { StatusCode::NOT_FOUND }))
            .route("/forgot", post(json(NO_SESSION)))
            .route("/refused", post(json(REFUSED)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    async fn post_ping(
        base: &str,
        path: &str,
        session: Option<&str>,
    ) -> (Result<StreamableHttpPostResponse, Error>, bool) {
        let lost = Arc::new(Notify::new());
        let client = HttpClient::new(reqwest::Client::new(), Arc::clone(&lost));
        let ping = ClientJsonRpcMessage::request(
            ClientRequest::PingRequest(PingRequest::default()),
            RequestId::Number(1),
        );
        let answer = client
            .post_message(
                format!("{base}{path}").into(),
                ping,
                session.map(Arc::from),
                None,
                HashMap::new(),
            )
            .await;
        let notified = lost.notified().now_or_never().is_some();
        (answer, notified)
    }

    /// The answer is a lost session, and `session_lost` was woken.
    fn assert_lost((answer, notified): (Result<StreamableHttpPostResponse, Error>, bool)) {
        assert!(
            matches!(answer, Err(StreamableHttpError::SessionExpired)),
            "{answer:?}"
        );
        assert!(notified);
    }

    /// The server's JSON-RPC error is passed on, and nothing was woken.
    fn assert_passed_on((answer, notified): (Result<StreamableHttpPostResponse, Error>, bool)) {
        assert!(
            matches!(
                answer,
                Ok(StreamableHttpPostResponse::Json(
                    ServerJsonRpcMessage::Error(_),
                    _
                ))
            ),
            "{answer:?}"
        );
        assert!(!notified);
    }

    #[tokio::test]
    async fn a_404_on_a_session_is_a_lost_session() {
        let base = server().await;
        assert_lost(post_ping(&base, "/gone", Some("s1")).await);
    }

    #[tokio::test]
    async fn an_error_naming_no_request_on_a_session_is_a_lost_session() {
        let base = server().await;
        assert_lost(post_ping(&base, "/forgot", Some("s1")).await);
    }

    #[tokio::test]
    async fn an_error_about_the_request_is_passed_on() {
        let base = server().await;
        assert_passed_on(post_ping(&base, "/refused", Some("s1")).await);
    }

    #[tokio::test]
    async fn without_a_session_nothing_is_lost() {
        let base = server().await;
        assert_passed_on(post_ping(&base, "/forgot", None).await);
        let (answer, notified) = post_ping(&base, "/gone", None).await;
        assert!(answer.is_err(), "{answer:?}");
        assert!(!notified);
    }
}
