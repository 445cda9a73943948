//! Build script. The default build needs nothing from here. With the `spdk` feature it
//! generates Rust bindings for the SPDK API the plugin uses, from the wrapper header in
//! `vendor-spdk/` and the SPDK installation named by `SPDK_DIR` (the project never
//! vendors, patches or builds SPDK).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "spdk")]
    spdk::generate();
}

#[cfg(feature = "spdk")]
mod spdk {
    use std::env;
    use std::path::PathBuf;

    pub fn generate() {
        println!("cargo:rerun-if-env-changed=SPDK_DIR");
        println!("cargo:rerun-if-changed=vendor-spdk/wrapper.h");
        let dir = env::var_os("SPDK_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                panic!(
                    "the `spdk` feature needs SPDK_DIR: the prefix of an SPDK installation \
                 (tested version in vendor-spdk/VERSION), e.g. SPDK_DIR=/opt/spdk"
                )
            });
        let include = dir.join("include");
        if !include.join("spdk/bdev_module.h").exists() {
            panic!(
                "SPDK_DIR={}: no include/spdk/bdev_module.h there; point SPDK_DIR at an \
                 SPDK install prefix (make install) or a built source tree",
                dir.display()
            );
        }
        for lib in ["lib", "build/lib"] {
            let p = dir.join(lib);
            if p.is_dir() {
                println!("cargo:rustc-link-search=native={}", p.display());
            }
        }
        let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("spdk_bindings.rs");
        bindgen::Builder::default()
            .header("vendor-spdk/wrapper.h")
            .clang_arg(format!("-I{}", include.display()))
            .allowlist_function("spdk_.*")
            .allowlist_type("spdk_.*")
            .allowlist_var("SPDK_.*")
            .derive_default(true)
            .layout_tests(false)
            .generate()
            .unwrap_or_else(|e| panic!("bindgen over vendor-spdk/wrapper.h failed: {e}"))
            .write_to_file(&out)
            .unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    }
}
