//! OTLP/HTTP (protobuf) export of keel-core's GenAI spans, when
//! `[telemetry] otlp_endpoint` or `OTEL_EXPORTER_OTLP_ENDPOINT` says where
//! (docs/telemetry.md).

use anyhow::Context;
use keel_config::TelemetryConfig;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The exporter; spans still queued are sent when it is shut down.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Sends what is queued, then stops. Called when keel exits.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "sending the last spans failed");
        }
    }
}

/// The standard variables that name a collector without keel's config.
const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Starts exporting, or does nothing when no collector is named.
pub fn start(config: &TelemetryConfig) -> anyhow::Result<Option<Exporter>> {
    let from_env = ENDPOINT_VARS
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()));
    if config.otlp_endpoint.is_none() && !from_env {
        return Ok(None);
    }
    let mut exporter = SpanExporter::builder().with_http();
    // The config names the collector's base URL, as the standard variable
    // does; the exporter wants the traces URL itself.
    if let Some(base) = &config.otlp_endpoint {
        exporter = exporter.with_endpoint(traces_url(base));
    }
    let exporter = exporter
        .build()
        .context("telemetry: building the OTLP exporter")?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build();
    crate::logging::export_spans(provider.tracer("keel"))
        .map_err(|e| anyhow::anyhow!("telemetry: {e}"))?;
    keel_core::otel::set_capture_content(config.capture_content);
    tracing::info!(
        endpoint = config
            .otlp_endpoint
            .as_deref()
            .unwrap_or("from OTEL_EXPORTER_OTLP_*"),
        capture_content = config.capture_content,
        "exporting traces over OTLP/HTTP"
    );
    Ok(Some(Exporter { provider }))
}

fn traces_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn the_traces_path_is_added_once() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/v1/traces/"),
            "http://c:4318/v1/traces"
        );
    }
}
