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
	struct cex_dif_io io;

	cex_dif_io_init(c, &io, BLOCKS * BLK, BLOCKS * (BLK + PI), SEED);
	cex_connect(c, 0, 0, 0);
	/* a configure WR needs the QP in RTS; the peer waits for it */
	cex_configure_wire_dif(c, io.mkey, IBV_ACCESS_LOCAL_WRITE, &io.sge, BG, APP, REF);
	cex_barrier(c, "configured");
	if (c->peer.len < BLOCKS * (BLK + PI))
		cex_die("the target offers %llu bytes, not %d", (unsigned long long)c->peer.len,
			BLOCKS * (BLK + PI));
	cex_dif_io_write(c, &io);
	cex_barrier(c, "written");
	cex_dif_io_read(c, &io);
	cex_barrier(c, "read");
	cex_dif_io_free(&io);
}

int main(int argc, char **argv)
{
	return cex_main(argc, argv, target, initiator);
}
