/* mlx5dv_wr_set_mkey_sig_block(3), example 1: the target's memory holds 512-byte
 * blocks each followed by its CRC32; a SEND with the MKEY as the local key validates
 * every CRC32, strips it and sends the data alone. The initiator RECVs plain data.
 * Then one stored CRC32 is damaged and the SEND repeated: the data still moves and
 * mlx5dv_mkey_check(3) reports a bad guard at that block. */
#include "cex.h"

#include <stdio.h>
#include <string.h>

#define BLOCKS 8
#define BLK 512
#define PI 4
#define SEED 1
#define BAD_BLOCK 3

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
	uint32_t stored, want;
	size_t b;
	uint8_t *p;

	cex_pattern(data, BLOCKS * BLK, SEED);
	for (b = 0; b < BLOCKS; b++) {
		uint32_t v = cex_crc32(0xffffffff, data + b * BLK, BLK);

		p = mem + b * (BLK + PI);
		memcpy(p, data + b * BLK, BLK);
		p[BLK] = v >> 24;
		p[BLK + 1] = (v >> 16) & 0xff;
		p[BLK + 2] = (v >> 8) & 0xff;
		p[BLK + 3] = v & 0xff;
	}
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
	cex_image("target_memory", mem, BLOCKS * (BLK + PI));

	cex_barrier(c, "recv posted");
	/* The MKEY is zero based; the SGE length counts the wire's bytes. */
	cex_send(c, mkey->lkey, 0, BLOCKS * BLK);
	cex_barrier(c, "sent");
	e = cex_mkey_check(c, "clean", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "every CRC32 in memory was valid");

	p = mem + BAD_BLOCK * (BLK + PI) + BLK;
	p[0] ^= 0x01;
	stored = cex_be32(p);
	want = cex_crc32(0xffffffff, data + BAD_BLOCK * BLK, BLK);
	printf("tamper block %d: stored CRC32 0x%08x, the data's 0x%08x\n", BAD_BLOCK, stored,
	       want);
	cex_image("target_memory_tampered", mem, BLOCKS * (BLK + PI));
	cex_barrier(c, "recv posted again");
	cex_send(c, mkey->lkey, 0, BLOCKS * BLK);
	cex_barrier(c, "sent again");
	e = cex_mkey_check(c, "tampered", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD &&
		  e.err.sig.actual_value == want && e.err.sig.expected_value == stored &&
		  e.err.sig.offset == BAD_BLOCK * (BLK + PI),
		  "bad guard at block %d: actual (computed) 0x%08x, expected (stored) 0x%08x, "
		  "offset %d", BAD_BLOCK, want, stored, BAD_BLOCK * (BLK + PI));
	mlx5dv_destroy_mkey(mkey);
	ibv_dereg_mr(mr);
}

static void initiator(struct cex *c)
{
	uint8_t *want = cex_alloc(BLOCKS * BLK), *buf = cex_alloc(BLOCKS * BLK);
	struct ibv_mr *mr = cex_reg_mr(c, buf, BLOCKS * BLK);
	int round;

	cex_pattern(want, BLOCKS * BLK, SEED);
	cex_connect(c, 0, 0, 0);
	cex_barrier(c, "configured");
	for (round = 0; round < 2; round++) {
		memset(buf, 0, BLOCKS * BLK);
		cex_post_recv(c, mr->lkey, (uintptr_t)buf, BLOCKS * BLK);
		cex_barrier(c, round ? "recv posted again" : "recv posted");
		cex_wait_recv(c, BLOCKS * BLK);
		cex_barrier(c, round ? "sent again" : "sent");
		cex_image(round ? "initiator_memory_again" : "initiator_memory", buf, BLOCKS * BLK);
		cex_check(c, !memcmp(buf, want, BLOCKS * BLK),
			  "received the %d bytes of data alone, CRC32s stripped%s", BLOCKS * BLK,
			  round ? " (a bad CRC32 is no transport error)" : "");
	}
	ibv_dereg_mr(mr);
}

int main(int argc, char **argv)
{
	return cex_main(argc, argv, target, initiator);
}
