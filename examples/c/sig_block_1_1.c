/* mlx5dv_wr_set_mkey_sig_block(3), example 1.1: a RECV with the same kind of MKEY as
 * example 1 (memory domain CRC32 on 512-byte blocks, no wire domain) as the SGE: the
 * initiator SENDs plain data and the target's memory gets each 512 bytes followed by a
 * CRC32 the device generated. The target checks each CRC32 against its own. */
#include "cex.h"

#include <stdio.h>
#include <string.h>

#define BLOCKS 8
#define BLK 512
#define PI 4
#define SEED 11

static void target(struct cex *c)
{
	uint8_t *data = cex_alloc(BLOCKS * BLK), *mem = cex_alloc(BLOCKS * (BLK + PI));
	const struct mlx5dv_sig_crc crc = { .type = MLX5DV_SIG_CRC_TYPE_CRC32, .seed = 0xffffffff };
	const struct mlx5dv_sig_block_domain dom = {
		.sig_type = MLX5DV_SIG_TYPE_CRC, .sig.crc = &crc, .block_size = MLX5DV_BLOCK_SIZE_512,
	};
	const struct mlx5dv_sig_block_attr sig = {
		.mem = &dom, .wire = NULL, .check_mask = MLX5DV_SIG_MASK_CRC32,
	};
	struct mlx5dv_mkey *mkey;
	struct mlx5dv_mkey_err e;
	struct ibv_mr *mr;
	struct ibv_sge sge;
	int bad = 0;
	size_t b;

	cex_pattern(data, BLOCKS * BLK, SEED);
	mr = cex_reg_mr(c, mem, BLOCKS * (BLK + PI));
	mkey = cex_create_mkey(c, MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
			       MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE, 1);
	sge = (struct ibv_sge){ .addr = (uintptr_t)mem, .length = BLOCKS * (BLK + PI),
				.lkey = mr->lkey };
	cex_connect(c, 0, 0, 0);
	/* a configure WR needs the QP in RTS; the peer waits for it */
	cex_configure(c, mkey, IBV_ACCESS_LOCAL_WRITE,
		      &(struct cex_layout){ .num_sges = 1, .sges = &sge }, &sig, NULL);
	cex_barrier(c, "configured");
	/* The RECV's SGE names the MKEY from 0; its length counts the wire's bytes. */
	cex_post_recv(c, mkey->lkey, 0, BLOCKS * BLK);
	cex_barrier(c, "recv posted");
	cex_wait_recv(c, BLOCKS * BLK);
	cex_image("target_memory", mem, BLOCKS * (BLK + PI));
	for (b = 0; b < BLOCKS; b++) {
		const uint8_t *p = mem + b * (BLK + PI);
		uint32_t want = cex_crc32(0xffffffff, data + b * BLK, BLK);

		printf("block target_memory %zu crc32=0x%08x %s\n", b, cex_be32(p + BLK),
		       cex_be32(p + BLK) == want && !memcmp(p, data + b * BLK, BLK) ? "ok" : "BAD");
		bad += cex_be32(p + BLK) != want || memcmp(p, data + b * BLK, BLK);
	}
	cex_check(c, bad == 0, "memory holds each 512 bytes of data then its CRC32 (computed here)");
	e = cex_mkey_check(c, "after_recv", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "mkey_check finds nothing");
	cex_barrier(c, "checked");
	mlx5dv_destroy_mkey(mkey);
	ibv_dereg_mr(mr);
}

static void initiator(struct cex *c)
{
	uint8_t *data = cex_alloc(BLOCKS * BLK);
	struct ibv_mr *mr = cex_reg_mr(c, data, BLOCKS * BLK);

	cex_pattern(data, BLOCKS * BLK, SEED);
	cex_connect(c, 0, 0, 0);
	cex_barrier(c, "configured");
	cex_image("initiator_memory", data, BLOCKS * BLK);
	cex_barrier(c, "recv posted");
	cex_send(c, mr->lkey, (uintptr_t)data, BLOCKS * BLK);
	cex_barrier(c, "checked");
	ibv_dereg_mr(mr);
}

int main(int argc, char **argv)
{
	return cex_main(argc, argv, target, initiator);
}
