/work/main/bench/keel-driver/target/release/deps/stable_deref_trait-c814c83cddb923cc.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/stable_deref_trait-1.2.1/src/lib.rs

/work/main/bench/keel-driver/target/release/deps/libstable_deref_trait-c814c83cddb923cc.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/stable_deref_trait-1.2.1/src/lib.rs

/work/main/bench/keel-driver/target/release/deps/libstable_deref_trait-c814c83cddb923cc.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/stable_deref_trait-1.2.1/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/stable_deref_trait-1.2.1/src/lib.rs:
