//! Where log lines go.
//!
//! `keel serve` is a service: its log is its output, on stderr. The other
//! commands are for a person at a terminal, whose screen belongs to the
//! run's timeline: their log goes to `<data_dir>/keel.log`, and only lines
//! meant for that person (target [`NOTICE`]) reach the terminal, one short
//! line each. `--verbose` or `KEEL_LOG` sends the whole log to stderr
//! instead. Colour codes are written only to a terminal.
//!
//! Every line passes the secret redactor (see [`redact_secrets`]) on its
//! way out, wherever it goes: a secret a message or a field carries is
//! written as `[redacted]`.

use std::fs::{File, OpenOptions};
use std::io::{self, IsTerminal, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use std::sync::OnceLock;

use keel_protocol::Redactor;
use opentelemetry_sdk::trace::SdkTracer;
use tracing::Level;
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::filter::{EnvFilter, Filtered, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry, fmt, reload};

/// Target of the lines a person at the terminal should see even when the
/// log goes to a file: `tracing::warn!(target: NOTICE, "...")`.
pub const NOTICE: &str = "keel::notice";

/// Lines kept in memory until the log file is known; past this, the oldest
/// part of the log is what survives (start-up is all that is ever held).
const MAX_PENDING: usize = 1 << 20;

/// Where the whole log goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// Everything on stderr (`keel serve`, `--verbose`, `KEEL_LOG`).
    Stderr,
    /// A file named later, with [`to_file`], once the data dir is known.
    File,
}

/// The OpenTelemetry layer, absent until the configuration says where
/// spans go.
type OtelLayer = Option<OpenTelemetryLayer<Registry, SdkTracer>>;

/// What [`export_spans`] swaps in: the layer, and its filter, which lets
/// nothing through until then so that no span is even built.
struct OtelHandles {
    layer: reload::Handle<OtelLayer, Registry>,
    filter: reload::Handle<Targets, Registry>,
}

static OTEL: OnceLock<OtelHandles> = OnceLock::new();

/// The (empty) OpenTelemetry layer; a per-layer filter is registered with
/// the subscriber here, so it must exist from the start (a filtered layer
/// reloaded in later would have no filter id).
fn otel_layer()
-> Filtered<reload::Layer<OtelLayer, Registry>, reload::Layer<Targets, Registry>, Registry> {
    let (layer, layer_handle) = reload::Layer::new(None);
    let (filter, filter_handle) = reload::Layer::new(Targets::new());
    let _ = OTEL.set(OtelHandles {
        layer: layer_handle,
        filter: filter_handle,
    });
    layer.with_filter(filter)
}

/// The log's filter: `KEEL_LOG`, else `info`. The GenAI spans are for the
/// trace exporter, not for log lines.
fn log_filter() -> EnvFilter {
    let filter = EnvFilter::try_from_env("KEEL_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    match format!("{}=off", keel_core::otel::TARGET).parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

/// Installs the subscriber. With [`Destination::File`], lines are held in
/// memory until [`to_file`] names the file.
pub fn init(destination: Destination) {
    let filter = log_filter();
    let otel = otel_layer();
    match destination {
        Destination::Stderr => {
            *SINK.lock() = State::Stderr;
            let layer = fmt::layer()
                .with_writer(SINK.clone())
                .with_ansi(io::stderr().is_terminal())
                .with_filter(filter);
            let _ = tracing_subscriber::registry()
                .with(otel)
                .with(layer)
                .try_init();
        }
        Destination::File => {
            let file = fmt::layer()
                .with_writer(SINK.clone())
                .with_ansi(false)
                .with_filter(filter);
            let notices = fmt::layer()
                .with_writer(RedactedStderr)
                .event_format(NoticeFormat)
                .with_filter(Targets::new().with_target(NOTICE, Level::INFO));
            let _ = tracing_subscriber::registry()
                .with(otel)
                .with(file)
                .with(notices)
                .try_init();
        }
    }
}

/// Sends keel-core's GenAI spans to `tracer` from now on.
pub fn export_spans(tracer: SdkTracer) -> Result<(), String> {
    let handles = OTEL.get().ok_or("the log is not initialised")?;
    handles
        .layer
        .reload(Some(tracing_opentelemetry::layer().with_tracer(tracer)))
        .map_err(|e| format!("installing the trace exporter: {e}"))?;
    handles
        .filter
        .reload(Targets::new().with_target(keel_core::otel::TARGET, Level::INFO))
        .map_err(|e| format!("installing the trace exporter: {e}"))
}

/// The secrets no log line may show. Called once the configuration is
/// loaded, before the held lines are written; a later call (a reloaded
/// configuration) adds to the secrets, never forgets one.
pub fn redact_secrets(secrets: &Redactor) {
    let mut current = REDACTOR.write().unwrap_or_else(PoisonError::into_inner);
    match current.union(secrets) {
        Ok(both) => *current = both,
        // Keeping the old set is safer than having none.
        Err(_) if !current.is_empty() => {}
        Err(_) => *current = secrets.clone(),
    }
}

/// `text` as a log line would show it.
pub fn redact(text: &str) -> String {
    REDACTOR
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .redact(text)
        .into_owned()
}

static REDACTOR: std::sync::LazyLock<std::sync::RwLock<Redactor>> =
    std::sync::LazyLock::new(Default::default);

/// `buf` with every secret replaced. The fmt layers write one whole line
/// per call, so a secret is never split between two writes.
fn redacted(buf: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let redactor = REDACTOR.read().unwrap_or_else(PoisonError::into_inner);
    if redactor.is_empty() {
        return std::borrow::Cow::Borrowed(buf);
    }
    let text = String::from_utf8_lossy(buf);
    match redactor.redact(&text) {
        std::borrow::Cow::Borrowed(_) => std::borrow::Cow::Borrowed(buf),
        std::borrow::Cow::Owned(clean) => std::borrow::Cow::Owned(clean.into_bytes()),
    }
}

/// Sends the log (and whatever was held until now) to `path`, appending.
/// When the file cannot be opened, the log goes to stderr and the reason
/// is its first line. Does nothing when the log already goes somewhere.
pub fn to_file(path: &Path) {
    if !matches!(*SINK.lock(), State::Pending(_)) {
        return;
    }
    let opened = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| OpenOptions::new().create(true).append(true).open(path));
    let mut state = SINK.lock();
    let held = match std::mem::replace(&mut *state, State::Stderr) {
        State::Pending(held) => held,
        _ => Vec::new(),
    };
    // Held before the secrets were known; redacted now.
    let held = redacted(&held);
    match opened {
        Ok(mut file) => {
            let _ = file.write_all(&held);
            *state = State::File(file);
        }
        Err(e) => {
            let mut err = io::stderr().lock();
            let _ = writeln!(err, "keel: cannot write the log to {}: {e}", path.display());
            let _ = err.write_all(&held);
        }
    }
}

/// One line per notice: `keel: <message>`.
struct NoticeFormat;

impl<S, N> fmt::FormatEvent<S, N> for NoticeFormat
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &fmt::FmtContext<'_, S, N>,
        mut writer: fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        write!(writer, "keel: ")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

enum State {
    Pending(Vec<u8>),
    File(File),
    Stderr,
}

/// The log's destination, shared by every writer the subscriber makes.
#[derive(Clone)]
struct Sink(Arc<Mutex<State>>);

impl Sink {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while a line was written leaves a usable state behind.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

static SINK: std::sync::LazyLock<Sink> =
    std::sync::LazyLock::new(|| Sink(Arc::new(Mutex::new(State::Pending(Vec::new())))));

impl Write for Sink {
    /// Takes the whole line (or none of it): a line cut short and
    /// continued by a second call could split a secret between the two.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut *self.lock() {
            State::Pending(held) => {
                if held.len() + buf.len() <= MAX_PENDING {
                    held.extend_from_slice(buf);
                }
            }
            State::File(file) => file.write_all(&redacted(buf))?,
            State::Stderr => io::stderr().write_all(&redacted(buf))?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut *self.lock() {
            State::File(file) => file.flush(),
            State::Stderr => io::stderr().flush(),
            State::Pending(_) => Ok(()),
        }
    }
}

impl<'a> MakeWriter<'a> for Sink {
    type Writer = Sink;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Notices on stderr, redacted like the log.
#[derive(Clone, Copy)]
struct RedactedStderr;

impl Write for RedactedStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        io::stderr().write_all(&redacted(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

impl<'a> MakeWriter<'a> for RedactedStderr {
    type Writer = RedactedStderr;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn lines_are_redacted_and_secrets_accumulate() {
        redact_secrets(&Redactor::new(["first-secret-value"]).unwrap());
        redact_secrets(&Redactor::new(["second-secret-value"]).unwrap());
        let line = b"key=first-secret-value other=\"second-secret-value\"\n";
        assert_eq!(
            &*redacted(line),
            b"key=[redacted] other=\"[redacted]\"\n".as_slice()
        );
        assert_eq!(redact("x first-secret-value"), "x [redacted]");
    }
}
