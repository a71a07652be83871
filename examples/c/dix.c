/* DIX through an interleaved layout (mlx5dv_wr_mkey_configure(3)'s interleaved data
 * layout with mlx5dv_wr_set_mkey_sig_block(3)): the target keeps its data and its
 * T10-DIFs in two buffers, and an MKEY that takes 512 bytes from the data buffer, then
 * 8 from the PI buffer, 16 times, shows them as one memory domain of 520-byte blocks
 * (T10-DIF: guard seed 0, app tag 0x0d1c, ref tag 7, REF_REMAP; no wire domain). The
 * initiator RDMA_WRITEs plain data: the data buffer gets it and the PI buffer the
 * T10-DIFs, packed, which the target checks against its own. The initiator RDMA_READs
 * it back (the PIs checked and stripped). Then the target damages block 9's ref tag
 * in the PI buffer, the initiator reads again, and mlx5dv_mkey_check reports it. */
#include "cex.h"

#include <stdio.h>
#include <string.h>

#define BLOCKS 16
#define BLK 512
#define PI 8
#define SEED 501
#define BG 0
#define APP 0x0d1c
#define REF 7
#define BAD_BLOCK 9
#define BAD_REF 0xbad

static void target(struct cex *c)
{
	uint8_t *dbuf = cex_alloc(BLOCKS * BLK), *pbuf = cex_alloc(BLOCKS * PI);
	uint8_t *data = cex_alloc(BLOCKS * BLK), *joined = cex_alloc(BLOCKS * (BLK + PI));
	const struct mlx5dv_sig_t10dif dif = {
		.bg_type = MLX5DV_SIG_T10DIF_CRC, .bg = BG, .app_tag = APP, .ref_tag = REF,
		.flags = MLX5DV_SIG_T10DIF_FLAG_REF_REMAP,
	};
	const struct mlx5dv_sig_block_domain mem = {
		.sig_type = MLX5DV_SIG_TYPE_T10DIF, .sig.dif = &dif,
		.block_size = MLX5DV_BLOCK_SIZE_512,
	};
	const struct mlx5dv_sig_block_attr sig = { .mem = &mem, .wire = NULL, .check_mask = 0xff };
	struct mlx5dv_mr_interleaved il[2];
	struct ibv_mr *dmr, *pmr;
	struct mlx5dv_mkey *mkey;
	struct mlx5dv_mkey_err e;
	size_t b;

	cex_pattern(data, BLOCKS * BLK, SEED);
	dmr = cex_reg_mr(c, dbuf, BLOCKS * BLK);
	pmr = cex_reg_mr(c, pbuf, BLOCKS * PI);
	/* an interleaved layout of two entries takes three: one for its header */
	mkey = cex_create_mkey(c, MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
			       MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE, 3);
	il[0] = (struct mlx5dv_mr_interleaved){ .addr = (uintptr_t)dbuf, .bytes_count = BLK,
						.bytes_skip = 0, .lkey = dmr->lkey };
	il[1] = (struct mlx5dv_mr_interleaved){ .addr = (uintptr_t)pbuf, .bytes_count = PI,
						.bytes_skip = 0, .lkey = pmr->lkey };
	cex_connect(c, mkey->rkey, 0, BLOCKS * BLK);
	/* a configure WR needs the QP in RTS; the peer waits for it */
	cex_configure(c, mkey, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
		      IBV_ACCESS_REMOTE_WRITE,
		      &(struct cex_layout){ .repeat_count = BLOCKS, .num_interleaved = 2,
					    .interleaved = il }, &sig, NULL);
	cex_barrier(c, "configured");
	cex_barrier(c, "written");
	cex_image("target_data_buffer", dbuf, BLOCKS * BLK);
	cex_image("target_pi_buffer", pbuf, BLOCKS * PI);
	cex_check(c, !memcmp(dbuf, data, BLOCKS * BLK), "the data buffer holds the data alone");
	for (b = 0; b < BLOCKS; b++) {
		memcpy(joined + b * (BLK + PI), dbuf + b * BLK, BLK);
		memcpy(joined + b * (BLK + PI) + BLK, pbuf + b * PI, PI);
	}
	cex_check_dif(c, "target_pi_buffer", joined, BLOCKS, BLK, BG, APP, REF);
	cex_barrier(c, "read");
	e = cex_mkey_check(c, "after_read", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "the read found every PI valid");

	pbuf[BAD_BLOCK * PI + 4] = 0;
	pbuf[BAD_BLOCK * PI + 5] = 0;
	pbuf[BAD_BLOCK * PI + 6] = BAD_REF >> 8;
	pbuf[BAD_BLOCK * PI + 7] = BAD_REF & 0xff;
	printf("tamper block %d: ref tag 0x%x in the PI buffer\n", BAD_BLOCK, BAD_REF);
	cex_barrier(c, "damaged");
	cex_barrier(c, "read again");
	e = cex_mkey_check(c, "damaged", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_SIG_BLOCK_BAD_REFTAG &&
		  e.err.sig.actual_value == REF + BAD_BLOCK && e.err.sig.expected_value == BAD_REF &&
		  e.err.sig.offset == BAD_BLOCK * (BLK + PI),
		  "a bad ref tag in block %d: actual 0x%x, expected 0x%x, offset %d in the memory "
		  "stream of 520-byte blocks", BAD_BLOCK, REF + BAD_BLOCK, BAD_REF,
		  BAD_BLOCK * (BLK + PI));
	mlx5dv_destroy_mkey(mkey);
	ibv_dereg_mr(pmr);
	ibv_dereg_mr(dmr);
}

static void initiator(struct cex *c)
{
	uint8_t *data = cex_alloc(BLOCKS * BLK), *back = cex_alloc(BLOCKS * BLK);
	struct ibv_mr *mr = cex_reg_mr(c, data, BLOCKS * BLK), *bmr = cex_reg_mr(c, back, BLOCKS * BLK);

	cex_pattern(data, BLOCKS * BLK, SEED);
	cex_connect(c, 0, 0, 0);
	cex_barrier(c, "configured");
	cex_image("initiator_memory", data, BLOCKS * BLK);
	cex_rdma_write(c, mr->lkey, (uintptr_t)data, BLOCKS * BLK, c->peer.rkey, c->peer.addr);
	cex_barrier(c, "written");
	cex_rdma_read(c, bmr->lkey, (uintptr_t)back, BLOCKS * BLK, c->peer.rkey, c->peer.addr);
	cex_image("initiator_memory_read", back, BLOCKS * BLK);
	cex_check(c, !memcmp(back, data, BLOCKS * BLK), "the data came back, PIs stripped");
	cex_barrier(c, "read");
	cex_barrier(c, "damaged");
	cex_rdma_read(c, bmr->lkey, (uintptr_t)back, BLOCKS * BLK, c->peer.rkey, c->peer.addr);
	cex_check(c, !memcmp(back, data, BLOCKS * BLK),
		  "read with a damaged PI completes and still carries the data");
	cex_barrier(c, "read again");
	ibv_dereg_mr(bmr);
	ibv_dereg_mr(mr);
}

int main(int argc, char **argv)
{
	return cex_main(argc, argv, target, initiator);
}
