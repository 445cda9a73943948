/*
 * The C part of the rtrs SPDK plugin: only SPDK's registration macros, which expand to
 * constructors and static structures. Every function named here is implemented in Rust
 * (plugin/src): the bdev module hooks in bdev/, the target subsystem and every RPC
 * handler in target/ and bdev/.
 */
#include <spdk/stdinc.h>
#include <spdk/bdev_module.h>
#include <spdk/rpc.h>
#include <spdk/json.h>
#include <spdk_internal/init.h>

/* ---- the rtrs bdev module (client side, plugin/src/bdev) ---- */
extern int rtrs_bdev_module_init(void);
extern void rtrs_bdev_module_fini(void);
extern int rtrs_bdev_module_config_json(struct spdk_json_write_ctx *w);
extern int rtrs_bdev_module_ctx_size(void);

static struct spdk_bdev_module g_rtrs_bdev_module = {
	.name = "rtrs",
	.module_init = rtrs_bdev_module_init,
	.module_fini = rtrs_bdev_module_fini,
	.config_json = rtrs_bdev_module_config_json,
	.get_ctx_size = rtrs_bdev_module_ctx_size,
	/* module_fini waits for disks still closing; it calls spdk_bdev_module_fini_done. */
	.async_fini = true,
};

SPDK_BDEV_MODULE_REGISTER(rtrs, &g_rtrs_bdev_module)

/* The module's address, for Rust (spdk_bdev_register needs it in bdev->module). */
struct spdk_bdev_module *
rtrs_bdev_module(void)
{
	return &g_rtrs_bdev_module;
}

/* ---- the RTRS target (server side, plugin/src/target) ---- */
extern void rtrs_target_subsystem_init(void);
extern void rtrs_target_subsystem_fini(void (*done)(void));
extern void rtrs_target_write_config_json(struct spdk_json_write_ctx *w);

static void
rtrs_target_init(void)
{
	rtrs_target_subsystem_init();
	spdk_subsystem_init_next(0);
}

static void
rtrs_target_fini(void)
{
	rtrs_target_subsystem_fini(spdk_subsystem_fini_next);
}

static struct spdk_subsystem g_rtrs_target_subsystem = {
	.name = "rtrs_target",
	.init = rtrs_target_init,
	.fini = rtrs_target_fini,
	.write_config_json = rtrs_target_write_config_json,
};

SPDK_SUBSYSTEM_REGISTER(g_rtrs_target_subsystem);
SPDK_SUBSYSTEM_DEPEND(rtrs_target, bdev)
/* Listener keys come from the keyring: its keys are loaded (and replayed) first. */
SPDK_SUBSYSTEM_DEPEND(rtrs_target, keyring)

/*
 * RPC methods: Rust registers every method (target and bdev) with
 * spdk_rpc_register_method from this constructor, at the same priority as
 * SPDK_RPC_REGISTER, so both sides add methods without touching this file.
 */
extern void rtrs_register_rpcs(void);

__attribute__((constructor(1000))) static void
rtrs_rpc_register(void)
{
	rtrs_register_rpcs();
}
