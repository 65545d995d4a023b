//! The `exec` tool's sandbox helper as a program of its own (the `keel`
//! binary carries the same helper as `keel __exec-sandbox`).

fn main() -> std::process::ExitCode {
    keel_tools::exec::sandbox_main(std::env::args_os().skip(1).collect())
}
