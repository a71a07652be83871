/* The bridge between softhca's preload library (provider/preload/, LD_PRELOAD'ed by
 * `softhca run`) and the provider: completion channels. libibverbs makes a channel
 * itself, by a command written to the device node, and takes the kernel's answer as its
 * fd; softhca's device node is the null device, which answers nothing. The preload
 * library defines ibv_create_comp_channel / ibv_destroy_comp_channel in libibverbs'
 * place and, for a softhca context, calls this table, which the provider exports as
 * `softhca_channel_ops` (found by the provider's SONAME with RTLD_NOLOAD, as libmlx5
 * finds its table). Any other context gets libibverbs' own functions.
 *
 * The table grows only at its end: `size` tells the preload library which members a
 * provider has, `version` changes only if a member's meaning does. */
#ifndef SOFTHCA_CHAN_BRIDGE_H
#define SOFTHCA_CHAN_BRIDGE_H

#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#ifndef SOFTHCA_PROVIDER_SONAME
#define SOFTHCA_PROVIDER_SONAME "libsofthca-rdmav34.so"
#endif
#define SOFTHCA_CHANNEL_OPS_SYMBOL "softhca_channel_ops"
#define SOFTHCA_CHANNEL_OPS_VERSION 1

struct softhca_channel_ops {
	uint32_t version;
	uint32_t size;           /* sizeof(struct softhca_channel_ops) of the provider */
	bool (*owns)(struct ibv_context *context);
	/* As ibv_create_comp_channel(3) / ibv_destroy_comp_channel(3): NULL with errno
	 * set; 0 or an errno value. Only given softhca contexts and their channels. */
	struct ibv_comp_channel *(*create)(struct ibv_context *context);
	int (*destroy)(struct ibv_comp_channel *channel);
};

#endif
