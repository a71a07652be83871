/* mlx5dv_wr_set_mkey_crypto(3), example 1.1: a RECV with a crypto MKEY as the SGE
 * (encrypt_on_tx false, so the device encrypts what it receives; AES-128-XTS here, a
 * 32-byte plaintext DEK the program chose, 512-byte data units). The initiator SENDs
 * plaintext; the target's memory gets the ciphertext. The target checks that no data
 * unit arrived in the clear, then SENDs through the same MKEY (example 1's direction:
 * decrypt on TX) and the initiator checks it gets its plaintext back. */
#include "cex.h"

#include <stdio.h>
#include <string.h>

#define UNITS 8
#define DU 512
#define SEED 111
#define KEY_SEED 112
#define KEY_LEN 32

static void target(struct cex *c)
{
	uint8_t *mem = cex_alloc(UNITS * DU), *data = cex_alloc(UNITS * DU), key[KEY_LEN];
	struct mlx5dv_crypto_attr crypto;
	struct mlx5dv_mkey *mkey;
	struct mlx5dv_dek *dek;
	struct ibv_mr *mr;
	struct ibv_sge sge;
	int u, clear = 0;

	cex_pattern(data, UNITS * DU, SEED);
	cex_pattern(key, KEY_LEN, KEY_SEED);
	mr = cex_reg_mr(c, mem, UNITS * DU);
	dek = cex_create_dek(c, key, KEY_LEN);
	crypto = cex_crypto_attr(dek, false,
				 MLX5DV_SIGNATURE_CRYPTO_ORDER_SIGNATURE_BEFORE_CRYPTO_ON_TX,
				 MLX5DV_BLOCK_SIZE_512);
	mkey = cex_create_mkey(c, MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
			       MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO, 1);
	sge = (struct ibv_sge){ .addr = (uintptr_t)mem, .length = UNITS * DU, .lkey = mr->lkey };
	cex_connect(c, 0, 0, 0);
	/* a configure WR needs the QP in RTS; the peer waits for it */
	cex_configure(c, mkey, IBV_ACCESS_LOCAL_WRITE,
		      &(struct cex_layout){ .num_sges = 1, .sges = &sge }, NULL, &crypto);
	cex_barrier(c, "configured");
	cex_post_recv(c, mkey->lkey, 0, UNITS * DU);
	cex_barrier(c, "recv posted");
	cex_wait_recv(c, UNITS * DU);
	cex_image("target_memory", mem, UNITS * DU);
	for (u = 0; u < UNITS; u++)
		clear += !memcmp(mem + u * DU, data + u * DU, DU);
	cex_check(c, clear == 0, "no data unit of the plaintext is in memory in the clear");

	/* back through the MKEY: decrypted on TX */
	cex_barrier(c, "recv posted again");
	cex_send(c, mkey->lkey, 0, UNITS * DU);
	cex_barrier(c, "round trip");
	mlx5dv_destroy_mkey(mkey);
	mlx5dv_dek_destroy(dek);
	ibv_dereg_mr(mr);
}

static void initiator(struct cex *c)
{
	uint8_t *data = cex_alloc(UNITS * DU), *back = cex_alloc(UNITS * DU);
	struct ibv_mr *mr = cex_reg_mr(c, data, UNITS * DU), *bmr = cex_reg_mr(c, back, UNITS * DU);

	cex_pattern(data, UNITS * DU, SEED);
	cex_connect(c, 0, 0, 0);
	cex_barrier(c, "configured");
	cex_image("initiator_memory", data, UNITS * DU);
	cex_barrier(c, "recv posted");
	cex_send(c, mr->lkey, (uintptr_t)data, UNITS * DU);
	cex_post_recv(c, bmr->lkey, (uintptr_t)back, UNITS * DU);
	cex_barrier(c, "recv posted again");
	cex_wait_recv(c, UNITS * DU);
	cex_image("initiator_memory_back", back, UNITS * DU);
	cex_check(c, !memcmp(back, data, UNITS * DU),
		  "decrypt(encrypt(x)) == x: the plaintext came back through the MKEY");
	cex_barrier(c, "round trip");
	ibv_dereg_mr(bmr);
	ibv_dereg_mr(mr);
}

int main(int argc, char **argv)
{
	return cex_main(argc, argv, target, initiator);
}
