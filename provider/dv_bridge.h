/* The bridge between softhca's libmlx5.so.1 (provider/mlx5/) and the provider
 * (libsofthca-rdmav34.so): one table of functions the provider exports as
 * `softhca_mlx5dv_ops`. libmlx5 finds the provider, which libibverbs dlopened
 * RTLD_LOCAL, by its SONAME (dlopen RTLD_NOLOAD), and each mlx5dv_* call on a softhca
 * object goes through the table. The verbs objects, the ibv_wr_* batch and the daemon
 * connection all live in the provider; libmlx5 keeps no state of its own.
 *
 * The table grows only at its end: `size` tells libmlx5 which members a provider has,
 * `version` changes only if a member's meaning does. */
#ifndef SOFTHCA_DV_BRIDGE_H
#define SOFTHCA_DV_BRIDGE_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/mlx5dv.h>

#define SOFTHCA_PROVIDER_SONAME "libsofthca-rdmav34.so"
#define SOFTHCA_MLX5DV_OPS_SYMBOL "softhca_mlx5dv_ops"
#define SOFTHCA_MLX5DV_OPS_VERSION 1

struct softhca_mlx5dv_ops {
	uint32_t version;
	uint32_t size;           /* sizeof(struct softhca_mlx5dv_ops) of the provider */
	/* Whether a device / a context is one of softhca's. */
	bool (*owns_device)(struct ibv_device *device);
	bool (*owns)(struct ibv_context *context);
	/* The calls, as mlx5dv.h declares them (their man pages' return conventions). The
	 * object-taking ones are only given objects this table made. */
	int (*query_device)(struct ibv_context *context, struct mlx5dv_context *attrs);
	struct ibv_qp *(*create_qp)(struct ibv_context *context,
				    struct ibv_qp_init_attr_ex *qp_attr,
				    struct mlx5dv_qp_init_attr *mlx5_qp_attr);
	struct mlx5dv_qp_ex *(*qp_ex_from_ibv_qp_ex)(struct ibv_qp_ex *qp);
	int (*qp_cancel_posted_send_wrs)(struct mlx5dv_qp_ex *mqp, uint64_t wr_id);
	struct mlx5dv_mkey *(*create_mkey)(struct mlx5dv_mkey_init_attr *attr);
	int (*destroy_mkey)(struct mlx5dv_mkey *mkey);
	int (*mkey_check)(struct mlx5dv_mkey *mkey, struct mlx5dv_mkey_err *err_info,
			  size_t err_info_size);
	int (*crypto_login)(struct ibv_context *context,
			    struct mlx5dv_crypto_login_attr *login_attr);
	int (*crypto_login_query_state)(struct ibv_context *context,
					enum mlx5dv_crypto_login_state *state);
	int (*crypto_logout)(struct ibv_context *context);
	struct mlx5dv_crypto_login_obj *(*crypto_login_create)(
		struct ibv_context *context, struct mlx5dv_crypto_login_attr_ex *login_attr);
	int (*crypto_login_query)(struct mlx5dv_crypto_login_obj *crypto_login,
				  struct mlx5dv_crypto_login_query_attr *query_attr);
	int (*crypto_login_destroy)(struct mlx5dv_crypto_login_obj *crypto_login);
	struct mlx5dv_dek *(*dek_create)(struct ibv_context *context,
					 struct mlx5dv_dek_init_attr *init_attr);
	int (*dek_query)(struct mlx5dv_dek *dek, struct mlx5dv_dek_attr *attr);
	int (*dek_destroy)(struct mlx5dv_dek *dek);
};

#endif
