/* mlx5dv_wr_set_mkey_sig_block(3), example 2.1: the same MKEY as example 2 (T10-DIF
 * wire domain on 4096-byte blocks, no memory domain). The initiator RDMA_WRITEs each
 * 4 KiB followed by the T10-DIF it computed itself; the device validates each, strips
 * it and the target's memory gets the data alone. */
#include "cex.h"

#include <stdio.h>
#include <string.h>

#define BLOCKS 4
#define BLK 4096
#define PI 8
#define SEED 21
#define BG 0xffff
#define APP 0x5a5a
#define REF 0x1000

static void target(struct cex *c)
{
	uint8_t *mem = cex_alloc(BLOCKS * BLK), *data = cex_alloc(BLOCKS * BLK);
	const struct mlx5dv_sig_t10dif dif = {
		.bg_type = MLX5DV_SIG_T10DIF_CRC, .bg = BG, .app_tag = APP, .ref_tag = REF,
		.flags = MLX5DV_SIG_T10DIF_FLAG_REF_REMAP,
	};
	const struct mlx5dv_sig_block_domain wire = {
		.sig_type = MLX5DV_SIG_TYPE_T10DIF, .sig.dif = &dif,
		.block_size = MLX5DV_BLOCK_SIZE_4096,
	};
	const struct mlx5dv_sig_block_attr sig = { .mem = NULL, .wire = &wire, .check_mask = 0xff };
	struct mlx5dv_mkey *mkey;
	struct mlx5dv_mkey_err e;
	struct ibv_mr *mr;
	struct ibv_sge sge;

	cex_pattern(data, BLOCKS * BLK, SEED);
	mr = cex_reg_mr(c, mem, BLOCKS * BLK);
	mkey = cex_create_mkey(c, MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
			       MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE, 1);
	sge = (struct ibv_sge){ .addr = (uintptr_t)mem, .length = BLOCKS * BLK, .lkey = mr->lkey };
	cex_connect(c, mkey->rkey, 0, BLOCKS * (BLK + PI));
	/* a configure WR needs the QP in RTS; the peer waits for it */
	cex_configure(c, mkey, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
		      IBV_ACCESS_REMOTE_WRITE,
		      &(struct cex_layout){ .num_sges = 1, .sges = &sge }, &sig, NULL);
	cex_barrier(c, "configured");
	/* The writer's completion says nothing to the target: the initiator tells it. */
	cex_barrier(c, "written");
	cex_image("target_memory", mem, BLOCKS * BLK);
	cex_check(c, !memcmp(mem, data, BLOCKS * BLK), "memory holds the data alone, T10-DIF "
		  "stripped");
	e = cex_mkey_check(c, "after_write", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "every T10-DIF that arrived was valid");
	cex_barrier(c, "checked");
	mlx5dv_destroy_mkey(mkey);
	ibv_dereg_mr(mr);
}

static void initiator(struct cex *c)
{
	uint8_t *img = cex_alloc(BLOCKS * (BLK + PI)), *data = cex_alloc(BLOCKS * BLK);
	struct ibv_mr *mr = cex_reg_mr(c, img, BLOCKS * (BLK + PI));
	size_t b;

	/* the target's data (the same pattern), each block followed by its T10-DIF */
	cex_pattern(data, BLOCKS * BLK, SEED);
	for (b = 0; b < BLOCKS; b++) {
		uint8_t *p = img + b * (BLK + PI);

		memcpy(p, data + b * BLK, BLK);
		cex_t10dif_pi(p + BLK, p, BLK, BG, APP, REF + (uint32_t)b);
	}
	cex_connect(c, 0, 0, 0);
	cex_barrier(c, "configured");
	cex_image("initiator_memory", img, BLOCKS * (BLK + PI));
	cex_rdma_write(c, mr->lkey, (uintptr_t)img, BLOCKS * (BLK + PI), c->peer.rkey,
		       c->peer.addr);
	cex_barrier(c, "written");
	cex_barrier(c, "checked");
	ibv_dereg_mr(mr);
}

int main(int argc, char **argv)
{
	return cex_main(argc, argv, target, initiator);
}
