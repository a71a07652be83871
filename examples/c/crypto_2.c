/* mlx5dv_wr_set_mkey_crypto(3), example 2 (row C): a remote RDMA_READ of the target's
 * signature and crypto MKEY. The target's memory holds plain data; the initiator gets
 * every 512 bytes with a T10-DIF, each 520 bytes encrypted with AES-256-XTS under the
 * plaintext DEK the target chose. The initiator checks no unit came in the clear. */
#include "row_c.h"

#include <stdio.h>
#include <string.h>

#define BLOCKS 8
#define SEED 201
#define KEY_SEED 202

static void target(struct cex *c)
{
	uint8_t *mem = cex_alloc(BLOCKS * ROW_C_BLK), key[ROW_C_KEY_LEN];
	struct mlx5dv_mkey *mkey;
	struct mlx5dv_mkey_err e;
	struct mlx5dv_dek *dek;
	struct ibv_mr *mr;

	cex_pattern(mem, BLOCKS * ROW_C_BLK, SEED);
	cex_pattern(key, sizeof(key), KEY_SEED);
	mr = cex_reg_mr(c, mem, BLOCKS * ROW_C_BLK);
	dek = cex_create_dek(c, key, sizeof(key));
	mkey = row_c_create(c);
	cex_connect(c, mkey->rkey, 0, BLOCKS * ROW_C_UNIT);
	/* a configure WR needs the QP in RTS; the peer waits for it */
	row_c_configure(c, mkey, mr, dek);
	cex_barrier(c, "configured");
	cex_image("target_memory", mem, BLOCKS * ROW_C_BLK);
	cex_barrier(c, "read");
	e = cex_mkey_check(c, "after_read", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "mkey_check finds nothing");
	mlx5dv_destroy_mkey(mkey);
	mlx5dv_dek_destroy(dek);
	ibv_dereg_mr(mr);
}

static void initiator(struct cex *c)
{
	uint8_t *buf = cex_alloc(BLOCKS * ROW_C_UNIT), *data = cex_alloc(BLOCKS * ROW_C_BLK);
	struct ibv_mr *mr = cex_reg_mr(c, buf, BLOCKS * ROW_C_UNIT);
	size_t n;

	cex_pattern(data, BLOCKS * ROW_C_BLK, SEED);
	cex_connect(c, 0, 0, 0);
	cex_barrier(c, "configured");
	cex_rdma_read(c, mr->lkey, (uintptr_t)buf, BLOCKS * ROW_C_UNIT, c->peer.rkey,
		      c->peer.addr);
	cex_image("initiator_memory", buf, BLOCKS * ROW_C_UNIT);
	n = row_c_ciphered_units(buf, data, BLOCKS);
	cex_check(c, n == BLOCKS, "all %d units of 520 bytes are ciphertext (%zu differ from "
		  "data+T10-DIF as computed here)", BLOCKS, n);
	cex_barrier(c, "read");
	ibv_dereg_mr(mr);
}

int main(int argc, char **argv)
{
	return cex_main(argc, argv, target, initiator);
}
