/* mlx5dv_wr_set_mkey_sig_block(3), example 2: the target's MKEY has a T10-DIF wire
 * domain on 4096-byte blocks (bg 0xffff, app tag 0x5a5a, ref tag 0x1000, REF_REMAP) and
 * no memory domain. The initiator RDMA_READs it: each 4 KiB of plain data comes with a
 * T10-DIF the device generated, which the initiator checks against its own. */
#include "cex.h"

#include <stdio.h>
#include <string.h>

#define BLOCKS 4
#define BLK 4096
#define PI 8
#define SEED 2
#define BG 0xffff
#define APP 0x5a5a
#define REF 0x1000

static void target(struct cex *c)
{
	uint8_t *mem = cex_alloc(BLOCKS * BLK), *before = cex_alloc(BLOCKS * BLK);
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

	cex_pattern(mem, BLOCKS * BLK, SEED);
	memcpy(before, mem, BLOCKS * BLK);
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
	cex_image("target_memory", mem, BLOCKS * BLK);
	/* Offered to the initiator: the MKEY, zero based, as long as its wire image. */
	cex_barrier(c, "read");
	e = cex_mkey_check(c, "after_read", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "mkey_check finds nothing");
	cex_check(c, !memcmp(mem, before, BLOCKS * BLK), "being read left the memory as it was");
	mlx5dv_destroy_mkey(mkey);
	ibv_dereg_mr(mr);
}

static void initiator(struct cex *c)
{
	uint8_t *buf = cex_alloc(BLOCKS * (BLK + PI)), *data = cex_alloc(BLOCKS * BLK);
	struct ibv_mr *mr = cex_reg_mr(c, buf, BLOCKS * (BLK + PI));
	size_t b;
	int same = 1;

	cex_pattern(data, BLOCKS * BLK, SEED);
	cex_connect(c, 0, 0, 0);
	cex_barrier(c, "configured");
	cex_rdma_read(c, mr->lkey, (uintptr_t)buf, BLOCKS * (BLK + PI), c->peer.rkey,
		      c->peer.addr);
	cex_image("initiator_memory", buf, BLOCKS * (BLK + PI));
	for (b = 0; b < BLOCKS; b++)
		same &= !memcmp(buf + b * (BLK + PI), data + b * BLK, BLK);
	cex_check(c, same, "each 4096 bytes of the target's data arrived");
	cex_check_dif(c, "initiator_memory", buf, BLOCKS, BLK, BG, APP, REF);
	cex_barrier(c, "read");
	ibv_dereg_mr(mr);
}

int main(int argc, char **argv)
{
	return cex_main(argc, argv, target, initiator);
}
