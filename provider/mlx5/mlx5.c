/* softhca's libmlx5.so.1. Programs built against Debian's mlx5dv.h and linked with its
 * libmlx5 get this library instead when `softhca run` puts provider/build first on
 * LD_LIBRARY_PATH: same SONAME, same versioned names (libmlx5.map). Debian's library
 * cannot serve a softhca device, as it casts verbs objects to its own hardware structs.
 *
 * This library keeps no state. The softhca provider, which libibverbs dlopened
 * (RTLD_LOCAL, so its symbols are not in the program's scope), exports one table,
 * `softhca_mlx5dv_ops`; it is found by the provider's SONAME with RTLD_NOLOAD (glibc
 * matches an object already loaded by its SONAME), so this library never loads the
 * provider itself. A device or context is served when the table's owns_device/owns
 * says it is softhca's; otherwise, or when the provider is not loaded, each call
 * answers as its man page says an unsupported device does. Objects made through the
 * table (MKEYs, DEKs, crypto login objects, mlx5dv_qp_ex) can only be softhca's, as
 * no other library in the process makes them under these names. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "mlx5.h"

static const struct softhca_mlx5dv_ops *ops;
static pthread_once_t ops_once = PTHREAD_ONCE_INIT;

static void find_ops(void)
{
	void *h = dlopen(SOFTHCA_PROVIDER_SONAME, RTLD_NOW | RTLD_NOLOAD);
	const struct softhca_mlx5dv_ops *o;

	if (!h)
		return;
	o = dlsym(h, SOFTHCA_MLX5DV_OPS_SYMBOL);
	/* the handle is kept: the provider stays loaded while libibverbs has it anyway */
	if (o && o->version == SOFTHCA_MLX5DV_OPS_VERSION &&
	    o->size >= sizeof(struct softhca_mlx5dv_ops))
		ops = o;
	else if (o)
		fprintf(stderr, "softhca libmlx5: the provider's %s is version %u size %u; "
			"this library needs version %u size %zu (rebuild both: make provider)\n",
			SOFTHCA_MLX5DV_OPS_SYMBOL, o->version, o->size,
			SOFTHCA_MLX5DV_OPS_VERSION, sizeof(struct softhca_mlx5dv_ops));
}

const struct softhca_mlx5dv_ops *shca_dv_ops(void)
{
	/* Looked up again until found: libibverbs loads the provider at the program's
	 * first ibv_get_device_list, which may come after a first mlx5dv call. */
	if (!ops) {
		pthread_once(&ops_once, find_ops);
		if (!ops)
			find_ops();
	}
	return ops;
}

int shca_dv_unsupported(const char *name)
{
	fprintf(stderr, "softhca libmlx5: %s: EOPNOTSUPP: not modelled by softhca\n", name);
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

void *shca_dv_unsupported_ptr(const char *name)
{
	shca_dv_unsupported(name);
	return NULL;
}

/* The table, if `context` is a softhca device's context. */
static const struct softhca_mlx5dv_ops *of_ctx(struct ibv_context *context)
{
	const struct softhca_mlx5dv_ops *o = shca_dv_ops();

	return o && context && o->owns(context) ? o : NULL;
}

/* The table for an object only the table makes (NULL without a provider). */
static const struct softhca_mlx5dv_ops *of_obj(const void *obj)
{
	(void)obj;
	return shca_dv_ops();
}

/* -- device and context -------------------------------------------------------------- */

bool mlx5dv_is_supported(struct ibv_device *device)
{
	const struct softhca_mlx5dv_ops *o = shca_dv_ops();

	return o && device && o->owns_device(device);
}

int mlx5dv_query_device(struct ibv_context *ctx_in, struct mlx5dv_context *attrs_out)
{
	const struct softhca_mlx5dv_ops *o = of_ctx(ctx_in);

	if (!o)
		return shca_dv_unsupported("mlx5dv_query_device");
	if (!attrs_out)
		return EINVAL;
	return o->query_device(ctx_in, attrs_out);
}

/* mlx5dv_open_device(3): on a softhca device, ibv_open_device. DevX (the one context
 * flag) is not modelled. */
struct ibv_context *mlx5dv_open_device(struct ibv_device *device,
				       struct mlx5dv_context_attr *attr)
{
	if (!mlx5dv_is_supported(device))
		return shca_dv_unsupported_ptr("mlx5dv_open_device");
	if (attr && (attr->flags || attr->comp_mask)) {
		fprintf(stderr, "softhca libmlx5: mlx5dv_open_device: EOPNOTSUPP: flags %#x "
			"comp_mask %#llx (DevX) are not modelled\n", attr->flags,
			(unsigned long long)attr->comp_mask);
		errno = EOPNOTSUPP;
		return NULL;
	}
	return ibv_open_device(device);
}

/* -- QPs ---------------------------------------------------------------------------------- */

struct ibv_qp *mlx5dv_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *qp_attr,
				struct mlx5dv_qp_init_attr *mlx5_qp_attr)
{
	const struct softhca_mlx5dv_ops *o = of_ctx(context);

	if (!o)
		return shca_dv_unsupported_ptr("mlx5dv_create_qp");
	return o->create_qp(context, qp_attr, mlx5_qp_attr);
}

struct mlx5dv_qp_ex *mlx5dv_qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *qp)
{
	const struct softhca_mlx5dv_ops *o = qp ? of_ctx(qp->qp_base.context) : NULL;

	if (!o)
		return shca_dv_unsupported_ptr("mlx5dv_qp_ex_from_ibv_qp_ex");
	return o->qp_ex_from_ibv_qp_ex(qp);
}

/* Number of WRs canceled, or -errno (mlx5dv_qp_cancel_posted_send_wrs(3)). */
int mlx5dv_qp_cancel_posted_send_wrs(struct mlx5dv_qp_ex *mqp, uint64_t wr_id)
{
	const struct softhca_mlx5dv_ops *o = of_obj(mqp);

	if (!o)
		return -shca_dv_unsupported("mlx5dv_qp_cancel_posted_send_wrs");
	if (!mqp)
		return -EINVAL;
	return o->qp_cancel_posted_send_wrs(mqp, wr_id);
}

/* mlx5dv_init_obj(3) exposes the hardware queues' memory (WQE buffers, doorbells, UARs),
 * which a softhca device does not have. Two versions, as in rdma-core: MLX5_1.0's and
 * the default MLX5_1.2's, the same call. */
static int init_obj(struct mlx5dv_obj *obj, uint64_t obj_type)
{
	(void)obj;
	(void)obj_type;
	return shca_dv_unsupported("mlx5dv_init_obj");
}

int shca_init_obj_1_0(struct mlx5dv_obj *obj, uint64_t obj_type);
int shca_init_obj_1_2(struct mlx5dv_obj *obj, uint64_t obj_type);
__asm__(".symver shca_init_obj_1_0, mlx5dv_init_obj@MLX5_1.0");
__asm__(".symver shca_init_obj_1_2, mlx5dv_init_obj@@MLX5_1.2");

int shca_init_obj_1_0(struct mlx5dv_obj *obj, uint64_t obj_type)
{
	return init_obj(obj, obj_type);
}

int shca_init_obj_1_2(struct mlx5dv_obj *obj, uint64_t obj_type)
{
	return init_obj(obj, obj_type);
}

/* -- MKEYs ------------------------------------------------------------------------------ */

struct mlx5dv_mkey *mlx5dv_create_mkey(struct mlx5dv_mkey_init_attr *mkey_init_attr)
{
	const struct softhca_mlx5dv_ops *o =
		mkey_init_attr && mkey_init_attr->pd ? of_ctx(mkey_init_attr->pd->context) : NULL;

	if (!o)
		return shca_dv_unsupported_ptr("mlx5dv_create_mkey");
	return o->create_mkey(mkey_init_attr);
}

int mlx5dv_destroy_mkey(struct mlx5dv_mkey *mkey)
{
	const struct softhca_mlx5dv_ops *o = of_obj(mkey);

	if (!o)
		return shca_dv_unsupported("mlx5dv_destroy_mkey");
	if (!mkey)
		return EINVAL;
	return o->destroy_mkey(mkey);
}

int _mlx5dv_mkey_check(struct mlx5dv_mkey *mkey, struct mlx5dv_mkey_err *err_info,
		       size_t err_info_size)
{
	const struct softhca_mlx5dv_ops *o = of_obj(mkey);

	if (!o)
		return shca_dv_unsupported("mlx5dv_mkey_check");
	if (!mkey)
		return EINVAL;
	return o->mkey_check(mkey, err_info, err_info_size);
}

/* -- crypto login and DEKs ------------------------------------------------------------- */

int mlx5dv_crypto_login(struct ibv_context *context, struct mlx5dv_crypto_login_attr *login_attr)
{
	const struct softhca_mlx5dv_ops *o = of_ctx(context);

	if (!o)
		return shca_dv_unsupported("mlx5dv_crypto_login");
	return o->crypto_login(context, login_attr);
}

int mlx5dv_crypto_login_query_state(struct ibv_context *context,
				    enum mlx5dv_crypto_login_state *state)
{
	const struct softhca_mlx5dv_ops *o = of_ctx(context);

	if (!o)
		return shca_dv_unsupported("mlx5dv_crypto_login_query_state");
	return o->crypto_login_query_state(context, state);
}

int mlx5dv_crypto_logout(struct ibv_context *context)
{
	const struct softhca_mlx5dv_ops *o = of_ctx(context);

	if (!o)
		return shca_dv_unsupported("mlx5dv_crypto_logout");
	return o->crypto_logout(context);
}

struct mlx5dv_crypto_login_obj *
mlx5dv_crypto_login_create(struct ibv_context *context,
			   struct mlx5dv_crypto_login_attr_ex *login_attr)
{
	const struct softhca_mlx5dv_ops *o = of_ctx(context);

	if (!o)
		return shca_dv_unsupported_ptr("mlx5dv_crypto_login_create");
	return o->crypto_login_create(context, login_attr);
}

int mlx5dv_crypto_login_query(struct mlx5dv_crypto_login_obj *crypto_login,
			      struct mlx5dv_crypto_login_query_attr *query_attr)
{
	const struct softhca_mlx5dv_ops *o = of_obj(crypto_login);

	if (!o)
		return shca_dv_unsupported("mlx5dv_crypto_login_query");
	if (!crypto_login)
		return EINVAL;
	return o->crypto_login_query(crypto_login, query_attr);
}

int mlx5dv_crypto_login_destroy(struct mlx5dv_crypto_login_obj *crypto_login)
{
	const struct softhca_mlx5dv_ops *o = of_obj(crypto_login);

	if (!o)
		return shca_dv_unsupported("mlx5dv_crypto_login_destroy");
	if (!crypto_login)
		return EINVAL;
	return o->crypto_login_destroy(crypto_login);
}

struct mlx5dv_dek *mlx5dv_dek_create(struct ibv_context *context,
				     struct mlx5dv_dek_init_attr *init_attr)
{
	const struct softhca_mlx5dv_ops *o = of_ctx(context);

	if (!o)
		return shca_dv_unsupported_ptr("mlx5dv_dek_create");
	return o->dek_create(context, init_attr);
}

int mlx5dv_dek_query(struct mlx5dv_dek *dek, struct mlx5dv_dek_attr *attr)
{
	const struct softhca_mlx5dv_ops *o = of_obj(dek);

	if (!o)
		return shca_dv_unsupported("mlx5dv_dek_query");
	if (!dek)
		return EINVAL;
	return o->dek_query(dek, attr);
}

int mlx5dv_dek_destroy(struct mlx5dv_dek *dek)
{
	const struct softhca_mlx5dv_ops *o = of_obj(dek);

	if (!o)
		return shca_dv_unsupported("mlx5dv_dek_destroy");
	if (!dek)
		return EINVAL;
	return o->dek_destroy(dek);
}
