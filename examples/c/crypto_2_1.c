/* mlx5dv_wr_set_mkey_crypto(3), example 2.1 (row C, RX): a remote RDMA_WRITE of
 * enc(data+T10-DIF) to the target's signature and crypto MKEY: the device decrypts each
 * 520 bytes, checks the T10-DIF, strips it and the target's memory gets the data alone.
 * The initiator's ciphertext comes from the device itself: it first RDMA_READs the
 * MKEY (example 2), then the target clears its memory and the initiator writes the
 * ciphertext back: decrypt(encrypt(x)) == x. Then one ciphertext byte of unit 5 is
 * flipped and written again: mlx5dv_mkey_check(3) reports a bad guard at that unit. */
#include "row_c.h"

#include <stdio.h>
#include <string.h>

#define BLOCKS 8
#define SEED 211
#define KEY_SEED 212
#define BAD_UNIT 5

static void target(struct cex *c)
{
	uint8_t *mem = cex_alloc(BLOCKS * ROW_C_BLK), *data = cex_alloc(BLOCKS * ROW_C_BLK);
	uint8_t key[ROW_C_KEY_LEN];
	struct mlx5dv_mkey *mkey;
	struct mlx5dv_mkey_err e;
	struct mlx5dv_dek *dek;
	struct ibv_mr *mr;

	cex_pattern(data, BLOCKS * ROW_C_BLK, SEED);
	memcpy(mem, data, BLOCKS * ROW_C_BLK);
	cex_pattern(key, sizeof(key), KEY_SEED);
	mr = cex_reg_mr(c, mem, BLOCKS * ROW_C_BLK);
	dek = cex_create_dek(c, key, sizeof(key));
	mkey = row_c_create(c);
	cex_connect(c, mkey->rkey, 0, BLOCKS * ROW_C_UNIT);
	/* a configure WR needs the QP in RTS; the peer waits for it */
	row_c_configure(c, mkey, mr, dek);
	cex_barrier(c, "configured");
	cex_barrier(c, "read");
	memset(mem, 0, BLOCKS * ROW_C_BLK);
	cex_barrier(c, "cleared");
	cex_barrier(c, "written");
	cex_image("target_memory", mem, BLOCKS * ROW_C_BLK);
	cex_check(c, !memcmp(mem, data, BLOCKS * ROW_C_BLK),
		  "memory holds the data alone: decrypt(encrypt(x)) == x, T10-DIF stripped");
	e = cex_mkey_check(c, "after_write", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "every T10-DIF was valid after decryption");
	/* the damaged write waits for this check and the memory's comparison */
	cex_barrier(c, "checked clean");
	cex_barrier(c, "written again");
	e = cex_mkey_check(c, "tampered", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD &&
		  e.err.sig.offset == BAD_UNIT * ROW_C_UNIT,
		  "a bad guard in unit %d (offset %d) once its ciphertext was damaged", BAD_UNIT,
		  BAD_UNIT * ROW_C_UNIT);
	cex_check(c, !memcmp(mem, data, BAD_UNIT * ROW_C_BLK) &&
		  !memcmp(mem + (BAD_UNIT + 1) * ROW_C_BLK, data + (BAD_UNIT + 1) * ROW_C_BLK,
			  (BLOCKS - BAD_UNIT - 1) * ROW_C_BLK),
		  "every unit but the damaged one holds the data again (XTS keeps the damage in "
		  "its unit)");
	cex_barrier(c, "checked");
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
	n = row_c_ciphered_units(buf, data, BLOCKS);
	cex_check(c, n == BLOCKS, "the image read is ciphertext in all %d units", BLOCKS);
	cex_barrier(c, "read");
	cex_barrier(c, "cleared");
	cex_image("initiator_memory", buf, BLOCKS * ROW_C_UNIT);
	cex_rdma_write(c, mr->lkey, (uintptr_t)buf, BLOCKS * ROW_C_UNIT, c->peer.rkey,
		       c->peer.addr);
	cex_barrier(c, "written");
	cex_barrier(c, "checked clean");
	buf[BAD_UNIT * ROW_C_UNIT + 17] ^= 0x80;
	printf("tamper unit %d: ciphertext byte %d flipped\n", BAD_UNIT, BAD_UNIT * ROW_C_UNIT + 17);
	cex_image("initiator_memory_tampered", buf, BLOCKS * ROW_C_UNIT);
	cex_rdma_write(c, mr->lkey, (uintptr_t)buf, BLOCKS * ROW_C_UNIT, c->peer.rkey,
		       c->peer.addr);
	cex_barrier(c, "written again");
	cex_barrier(c, "checked");
	ibv_dereg_mr(mr);
}

int main(int argc, char **argv)
{
	return cex_main(argc, argv, target, initiator);
}
