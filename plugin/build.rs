//! Builds `shim.c`, the few lines of C that hold SPDK's registration macros (RPC methods,
//! the `rtrs` bdev module, the `rtrs_target` subsystem), against `$SPDK_DIR/include`.
//! SPDK itself is not linked: the host application provides its symbols at load time.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=shim.c");
    println!("cargo:rerun-if-env-changed=SPDK_DIR");
    let dir = env::var_os("SPDK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "the plugin needs SPDK_DIR: an SPDK install prefix or built source tree \
             (tested version in vendor-spdk/VERSION), e.g. SPDK_DIR=/opt/spdk"
            )
        });
    let include = dir.join("include");
    if !include.join("spdk_internal/init.h").exists() {
        panic!(
            "SPDK_DIR={}: include/spdk_internal/init.h not found (the subsystem registration \
             needs it; a built source tree has it, an install prefix may not)",
            dir.display()
        );
    }
    cc::Build::new()
        .file("shim.c")
        .include(&include)
        .flag_if_supported("-Wno-unused-parameter")
        // The shim's constructors are referenced by nothing: keep the whole object.
        .link_lib_modifier("+whole-archive")
        .compile("rtrs_spdk_shim");
}
