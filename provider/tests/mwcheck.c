/* mwcheck: memory windows, ibv_rereg_mr, ibv_resize_cq and RDMA atomic write from C
 * (provider/mw.c), two sides of one process connected through the daemon.
 *
 *   mwcheck windows    ibv_rereg_mr of access, an RDMA atomic write, ibv_resize_cq (with
 *                      completions not polled yet, which it keeps), a type
 *                      1 window bound with ibv_bind_mw and a type 2 one with
 *                      IBV_WR_BIND_MW, written through by the peer, the type 2
 *                      invalidated and refused after.
 *   mwcheck builders   the same through ibv_qp_ex: ibv_wr_atomic_write, ibv_wr_bind_mw,
 *                      ibv_wr_local_inv.
 *
 * Expected values are computed here from the patterns, never read back from softhca.
 * Exit 0 when every check holds; each check prints one line. */
#define PROG "mwcheck"
#include "side.h"

static int write_through(struct side *a, uint8_t *src, uint32_t len, struct ibv_mr *smr,
			 uint8_t *dst, uint32_t rkey)
{
	if (post(a, IBV_WR_RDMA_WRITE, src, len, smr->lkey, (uintptr_t)dst, rkey))
		die("post");
	return wait_wc(a).status;
}

/* Three SENDs from a into receives of b, their completions left unpolled on b's CQ
 * (a saw their ACKs: b's responder completed the receives before it acknowledged them),
 * then b's CQ resized: the three still come out of it, in order, with their lengths. */
static int resize_keeps_unpolled(struct side *a, struct side *b, uint8_t *src,
				 struct ibv_mr *smr, uint8_t *dst, struct ibv_mr *dmr)
{
	struct ibv_sge rs = {.addr = (uintptr_t)dst, .length = 64, .lkey = dmr->lkey};
	struct ibv_recv_wr rwr = {.sg_list = &rs, .num_sge = 1}, *rbad;
	struct ibv_wc wc[4];
	int i, n = 0, got;

	for (i = 0; i < 3; i++) {
		rwr.wr_id = 201 + (uint64_t)i;
		if (ibv_post_recv(b->qp, &rwr, &rbad))
			die("ibv_post_recv");
	}
	for (i = 0; i < 3; i++)
		if (post(a, IBV_WR_SEND, src, 10 + (uint32_t)i, smr->lkey, 0, 0) ||
		    wait_wc(a).status != IBV_WC_SUCCESS)
			return 0;
	if (ibv_resize_cq(b->cq, 96) || b->cq->cqe != 96)
		return 0;
	while (n < 3) {
		got = ibv_poll_cq(b->cq, 4, wc + n);
		if (got < 0)
			return 0;
		n += got;
	}
	for (i = 0; i < 3; i++)
		if (wc[i].wr_id != 201 + (uint64_t)i || wc[i].opcode != IBV_WC_RECV ||
		    wc[i].status != IBV_WC_SUCCESS || wc[i].byte_len != 10 + (uint32_t)i)
			return 0;
	return 1;
}

static size_t differ(const uint8_t *p, size_t n, int which, size_t from)
{
	size_t i, bad = 0;

	for (i = 0; i < n; i++)
		bad += p[i] != pat(which, from + i);
	return bad;
}

static int windows(void)
{
	struct side a = {0}, b = {0};
	struct peer_info ia, ib;
	uint8_t *src = unaligned(4096, 8), *dst = unaligned(4096, 9), *w = unaligned(4096, 10);
	struct ibv_mr *smr, *dmr, *wmr;
	struct ibv_mw *mw1, *mw2;
	struct ibv_mw_bind bind = {0};
	struct ibv_send_wr wr = {0}, *bad;
	struct ibv_wc wc;
	uint32_t old, key;
	size_t off;

	open_side(&a);
	open_side(&b);
	smr = ibv_reg_mr(a.pd, src, 4096, ACCESS);
	dmr = ibv_reg_mr(b.pd, dst, 4096, IBV_ACCESS_LOCAL_WRITE);
	wmr = ibv_reg_mr(b.pd, w, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!smr || !dmr || !wmr)
		die("ibv_reg_mr");
	ia = (struct peer_info){a.qp->qp_num, smr->rkey, (uintptr_t)src, a.gid};
	ib = (struct peer_info){b.qp->qp_num, dmr->rkey, (uintptr_t)dst, b.gid};
	connect_qp(&a, &ib);
	connect_qp(&b, &ia);
	CHECK(ibv_rereg_mr(dmr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, ACCESS) == 0,
	      "ibv_rereg_mr gives an MR remote write");
	CHECK(write_through(&a, src, 256, smr, dst, dmr->rkey) == IBV_WC_SUCCESS &&
	      differ(dst, 256, 8, 0) == 0, "the peer's WRITE then lands");
	/* RDMA atomic write: one 8-byte SGE stored at an 8-byte aligned address (dst is
	 * deliberately unaligned: the first aligned byte from 512 on) */
	off = 512 + (8 - ((uintptr_t)dst + 512) % 8) % 8;
	CHECK(post(&a, IBV_WR_ATOMIC_WRITE, src + 16, 8, smr->lkey, (uintptr_t)dst + off + 1,
		   dmr->rkey) == EINVAL, "IBV_WR_ATOMIC_WRITE to an unaligned address is EINVAL");
	CHECK(post(&a, IBV_WR_ATOMIC_WRITE, src + 16, 8, smr->lkey, (uintptr_t)dst + off,
		   dmr->rkey) == 0 && wait_wc(&a).status == IBV_WC_SUCCESS &&
	      differ(dst + off, 8, 8, 16) == 0 && differ(dst + off + 8, 8, 9, off + 8) == 0 &&
	      differ(dst + 256, off - 256, 9, 256) == 0,
	      "IBV_WR_ATOMIC_WRITE stores the 8 bytes and nothing else");
	CHECK(ibv_resize_cq(a.cq, 128) == 0 && a.cq->cqe == 128, "ibv_resize_cq to 128");
	CHECK(ibv_resize_cq(a.cq, 0) == EINVAL, "ibv_resize_cq to 0 is EINVAL");
	CHECK(resize_keeps_unpolled(&a, &b, src, smr, dst, dmr),
	      "ibv_resize_cq keeps the completions not polled yet, in order");
	mw1 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_1);
	mw2 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
	if (!mw1 || !mw2)
		die("ibv_alloc_mw");
	old = mw1->rkey;
	bind.wr_id = 11;
	bind.send_flags = IBV_SEND_SIGNALED;
	bind.bind_info = (struct ibv_mw_bind_info){wmr, (uintptr_t)w + 100, 200,
						   IBV_ACCESS_REMOTE_WRITE};
	CHECK(ibv_bind_mw(b.qp, mw1, &bind) == 0 && mw1->rkey == ibv_inc_rkey(old),
	      "ibv_bind_mw of a type 1 window gives it ibv_inc_rkey of its rkey");
	wc = wait_wc(&b);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW, "the bind completes");
	CHECK(write_through(&a, src, 200, smr, w + 100, mw1->rkey) == IBV_WC_SUCCESS &&
	      differ(w + 100, 200, 8, 0) == 0 && differ(w, 100, 10, 0) == 0,
	      "the peer writes through the type 1 window, nothing around it");
	key = (mw2->rkey & ~0xFFu) | 0x42;
	wr.wr_id = 12;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = mw2;
	wr.bind_mw.rkey = key;
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){wmr, (uintptr_t)w + 1024, 64,
							 IBV_ACCESS_REMOTE_WRITE};
	CHECK(ibv_post_send(b.qp, &wr, &bad) == 0 && wait_wc(&b).status == IBV_WC_SUCCESS,
	      "IBV_WR_BIND_MW binds a type 2 window");
	CHECK(write_through(&a, src + 8, 64, smr, w + 1024, key) == IBV_WC_SUCCESS &&
	      differ(w + 1024, 64, 8, 8) == 0, "the peer writes through the type 2 window");
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.invalidate_rkey = key;
	CHECK(ibv_post_send(b.qp, &wr, &bad) == 0 && wait_wc(&b).status == IBV_WC_SUCCESS,
	      "IBV_WR_LOCAL_INV invalidates it");
	memset(w + 1024, 0xEE, 64);
	wc.status = write_through(&a, src, 64, smr, w + 1024, key);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "a WRITE through it after completes with %s",
	      ibv_wc_status_str(wc.status));
	CHECK(w[1024] == 0xEE && w[1087] == 0xEE, "and moves no byte");
	CHECK(ibv_dealloc_mw(mw1) == 0 && ibv_dealloc_mw(mw2) == 0, "ibv_dealloc_mw");
	return failures ? 1 : 0;
}

/* open_side with an extended QP (ibv_create_qp_ex with the builders asked for). */
static void open_side_ex(struct side *s)
{
	struct ibv_qp_init_attr_ex qa = {0};

	open_ctx(s);
	qa.send_cq = qa.recv_cq = s->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 16;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.pd = s->pd;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_ATOMIC_WRITE |
			    IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
	s->qp = ibv_create_qp_ex(s->ctx, &qa);
	if (!s->qp)
		die("ibv_create_qp_ex");
}

static int builders(void)
{
	struct side c = {0}, d = {0};
	struct peer_info ic, id;
	uint8_t *src = unaligned(4096, 11), *dst;
	const uint8_t value[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	struct ibv_mr *smr, *dmr;
	struct ibv_qp_ex *cx, *dx;
	struct ibv_mw *mw;
	struct ibv_mw_bind_info info;
	struct ibv_wc wc;
	uint32_t key;

	open_side_ex(&c);
	open_side_ex(&d);
	if (posix_memalign((void **)&dst, 4096, 4096))
		die("posix_memalign");
	memset(dst, 0xAB, 4096);
	smr = ibv_reg_mr(c.pd, src, 4096, ACCESS);
	dmr = ibv_reg_mr(d.pd, dst, 4096, ACCESS | IBV_ACCESS_MW_BIND);
	mw = ibv_alloc_mw(d.pd, IBV_MW_TYPE_2);
	if (!smr || !dmr || !mw)
		die("ibv_reg_mr / ibv_alloc_mw");
	ic = (struct peer_info){c.qp->qp_num, smr->rkey, (uintptr_t)src, c.gid};
	id = (struct peer_info){d.qp->qp_num, dmr->rkey, (uintptr_t)dst, d.gid};
	connect_qp(&c, &id);
	connect_qp(&d, &ic);
	cx = ibv_qp_to_qp_ex(c.qp);
	dx = ibv_qp_to_qp_ex(d.qp);
	ibv_wr_start(cx);
	cx->wr_id = 21;
	cx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(cx, dmr->rkey, (uintptr_t)dst + 8, value);
	CHECK(ibv_wr_complete(cx) == 0 && wait_wc(&c).status == IBV_WC_SUCCESS &&
	      !memcmp(dst + 8, value, 8) && dst[7] == 0xAB && dst[16] == 0xAB,
	      "ibv_wr_atomic_write stores its 8 bytes");
	key = (mw->rkey & ~0xFFu) | 0x99;
	info = (struct ibv_mw_bind_info){dmr, (uintptr_t)dst + 2048, 128,
					 IBV_ACCESS_REMOTE_WRITE};
	ibv_wr_start(dx);
	dx->wr_id = 22;
	dx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(dx, mw, key, &info);
	wc.status = IBV_WC_GENERAL_ERR;
	CHECK(ibv_wr_complete(dx) == 0 && (wc = wait_wc(&d)).status == IBV_WC_SUCCESS &&
	      wc.opcode == IBV_WC_BIND_MW, "ibv_wr_bind_mw binds a type 2 window");
	CHECK(write_through(&c, src, 128, smr, dst + 2048, key) == IBV_WC_SUCCESS &&
	      differ(dst + 2048, 128, 11, 0) == 0, "the peer writes through it");
	ibv_wr_start(dx);
	dx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(dx, key);
	CHECK(ibv_wr_complete(dx) == 0 && wait_wc(&d).status == IBV_WC_SUCCESS,
	      "ibv_wr_local_inv invalidates it");
	CHECK(write_through(&c, src, 128, smr, dst + 2048, key) == IBV_WC_REM_ACCESS_ERR,
	      "a WRITE through it after is a remote access error");
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "windows";

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(mode, "windows"))
		return windows();
	if (!strcmp(mode, "builders"))
		return builders();
	fprintf(stderr, "usage: mwcheck windows|builders\n");
	return 2;
}
