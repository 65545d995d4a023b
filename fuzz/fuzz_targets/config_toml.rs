//! `keel.toml` as `keel check` and `keel serve` load it, with `KEEL_*`
//! overrides: lines after a `# env:` line are `NAME=VALUE` variables.
#![no_main]

use keel_config::{MapEnv, load_str, render_report};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env: MapEnv = match text.split_once("\n# env:\n") {
        Some((_, vars)) => vars
            .lines()
            .filter_map(|l| l.trim_start_matches('#').trim().split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        None => MapEnv::new(),
    };
    let result = load_str(text, "keel.toml", &env);
    let report = render_report("keel.toml", &result);
    if let Err(errors) = &result {
        assert!(!errors.0.is_empty(), "an error without a problem");
        assert!(!report.is_empty());
    }
    let Ok(loaded) = result else {
        return;
    };
    // A loaded configuration, written out again, loads to the same thing.
    let Ok(written) = toml::to_string(&loaded.config) else {
        return;
    };
    match load_str(&written, "written.toml", &MapEnv::new()) {
        Ok(again) => assert_eq!(again.config, loaded.config, "{written}"),
        Err(e) => panic!("{written}\ndoes not load again:\n{e}"),
    }
});
