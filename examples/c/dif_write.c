/* A T10-DIF wire-domain MKEY on the initiator (mlx5dv_wr_set_mkey_sig_block(3)'s
 * example 2 kind of MKEY, on the other side): the initiator's memory holds plain data,
 * 8 blocks of 512 bytes; its MKEY adds a T10-DIF to each block on the wire (bg 0xffff,
 * app tag 0x5a5a, ref tag 0x1000, REF_REMAP). It RDMA_WRITEs from the MKEY into the
 * target's plain buffer, which gets data+T10-DIF and checks every PI itself. Then the
 * initiator RDMA_READs the target's buffer into the MKEY: the PIs are checked and
 * stripped, and its memory gets the data back.
 *
 * The peer may be this program or tests/support/pyverbs_dif_write.py (the same
 * exchange, in softhca's pyverbs), in either role. */
#include "cex.h"

#include <stdio.h>
#include <string.h>

#define BLOCKS 8
#define BLK 512
#define PI 8
#define SEED 601
#define BG 0xffff
#define APP 0x5a5a
#define REF 0x1000

static void target(struct cex *c)
{
	uint8_t *buf = cex_alloc(BLOCKS * (BLK + PI)), *data = cex_alloc(BLOCKS * BLK);
	struct ibv_mr *mr = cex_reg_mr(c, buf, BLOCKS * (BLK + PI));
	size_t b;
	int same = 1;

	cex_pattern(data, BLOCKS * BLK, SEED);
	cex_connect(c, mr->rkey, (uintptr_t)buf, BLOCKS * (BLK + PI));
	cex_barrier(c, "configured");
	cex_barrier(c, "written");
	cex_image("target_memory", buf, BLOCKS * (BLK + PI));
	for (b = 0; b < BLOCKS; b++)
		same &= !memcmp(buf + b * (BLK + PI), data + b * BLK, BLK);
	cex_check(c, same, "each block of the initiator's data arrived");
	cex_check_dif(c, "target_memory", buf, BLOCKS, BLK, BG, APP, REF);
	cex_barrier(c, "read");
	ibv_dereg_mr(mr);
}

static void initiator(struct cex *c)
{
	uint8_t *mem = cex_alloc(BLOCKS * BLK), *data = cex_alloc(BLOCKS * BLK);
	const struct mlx5dv_sig_t10dif dif = {
		.bg_type = MLX5DV_SIG_T10DIF_CRC, .bg = BG, .app_tag = APP, .ref_tag = REF,
		.flags = MLX5DV_SIG_T10DIF_FLAG_REF_REMAP,
	};
	const struct mlx5dv_sig_block_domain wire = {
		.sig_type = MLX5DV_SIG_TYPE_T10DIF, .sig.dif = &dif,
		.block_size = MLX5DV_BLOCK_SIZE_512,
	};
	const struct mlx5dv_sig_block_attr sig = { .mem = NULL, .wire = &wire, .check_mask = 0xff };
	struct mlx5dv_mkey *mkey;
	struct mlx5dv_mkey_err e;
	struct ibv_mr *mr;
	struct ibv_sge sge;

	cex_pattern(data, BLOCKS * BLK, SEED);
	memcpy(mem, data, BLOCKS * BLK);
	mr = cex_reg_mr(c, mem, BLOCKS * BLK);
	mkey = cex_create_mkey(c, MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
			       MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE, 1);
	sge = (struct ibv_sge){ .addr = (uintptr_t)mem, .length = BLOCKS * BLK, .lkey = mr->lkey };
	cex_connect(c, 0, 0, 0);
	/* a configure WR needs the QP in RTS; the peer waits for it */
	cex_configure(c, mkey, IBV_ACCESS_LOCAL_WRITE,
		      &(struct cex_layout){ .num_sges = 1, .sges = &sge }, &sig, NULL);
	cex_barrier(c, "configured");
	if (c->peer.len < BLOCKS * (BLK + PI))
		cex_die("the target offers %llu bytes, not %d", (unsigned long long)c->peer.len,
			BLOCKS * (BLK + PI));
	cex_image("initiator_memory", mem, BLOCKS * BLK);
	/* the SGE names the MKEY from 0 and counts the wire's bytes */
	cex_rdma_write(c, mkey->lkey, 0, BLOCKS * (BLK + PI), c->peer.rkey, c->peer.addr);
	e = cex_mkey_check(c, "after_write", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "mkey_check after the write finds nothing");
	cex_barrier(c, "written");
	memset(mem, 0, BLOCKS * BLK);
	cex_rdma_read(c, mkey->lkey, 0, BLOCKS * (BLK + PI), c->peer.rkey, c->peer.addr);
	cex_image("initiator_memory_read", mem, BLOCKS * BLK);
	cex_check(c, !memcmp(mem, data, BLOCKS * BLK),
		  "the read brought the data back, T10-DIFs checked and stripped");
	e = cex_mkey_check(c, "after_read", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "every T10-DIF the target held was valid");
	cex_barrier(c, "read");
	mlx5dv_destroy_mkey(mkey);
	ibv_dereg_mr(mr);
}

int main(int argc, char **argv)
{
	struct cex c;

	cex_args(&c, argc, argv);
	cex_open(&c);
	if (cex_is_target(&c))
		target(&c);
	else
		initiator(&c);
	return cex_finish(&c);
}
