/* Row C of mlx5dv_wr_set_mkey_crypto(3)'s table, which its example 2 and 2.1 use:
 * memory holds plain data; on TX the device appends a T10-DIF to every 512 bytes
 * (SIG.wire, no SIG.mem), then encrypts data and T10-DIF together (encrypt_on_tx,
 * SIGNATURE_BEFORE_CRYPTO_ON_TX), one 520-byte data unit per block. On RX the reverse:
 * decrypt, check each T10-DIF, strip it. The T10-DIF: CRC guard seeded 0, app tag
 * 0xbeef, ref tag 0x2000 incremented per block (REF_REMAP). */
#ifndef ROW_C_H
#define ROW_C_H

#include "cex.h"

#include <string.h>

#define ROW_C_BLK 512
#define ROW_C_UNIT 520
#define ROW_C_BG 0
#define ROW_C_APP 0xbeef
#define ROW_C_REF 0x2000
#define ROW_C_KEY_LEN 64

static inline struct mlx5dv_mkey *row_c_create(struct cex *c)
{
	return cex_create_mkey(c, MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
			       MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE |
			       MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO, 1);
}

/* The configure WR (the QP must be in RTS: after cex_connect). */
static inline void row_c_configure(struct cex *c, struct mlx5dv_mkey *mkey, struct ibv_mr *mr,
				   struct mlx5dv_dek *dek)
{
	static const struct mlx5dv_sig_t10dif dif = {
		.bg_type = MLX5DV_SIG_T10DIF_CRC, .bg = ROW_C_BG, .app_tag = ROW_C_APP,
		.ref_tag = ROW_C_REF, .flags = MLX5DV_SIG_T10DIF_FLAG_REF_REMAP,
	};
	static const struct mlx5dv_sig_block_domain wire = {
		.sig_type = MLX5DV_SIG_TYPE_T10DIF, .sig.dif = &dif,
		.block_size = MLX5DV_BLOCK_SIZE_512,
	};
	static const struct mlx5dv_sig_block_attr sig = {
		.mem = NULL, .wire = &wire, .check_mask = 0xff,
	};
	struct mlx5dv_crypto_attr crypto = cex_crypto_attr(
		dek, true, MLX5DV_SIGNATURE_CRYPTO_ORDER_SIGNATURE_BEFORE_CRYPTO_ON_TX,
		MLX5DV_BLOCK_SIZE_520);
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr, .length = (uint32_t)mr->length,
			       .lkey = mr->lkey };

	cex_configure(c, mkey, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
		      IBV_ACCESS_REMOTE_WRITE,
		      &(struct cex_layout){ .num_sges = 1, .sges = &sge }, &sig, &crypto);
}

/* Blocks of the plain image data+T10-DIF, as this program computes it. */
static inline void row_c_plain(uint8_t *img, const uint8_t *data, size_t blocks)
{
	size_t b;

	for (b = 0; b < blocks; b++) {
		uint8_t *p = img + b * ROW_C_UNIT;

		memcpy(p, data + b * ROW_C_BLK, ROW_C_BLK);
		cex_t10dif_pi(p + ROW_C_BLK, p, ROW_C_BLK, ROW_C_BG, ROW_C_APP,
			      ROW_C_REF + (uint32_t)b);
	}
}

/* How many 520-byte units of a wire image are not in the clear (differ from data+SIG). */
static inline size_t row_c_ciphered_units(const uint8_t *wire, const uint8_t *data,
					  size_t blocks)
{
	uint8_t pi[8];
	size_t b, n = 0;

	for (b = 0; b < blocks; b++) {
		const uint8_t *u = wire + b * ROW_C_UNIT;

		cex_t10dif_pi(pi, data + b * ROW_C_BLK, ROW_C_BLK, ROW_C_BG, ROW_C_APP,
			      ROW_C_REF + (uint32_t)b);
		n += memcmp(u, data + b * ROW_C_BLK, ROW_C_BLK) != 0 &&
		     memcmp(u + ROW_C_BLK, pi, 8) != 0;
	}
	return n;
}

#endif
