//! `cargo run -p keel-config --example check -- FILE`: what `keel check` prints.
fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: check FILE");
        std::process::exit(2);
    };
    let result = keel_config::load_file(std::path::Path::new(&path), &keel_config::ProcessEnv);
    print!("{}", keel_config::render_report(&path, &result));
    std::process::exit(i32::from(result.is_err()));
}
