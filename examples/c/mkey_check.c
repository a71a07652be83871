/* mlx5dv_mkey_check(3) after corrupted blocks. The target's MKEY has a T10-DIF wire
 * domain on 512-byte blocks (bg 0xffff, app tag 0x5a5a, ref tag 0x1000, REF_REMAP,
 * check_mask 0xff) over plain memory; the initiator RDMA_WRITEs data and T10-DIFs four
 * times: a guard damaged in block 2, then a clean image, then a wrong app tag in block
 * 4, then a wrong ref tag in block 6. Each write completes (a signature error is not a
 * transport error); after each the target asks mlx5dv_mkey_check what it found: the
 * error type, the value computed from the data (actual), the one the PI held
 * (expected) and the block's offset in the transfer. The error is reported once. */
#include "cex.h"

#include <stdio.h>
#include <string.h>

#define BLOCKS 8
#define BLK 512
#define PI 8
#define SEED 401
#define BG 0xffff
#define APP 0x5a5a
#define REF 0x1000

struct damage {
	const char *name;
	int block;
	int byte;              /* in the PI: 0 guard, 2 app tag, 4 ref tag; -1 none */
	enum mlx5dv_mkey_err_type want;
};

static const struct damage ROUNDS[] = {
	{ "bad_guard", 2, 0, MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD },
	{ "clean", -1, -1, MLX5DV_MKEY_NO_ERR },
	{ "bad_apptag", 4, 2, MLX5DV_MKEY_SIG_BLOCK_BAD_APPTAG },
	{ "bad_reftag", 6, 4, MLX5DV_MKEY_SIG_BLOCK_BAD_REFTAG },
};
#define NROUNDS (sizeof(ROUNDS) / sizeof(ROUNDS[0]))

/* data and T10-DIF, then the round's damage (one bit of the field flipped) */
static void image(uint8_t *img, const uint8_t *data, const struct damage *d)
{
	size_t b;

	for (b = 0; b < BLOCKS; b++) {
		uint8_t *p = img + b * (BLK + PI);

		memcpy(p, data + b * BLK, BLK);
		cex_t10dif_pi(p + BLK, p, BLK, BG, APP, REF + (uint32_t)b);
	}
	if (d->block >= 0)
		img[d->block * (BLK + PI) + BLK + d->byte + 1] ^= 0x01;
}

static void target(struct cex *c)
{
	uint8_t *mem = cex_alloc(BLOCKS * BLK), *data = cex_alloc(BLOCKS * BLK);
	uint8_t *img = cex_alloc(BLOCKS * (BLK + PI));
	struct mlx5dv_mkey *mkey;
	struct mlx5dv_mkey_err e;
	struct ibv_mr *mr;
	struct ibv_sge sge;
	size_t r;

	cex_pattern(data, BLOCKS * BLK, SEED);
	mr = cex_reg_mr(c, mem, BLOCKS * BLK);
	mkey = cex_create_mkey(c, MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
			       MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE, 1);
	sge = (struct ibv_sge){ .addr = (uintptr_t)mem, .length = BLOCKS * BLK, .lkey = mr->lkey };
	cex_connect(c, mkey->rkey, 0, BLOCKS * (BLK + PI));
	/* a configure WR needs the QP in RTS; the peer waits for it */
	cex_configure_wire_dif(c, mkey, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
			       IBV_ACCESS_REMOTE_WRITE, &sge, BG, APP, REF);
	cex_barrier(c, "configured");
	for (r = 0; r < NROUNDS; r++) {
		const struct damage *d = &ROUNDS[r];
		const uint8_t *pi;
		uint64_t actual = 0, expected = 0;

		cex_barrier(c, d->name);
		e = cex_mkey_check(c, d->name, mkey);
		/* The next write waits for this check: the MKEY keeps its first error until it
		 * is read, so an error of the next write found before this read would be lost
		 * behind this one. */
		cex_barrier(c, "checked");
		cex_check(c, !memcmp(mem, data, BLOCKS * BLK), "%s: the data was stored all the same",
			  d->name);
		if (d->block < 0) {
			cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR,
				  "%s: nothing found (the last error was reported once)", d->name);
			continue;
		}
		/* what this program expects the device to say about the damaged block */
		image(img, data, d);
		pi = img + d->block * (BLK + PI) + BLK;
		switch (d->want) {
		case MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD:
			actual = cex_crc16_t10dif(BG, data + d->block * BLK, BLK);
			expected = cex_be16(pi);
			break;
		case MLX5DV_MKEY_SIG_BLOCK_BAD_APPTAG:
			actual = APP;
			expected = cex_be16(pi + 2);
			break;
		default:
			actual = REF + (uint32_t)d->block;
			expected = cex_be32(pi + 4);
			break;
		}
		cex_check(c, e.err_type == d->want && e.err.sig.actual_value == actual &&
			  e.err.sig.expected_value == expected &&
			  e.err.sig.offset == (uint64_t)d->block * (BLK + PI),
			  "%s: block %d, actual 0x%llx, expected 0x%llx, offset %d", d->name,
			  d->block, (unsigned long long)actual, (unsigned long long)expected,
			  d->block * (BLK + PI));
	}
	cex_barrier(c, "done");
	mlx5dv_destroy_mkey(mkey);
	ibv_dereg_mr(mr);
}

static void initiator(struct cex *c)
{
	uint8_t *img = cex_alloc(BLOCKS * (BLK + PI)), *data = cex_alloc(BLOCKS * BLK);
	struct ibv_mr *mr = cex_reg_mr(c, img, BLOCKS * (BLK + PI));
	size_t r;

	cex_pattern(data, BLOCKS * BLK, SEED);
	cex_connect(c, 0, 0, 0);
	cex_barrier(c, "configured");
	for (r = 0; r < NROUNDS; r++) {
		char name[64];

		image(img, data, &ROUNDS[r]);
		snprintf(name, sizeof(name), "initiator_memory_%s", ROUNDS[r].name);
		cex_image(name, img, BLOCKS * (BLK + PI));
		cex_rdma_write(c, mr->lkey, (uintptr_t)img, BLOCKS * (BLK + PI), c->peer.rkey,
			       c->peer.addr);
		cex_barrier(c, ROUNDS[r].name);
		cex_barrier(c, "checked");
	}
	cex_barrier(c, "done");
	ibv_dereg_mr(mr);
}

int main(int argc, char **argv)
{
	return cex_main(argc, argv, target, initiator);
}
