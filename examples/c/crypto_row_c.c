/* Row C of mlx5dv_wr_set_mkey_crypto(3)'s table, through the MKEY as a local key:
 *
 *   Memory data -> SIG.mem = none, SIG.wire = SIG, Encrypt on TX -> Wire enc(data+SIG)
 *   encrypt_on_tx true, SIGNATURE_BEFORE_CRYPTO_ON_TX
 *
 * TX: the target SENDs with the MKEY as lkey; the initiator RECVs the wire image
 * enc(data+SIG) into a plain buffer. RX: the initiator SENDs those bytes back and the
 * target RECVs them through the MKEY over its cleared memory, which gets the memory
 * image, data, again. */
#include "row_c.h"

#include <stdio.h>
#include <string.h>

#define BLOCKS 6
#define SEED 301
#define KEY_SEED 302

static void target(struct cex *c)
{
	uint8_t *mem = cex_alloc(BLOCKS * ROW_C_BLK), *data = cex_alloc(BLOCKS * ROW_C_BLK);
	uint8_t key[ROW_C_KEY_LEN];
	struct mlx5dv_mkey *mkey;
	struct mlx5dv_mkey_err e;
	struct mlx5dv_dek *dek;
	struct ibv_mr *mr;

	printf("row C: Memory data -> SIG.mem = none, SIG.wire = SIG, Encrypt on TX -> "
	       "Wire enc(data+SIG)\n");
	cex_pattern(data, BLOCKS * ROW_C_BLK, SEED);
	memcpy(mem, data, BLOCKS * ROW_C_BLK);
	cex_pattern(key, sizeof(key), KEY_SEED);
	mr = cex_reg_mr(c, mem, BLOCKS * ROW_C_BLK);
	dek = cex_create_dek(c, key, sizeof(key));
	mkey = row_c_create(c);
	cex_connect(c, 0, 0, 0);
	/* a configure WR needs the QP in RTS; the peer waits for it */
	row_c_configure(c, mkey, mr, dek);
	cex_barrier(c, "configured");
	cex_image("target_memory", mem, BLOCKS * ROW_C_BLK);

	cex_barrier(c, "tx recv posted");
	cex_send(c, mkey->lkey, 0, BLOCKS * ROW_C_UNIT);
	cex_barrier(c, "tx done");
	e = cex_mkey_check(c, "tx", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "TX: mkey_check finds nothing");

	memset(mem, 0, BLOCKS * ROW_C_BLK);
	cex_post_recv(c, mkey->lkey, 0, BLOCKS * ROW_C_UNIT);
	cex_barrier(c, "rx recv posted");
	cex_wait_recv(c, BLOCKS * ROW_C_UNIT);
	cex_image("target_memory_rx", mem, BLOCKS * ROW_C_BLK);
	cex_check(c, !memcmp(mem, data, BLOCKS * ROW_C_BLK),
		  "RX gives back the memory image, data");
	e = cex_mkey_check(c, "rx", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "RX: every T10-DIF valid after decryption");
	cex_barrier(c, "rx done");
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
	cex_post_recv(c, mr->lkey, (uintptr_t)buf, BLOCKS * ROW_C_UNIT);
	cex_barrier(c, "tx recv posted");
	cex_wait_recv(c, BLOCKS * ROW_C_UNIT);
	cex_image("wire_image", buf, BLOCKS * ROW_C_UNIT);
	n = row_c_ciphered_units(buf, data, BLOCKS);
	cex_check(c, n == BLOCKS, "TX: all %d units of 520 bytes are ciphertext", BLOCKS);
	cex_barrier(c, "tx done");
	cex_barrier(c, "rx recv posted");
	cex_send(c, mr->lkey, (uintptr_t)buf, BLOCKS * ROW_C_UNIT);
	cex_barrier(c, "rx done");
	ibv_dereg_mr(mr);
}

int main(int argc, char **argv)
{
	return cex_main(argc, argv, target, initiator);
}
