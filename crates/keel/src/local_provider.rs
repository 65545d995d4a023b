//! Provider `kind = "local"`: a GGUF named by `model_path`, or a known model
//! name resolved in the model cache (pulled on first use when missing).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use keel_config::{Config, ProviderConfig, ProviderKind};
use keel_local::{LocalModel, LocalSettings, catalog};
use keel_protocol::ModelClient;

/// Loads the provider's model on its own worker thread.
pub fn client(p: &ProviderConfig, data_dir: &Path) -> anyhow::Result<Arc<dyn ModelClient>> {
    let path = resolve(p, data_dir)?;
    let mut settings = LocalSettings::new(path, p.model.clone());
    settings.threads = p.threads;
    if let Some(requantize) = p.requantize_q4_1 {
        settings.requantize_q4_1 = requantize;
    }
    settings.context_window = p.context_window;
    if let Some(max) = p.max_output_tokens {
        settings.max_output_tokens = max;
    }
    let model = LocalModel::load(settings).with_context(|| format!("provider `{}`", p.name))?;
    Ok(Arc::new(model))
}

/// The GGUF file a local provider runs.
pub fn resolve(p: &ProviderConfig, data_dir: &Path) -> anyhow::Result<PathBuf> {
    if let Some(path) = p.model_path.as_deref().filter(|s| !s.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    if let Some(known) = catalog::known(&p.model) {
        return catalog::find_local(known, data_dir).with_context(|| {
            format!(
                "provider `{}`: model `{}` is not in {}; run `keel model pull {}`",
                p.name,
                known.name,
                catalog::models_dir(data_dir).display(),
                known.name
            )
        });
    }
    let in_cache = catalog::models_dir(data_dir).join(&p.model);
    if in_cache.is_file() {
        return Ok(in_cache);
    }
    let names: Vec<&str> = catalog::KNOWN_MODELS.iter().map(|m| m.name).collect();
    bail!(
        "provider `{}`: model `{}` is neither a known model ({}) nor a file in {}; set model_path to a GGUF file",
        p.name,
        p.model,
        names.join(", "),
        catalog::models_dir(data_dir).display()
    )
}

/// Pulls every known model a local provider names and the cache lacks, so
/// the first `keel run` works offline-capable from then on.
pub async fn ensure_models(config: &Config) -> anyhow::Result<()> {
    let data_dir = Path::new(&config.server.data_dir);
    for p in &config.providers {
        if p.kind != ProviderKind::Local || p.model_path.as_deref().is_some_and(|s| !s.is_empty()) {
            continue;
        }
        let Some(known) = catalog::known(&p.model) else {
            continue;
        };
        if catalog::find_local(known, data_dir).is_some() {
            continue;
        }
        eprintln!(
            "keel: first use of the local model {} — fetching it once ({} MB) into {}",
            known.name,
            known.size_bytes / 1_000_000,
            catalog::models_dir(data_dir).display()
        );
        crate::model_cmd::fetch_known(known, data_dir).await?;
    }
    Ok(())
}
