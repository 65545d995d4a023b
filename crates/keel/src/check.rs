use std::path::Path;
use std::process::ExitCode;

use keel_config::ProcessEnv;

/// `keel check`: every problem of the file, one per line.
pub fn check(config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let path = match crate::app::resolve_source(config) {
        crate::app::Source::File(p) => p,
        crate::app::Source::Defaults => {
            anyhow::bail!("no configuration file: pass --config FILE (or set KEEL_CONFIG)")
        }
    };
    let result = keel_config::load_file(&path, &ProcessEnv);
    let origin = path.display().to_string();
    print!("{}", keel_config::render_report(&origin, &result));
    Ok(if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
