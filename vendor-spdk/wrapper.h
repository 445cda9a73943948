/*
 * The SPDK API the rtrs plugin uses, for bindgen (build.rs, `spdk` feature).
 * Tested against SPDK v25.09 built with shared libraries (see VERSION).
 * No SPDK source lives in this repository: headers come from $SPDK_DIR/include.
 */
#include <spdk/stdinc.h>
#include <spdk/env.h>
#include <spdk/thread.h>
#include <spdk/bdev.h>
#include <spdk/bdev_module.h>
#include <spdk/accel.h>
#include <spdk/json.h>
#include <spdk/jsonrpc.h>
#include <spdk/keyring.h>
#include <spdk/rpc.h>
#include <spdk/log.h>
#include <spdk/util.h>
#include <spdk/string.h>
