/* softhca's preload library (LD_PRELOAD'ed by `softhca run`, and by the softhca image's
 * environment): ibv_create_comp_channel and ibv_destroy_comp_channel in libibverbs'
 * place, under libibverbs' own versioned names (preload.map), so that a completion
 * channel of a softhca context has a real fd from its creation on (chan_bridge.h says
 * why libibverbs' own cannot). Any other context, or a process in which the provider is
 * not loaded, gets libibverbs' functions.
 *
 * The library links no libibverbs: every process `softhca run` starts loads it, most of
 * them no verbs programs. It starts no thread and keeps no state beyond the two lookups
 * below; libibverbs is found where it is already loaded (RTLD_NOLOAD), which also serves
 * programs that load it RTLD_LOCAL through a plugin (UCX's transports). */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>

#include "../chan_bridge.h"

#define VERBS_SONAME "libibverbs.so.1"
#define VERBS_VERSION "IBVERBS_1.0"

static const struct softhca_channel_ops *ops;

static const struct softhca_channel_ops *channel_ops(void)
{
	const struct softhca_channel_ops *o = __atomic_load_n(&ops, __ATOMIC_ACQUIRE);
	void *h;

	if (o)
		return o;
	/* Looked up until found: libibverbs loads the provider at the program's first
	 * ibv_get_device_list. The handle is kept, as libibverbs keeps the provider. */
	h = dlopen(SOFTHCA_PROVIDER_SONAME, RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		return NULL;
	o = dlsym(h, SOFTHCA_CHANNEL_OPS_SYMBOL);
	if (o && (o->version != SOFTHCA_CHANNEL_OPS_VERSION ||
		  o->size < sizeof(struct softhca_channel_ops))) {
		fprintf(stderr, "softhca preload: the provider's %s is version %u size %u; "
			"this library needs version %u size %zu (rebuild both: make provider)\n",
			SOFTHCA_CHANNEL_OPS_SYMBOL, o->version, o->size,
			SOFTHCA_CHANNEL_OPS_VERSION, sizeof(struct softhca_channel_ops));
		o = NULL;
	}
	if (!o) {
		dlclose(h);
		return NULL;
	}
	__atomic_store_n(&ops, o, __ATOMIC_RELEASE);
	return o;
}

/* libibverbs' own definition of `name`. */
static void *verbs_fn(const char *name)
{
	void *h = dlopen(VERBS_SONAME, RTLD_NOW | RTLD_NOLOAD), *f;

	if (!h)
		return NULL;
	f = dlvsym(h, name, VERBS_VERSION);
	/* libibverbs stays loaded while a context of it exists, which the caller has */
	dlclose(h);
	return f;
}

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	const struct softhca_channel_ops *o = channel_ops();
	struct ibv_comp_channel *(*f)(struct ibv_context *);

	if (o && o->owns(context))
		return o->create(context);
	f = (struct ibv_comp_channel *(*)(struct ibv_context *))verbs_fn(
		"ibv_create_comp_channel");
	if (!f) {
		errno = ENOSYS;
		return NULL;
	}
	return f(context);
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	const struct softhca_channel_ops *o = channel_ops();
	int (*f)(struct ibv_comp_channel *);

	if (o && channel && o->owns(channel->context))
		return o->destroy(channel);
	f = (int (*)(struct ibv_comp_channel *))verbs_fn("ibv_destroy_comp_channel");
	return f ? f(channel) : ENOSYS;
}
