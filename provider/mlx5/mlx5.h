/* softhca's libmlx5.so.1: the mlx5dv_* calls of Debian's mlx5dv.h, served through the
 * softhca provider's bridge (../dv_bridge.h) for softhca devices; see mlx5.c. */
#ifndef SOFTHCA_MLX5_H
#define SOFTHCA_MLX5_H

#include <infiniband/mlx5dv.h>

#include "../dv_bridge.h"

/* The provider's table when the provider is loaded, else NULL. */
const struct softhca_mlx5dv_ops *shca_dv_ops(void);
/* An unmodelled call: logged; errno = EOPNOTSUPP; returns EOPNOTSUPP / NULL. */
int shca_dv_unsupported(const char *name);
void *shca_dv_unsupported_ptr(const char *name);

#endif
