/work/main/bench/keel-driver/target/release/deps/pin_project_lite-a58b5c6d87f9b168.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/pin-project-lite-0.2.17/src/lib.rs

/work/main/bench/keel-driver/target/release/deps/libpin_project_lite-a58b5c6d87f9b168.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/pin-project-lite-0.2.17/src/lib.rs

/work/main/bench/keel-driver/target/release/deps/libpin_project_lite-a58b5c6d87f9b168.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/pin-project-lite-0.2.17/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/pin-project-lite-0.2.17/src/lib.rs:
