/* wqcheck: ibv_post_send and ibv_post_recv as ibv_post_send(3), ibv_post_recv(3) and
 * ibv_modify_qp(3) describe them, on a QP whose queues may be rings shared with the
 * daemon (provider/wq.c) or go as requests (SOFTHCA_WQ_RING=0).
 *
 *   wqcheck ring|requests   which path the QPs take: ring, a WR the daemon finds bad
 *                           completes in error (as a device finds a malformed WQE), the
 *                           WRs after it flush; requests, ibv_post_send refuses it
 *                           (EINVAL, bad_wr).
 *
 * Checked in both: IBV_SEND_INLINE data from a stack buffer overwritten as soon as each
 * ibv_post_send returns lands as it was at the post; a WR of an lkey that names no MR
 * completes IBV_WC_LOC_PROT_ERR, the rest flush; posts in RESET and INIT are EINVAL, in
 * ERR they flush; a QP reset and connected again takes a queue's depth of WRs again,
 * twice over; an atomic of a 4-byte SGE is EINVAL at post (rxe's validate_send_wr).
 * Path-dependent: a WRITE past the port's max_msg_sz, a UD SEND whose AH is of another
 * PD. Expected values come from the man pages and ibv_query_port, never from
 * softhca. Exit 0 when every check holds; each check prints one line. */
#define PROG "wqcheck"
#include <unistd.h>

#include "side.h"

#define DEPTH 16
#define INLINE 48

static int ring;

/* The side's QP replaced by a new one of max_inline_data INLINE, connected to itself. */
static void fresh_qp(struct side *s)
{
	struct ibv_qp_init_attr qa = {0};
	struct peer_info me;

	if (s->qp && ibv_destroy_qp(s->qp))
		die("ibv_destroy_qp");
	qa.send_cq = qa.recv_cq = s->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = DEPTH;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = INLINE;
	s->qp = ibv_create_qp(s->pd, &qa);
	if (!s->qp)
		die("ibv_create_qp");
	me = (struct peer_info){s->qp->qp_num, 0, 0, s->gid};
	connect_qp(s, &me);
}

static void expect_chain(struct side *s, const char *what, struct ibv_send_wr *w,
			 int refused, enum ibv_wc_status status);

static void to_state(struct side *s, enum ibv_qp_state st)
{
	struct ibv_qp_attr a = {.qp_state = st};

	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE))
		die("ibv_modify_qp");
}

/* n completions, waited for (a few seconds at most): their wr_id and status. */
static int wcs(struct side *s, int n, struct ibv_wc *out)
{
	int got = 0, k, spins = 0;

	while (got < n && spins < 5000) {
		k = ibv_poll_cq(s->cq, n - got, out + got);
		if (k < 0)
			die("ibv_poll_cq");
		if (!k) {
			usleep(1000);
			spins++;
		}
		got += k;
	}
	return got;
}

/* No completion comes for a while. */
static int quiet(struct side *s)
{
	struct ibv_wc wc;

	usleep(200000);
	return ibv_poll_cq(s->cq, 1, &wc) == 0;
}

static struct ibv_send_wr write_wr(struct side *s, uint64_t id, struct ibv_sge *sg,
				   uint32_t offset)
{
	struct ibv_send_wr w = {0};

	w.wr_id = id;
	w.opcode = IBV_WR_RDMA_WRITE;
	w.sg_list = sg;
	w.num_sge = 1;
	w.send_flags = IBV_SEND_SIGNALED;
	w.wr.rdma.remote_addr = (uintptr_t)s->rbuf + offset;
	w.wr.rdma.rkey = s->rmr->rkey;
	return w;
}

static uint8_t inline_pat(int i, int k)
{
	return (uint8_t)(i * 31 + k * 7 + 1);
}

/* 64 inline WRITEs of INLINE bytes, each from one stack buffer that is overwritten as
 * soon as its ibv_post_send returns ("the buffer can be reused immediately after the
 * call returns", ibv_post_send(3)), to rbuf + 64 * i. */
static void inline_reuse(struct side *s)
{
	struct ibv_wc wc[8];
	int i, k, bad = 0, lost = 0;

	fresh_qp(s);
	memset(s->rbuf, 0, 4096);
	for (i = 0; i < 64; i++) {
		uint8_t tmp[INLINE];
		struct ibv_sge sg = {(uintptr_t)tmp, INLINE, 0};   /* no lkey: inline */
		struct ibv_send_wr w = write_wr(s, (uint64_t)i, &sg, (uint32_t)(64 * i)), *b;

		for (k = 0; k < INLINE; k++)
			tmp[k] = inline_pat(i, k);
		w.send_flags |= IBV_SEND_INLINE;
		if (ibv_post_send(s->qp, &w, &b))
			die("ibv_post_send inline");
		memset(tmp, 0xEE, sizeof(tmp));
		__asm__ volatile("" : : "r"(tmp) : "memory");
		if (i % 8 == 7) {
			lost += 8 - wcs(s, 8, wc);
			for (k = 0; k < 8; k++)
				bad += wc[k].status != IBV_WC_SUCCESS;
		}
	}
	for (i = 0; i < 64; i++)
		for (k = 0; k < INLINE; k++)
			bad += s->rbuf[64 * i + k] != inline_pat(i, k);
	CHECK(!bad && !lost, "64 inline WRITEs from a stack buffer overwritten after each "
	      "post land as posted (%d bytes or statuses wrong, %d completions missing)", bad,
	      lost);
}

/* A chain of three signaled WRITEs whose WR 1 spoil makes bad, on a fresh QP. With
 * refused, a post request refuses it: EINVAL and bad_wr at WR 1, WR 0 completes alone;
 * otherwise the post takes all three, WR 1 completes status and WR 2 flushes. */
static void bad_middle(struct side *s, const char *what,
		       void (*spoil)(struct side *, struct ibv_send_wr *, struct ibv_sge *),
		       int refused, enum ibv_wc_status status)
{
	struct ibv_sge sg[3];
	struct ibv_send_wr w[3];
	int i;

	fresh_qp(s);
	for (i = 0; i < 3; i++) {
		sg[i] = (struct ibv_sge){(uintptr_t)s->buf, 8, s->mr->lkey};
		w[i] = write_wr(s, (uint64_t)i, &sg[i], (uint32_t)(1024 + 64 * i));
		w[i].next = i < 2 ? &w[i + 1] : NULL;
	}
	spoil(s, &w[1], &sg[1]);
	expect_chain(s, what, w, refused, status);
}

/* The chain of three w posted; WR 1 refused at post (refused) or completing status. */
static void expect_chain(struct side *s, const char *what, struct ibv_send_wr *w,
			 int refused, enum ibv_wc_status status)
{
	struct ibv_send_wr *bad = NULL;
	struct ibv_wc wc[4];
	int rc, n;

	rc = ibv_post_send(s->qp, w, &bad);
	if (refused) {
		CHECK(rc == EINVAL && bad == &w[1], "%s: ibv_post_send refuses it: EINVAL, bad_wr "
		      "at WR 1 (got %s)", what, strerror(rc));
		n = wcs(s, 1, wc);
		CHECK(n == 1 && wc[0].wr_id == 0 && wc[0].status == IBV_WC_SUCCESS && quiet(s),
		      "%s: and WR 0 completes, no other", what);
		return;
	}
	CHECK(rc == 0, "%s: ibv_post_send takes the chain (got %s)", what, strerror(rc));
	n = wcs(s, 3, wc);
	CHECK(n == 3 && wc[0].wr_id == 0 && wc[0].status == IBV_WC_SUCCESS &&
	      wc[1].wr_id == 1 && wc[1].status == status && wc[2].wr_id == 2 &&
	      wc[2].status == IBV_WC_WR_FLUSH_ERR && quiet(s),
	      "%s: WR 0 completes, WR 1 completes %s, WR 2 flushes (%d completions: %s, %s, %s)",
	      what, ibv_wc_status_str(status), n, n > 0 ? ibv_wc_status_str(wc[0].status) : "-",
	      n > 1 ? ibv_wc_status_str(wc[1].status) : "-",
	      n > 2 ? ibv_wc_status_str(wc[2].status) : "-");
	{
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;

		CHECK(!ibv_query_qp(s->qp, &a, IBV_QP_STATE, &ia) && a.qp_state == IBV_QPS_ERR,
		      "%s: and the QP is in ERR", what);
	}
}

/* A UD QP in RTS on the side's CQ, its Q_Key qkey. */
static struct ibv_qp *ud_qp(struct side *s, uint32_t qkey)
{
	struct ibv_qp_init_attr qa = {0};
	struct ibv_qp_attr a = {0};
	struct ibv_qp *qp;

	qa.send_cq = qa.recv_cq = s->cq;
	qa.qp_type = IBV_QPT_UD;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = DEPTH;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qp = ibv_create_qp(s->pd, &qa);
	if (!qp)
		die("ibv_create_qp UD");
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qkey = qkey;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("UD INIT");
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		die("UD RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("UD RTS");
	return qp;
}

/* Three UD SENDs to the QP itself, WR 1's AH of another PD than the QP's: the daemon
 * refuses it (ibv_post_send's EINVAL on requests; a WQE it cannot execute on a ring,
 * IBV_WC_LOC_QP_OP_ERR, as rxe completes a WQE whose AV it cannot use). */
static void ud_ah_of_another_pd(struct side *s)
{
	struct ibv_ah_attr aa = {0};
	struct ibv_pd *pd2 = ibv_alloc_pd(s->ctx);
	struct ibv_ah *mine, *theirs;
	struct ibv_sge sg = {(uintptr_t)s->buf, 8, s->mr->lkey};
	struct ibv_send_wr w[3];
	int i;

	if (!pd2)
		die("ibv_alloc_pd");
	aa.is_global = 1;
	aa.port_num = 1;
	aa.grh.dgid = s->gid;
	aa.grh.hop_limit = 1;
	mine = ibv_create_ah(s->pd, &aa);
	theirs = ibv_create_ah(pd2, &aa);
	if (!mine || !theirs)
		die("ibv_create_ah");
	if (s->qp && ibv_destroy_qp(s->qp))
		die("ibv_destroy_qp");
	s->qp = ud_qp(s, 0x11111111);
	memset(w, 0, sizeof(w));
	for (i = 0; i < 3; i++) {
		w[i].wr_id = (uint64_t)i;
		w[i].opcode = IBV_WR_SEND;
		w[i].sg_list = &sg;
		w[i].num_sge = 1;
		w[i].send_flags = IBV_SEND_SIGNALED;
		w[i].wr.ud.ah = i == 1 ? theirs : mine;
		w[i].wr.ud.remote_qpn = s->qp->qp_num;
		w[i].wr.ud.remote_qkey = 0x11111111;
		w[i].next = i < 2 ? &w[i + 1] : NULL;
	}
	expect_chain(s, "a UD SEND whose AH is of another PD", w, !ring, IBV_WC_LOC_QP_OP_ERR);
	if (ibv_destroy_qp(s->qp) || ibv_destroy_ah(mine) || ibv_destroy_ah(theirs) ||
	    ibv_dealloc_pd(pd2))
		die("destroy");
	s->qp = NULL;
}

static uint64_t max_msg;

static void no_mr(struct side *s, struct ibv_send_wr *w, struct ibv_sge *sg)
{
	(void)s;
	(void)w;
	sg->lkey ^= 0x5a5a5a00;     /* a key no MR of this PD has */
}

static void past_max_msg(struct side *s, struct ibv_send_wr *w, struct ibv_sge *sg)
{
	(void)s;
	(void)w;
	sg->length = (uint32_t)(max_msg + 1);
}

static void atomic_of_4(struct side *s, struct ibv_send_wr *w, struct ibv_sge *sg)
{
	w->opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	w->wr.atomic.remote_addr = (uintptr_t)s->rbuf + 2048;
	w->wr.atomic.rkey = s->rmr->rkey;
	w->wr.atomic.compare_add = 1;
	sg->length = 4;         /* an atomic moves 8 bytes */
}

/* ibv_post_send(3) and ibv_post_recv(3) by the QP's state. */
static void states(struct side *s)
{
	struct ibv_qp_init_attr qa = {0};
	struct ibv_sge sg = {(uintptr_t)s->buf, 8, s->mr->lkey};
	struct ibv_send_wr w = write_wr(s, 9, &sg, 0), *bad;
	struct ibv_recv_wr r = {.wr_id = 10, .sg_list = &sg, .num_sge = 1}, *rbad;
	struct ibv_qp_attr a = {0};
	struct ibv_wc wc[2];
	int rc;

	if (ibv_destroy_qp(s->qp))
		die("ibv_destroy_qp");
	qa.send_cq = qa.recv_cq = s->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = DEPTH;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	s->qp = ibv_create_qp(s->pd, &qa);
	if (!s->qp)
		die("ibv_create_qp");
	rc = ibv_post_send(s->qp, &w, &bad);
	CHECK(rc == EINVAL && bad == &w, "ibv_post_send in RESET: EINVAL (got %s)",
	      strerror(rc));
	rc = ibv_post_recv(s->qp, &r, &rbad);
	CHECK(rc == EINVAL && rbad == &r, "ibv_post_recv in RESET: EINVAL (got %s)",
	      strerror(rc));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = ACCESS;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		die("INIT");
	rc = ibv_post_send(s->qp, &w, &bad);
	CHECK(rc == EINVAL && bad == &w, "ibv_post_send in INIT: EINVAL (got %s)",
	      strerror(rc));
	rc = ibv_post_recv(s->qp, &r, &rbad);
	CHECK(rc == 0, "ibv_post_recv in INIT takes the receive (got %s)", strerror(rc));
	to_state(s, IBV_QPS_ERR);
	rc = ibv_post_send(s->qp, &w, &bad);
	CHECK(rc == 0 && wcs(s, 2, wc) == 2 && wc[0].wr_id == 10 &&
	      wc[0].status == IBV_WC_WR_FLUSH_ERR && wc[1].wr_id == 9 &&
	      wc[1].status == IBV_WC_WR_FLUSH_ERR,
	      "to ERR the receive flushes; ibv_post_send in ERR takes the WR and it flushes");
}

/* A QP to ERR, RESET and connected again takes a queue's depth of WRs, twice. */
static void reset_again(struct side *s)
{
	struct ibv_sge sg = {(uintptr_t)s->buf, 8, s->mr->lkey};
	struct ibv_send_wr w[DEPTH], *bad;
	struct ibv_wc wc[DEPTH];
	struct peer_info me;
	int i, round, ok = 1, rc;

	fresh_qp(s);
	for (i = 0; i < DEPTH; i++) {
		w[i] = write_wr(s, (uint64_t)i, &sg, (uint32_t)(8 * i));
		w[i].next = i + 1 < DEPTH ? &w[i + 1] : NULL;
	}
	if (ibv_post_send(s->qp, w, &bad) || wcs(s, DEPTH, wc) != DEPTH)
		die("a depth of WRITEs");
	for (i = 0; i < 3; i++)
		if (ibv_post_send(s->qp, w + DEPTH - 1, &bad))
			die("WRITE");
	to_state(s, IBV_QPS_ERR);
	to_state(s, IBV_QPS_RESET);
	while (ibv_poll_cq(s->cq, DEPTH, wc) > 0)
		;
	me = (struct peer_info){s->qp->qp_num, 0, 0, s->gid};
	connect_qp(s, &me);
	for (round = 0; round < 2; round++) {
		rc = ibv_post_send(s->qp, w, &bad);
		ok &= rc == 0 && wcs(s, DEPTH, wc) == DEPTH;
		for (i = 0; i < DEPTH; i++)
			ok &= wc[i].wr_id == (uint64_t)i && wc[i].status == IBV_WC_SUCCESS;
	}
	CHECK(ok && quiet(s), "a QP reset and connected again takes %d WRs, twice over", DEPTH);
}

int main(int argc, char **argv)
{
	struct side s = {0};
	struct ibv_port_attr pa;

	if (argc != 2 || (strcmp(argv[1], "ring") && strcmp(argv[1], "requests"))) {
		fprintf(stderr, "usage: wqcheck ring|requests\n");
		return 2;
	}
	ring = !strcmp(argv[1], "ring");
	open_ctx(&s);
	if (ibv_query_port(s.ctx, 1, &pa))
		die("ibv_query_port");
	max_msg = pa.max_msg_sz;
	s.buf = unaligned(4096, 1);
	s.rbuf = unaligned(4096, 2);
	s.mr = ibv_reg_mr(s.pd, s.buf, 4096, ACCESS);
	s.rmr = ibv_reg_mr(s.pd, s.rbuf, 4096, ACCESS);
	if (!s.mr || !s.rmr)
		die("ibv_reg_mr");
	inline_reuse(&s);
	bad_middle(&s, "an SGE of an lkey no MR has", no_mr, 0, IBV_WC_LOC_PROT_ERR);
	if (max_msg < UINT32_MAX)
		bad_middle(&s, "a WRITE past max_msg_sz", past_max_msg, !ring, IBV_WC_LOC_LEN_ERR);
	bad_middle(&s, "a FETCH_AND_ADD of a 4-byte SGE", atomic_of_4, 1, IBV_WC_SUCCESS);
	ud_ah_of_another_pd(&s);
	fresh_qp(&s);
	states(&s);
	reset_again(&s);
	return failures ? 1 : 0;
}
