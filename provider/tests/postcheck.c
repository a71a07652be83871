/* postcheck: what the post verbs and their neighbours do with a careless caller, checked
 * against ibv_post_send(3), ibv_post_recv(3), ibv_create_qp(3) and the IBTA.
 *
 *   postcheck badwr     posts that are partly taken: a chain longer than its queue, a
 *                       chain with a bad opcode or too many SGEs in its middle, on the
 *                       send queue, the receive queue and an SRQ. bad_wr must be the
 *                       first WR not taken, and exactly the WRs before it complete (or
 *                       flush).
 *   postcheck nulls     NULL arguments where a pointer is needed (ibv_create_qp's attr,
 *                       its CQs, ibv_modify_qp's and ibv_query_qp's attrs, an SGE list
 *                       with num_sge 1): each call in a child of its own, which must
 *                       return EINVAL, not die of a signal.
 *   postcheck zerolen   zero-length RDMA WRITE, WRITE_WITH_IMM and READ with rkey 0: a
 *                       zero-length RDMA operation names no memory, so no R_Key is
 *                       checked (IBTA C9-88; rxe skips it); the WRITE_WITH_IMM takes a
 *                       receive and completes it with byte_len 0 and its immediate.
 *   postcheck iova      ibv_reg_mr_iova whose iova + length passes 2^64, and ibv_reg_mr
 *                       whose addr + length does, fail with EINVAL.
 *   postcheck wrbatch   ibv_wr_* runs the send queue cannot take whole: longer than the
 *                       queue, past the provider's 256 WRs, with a WR the verbs forbid in
 *                       the middle, and an aborted one. ibv_wr_post(3): nothing is posted
 *                       unless ibv_wr_complete succeeds, so no completion may follow a
 *                       failed one, and the next run completes with its own WRs only.
 *   postcheck wrthreads ibv_post_send with inline data in one thread and ibv_wr_* runs with
 *                       inline data in another, on one QP: ibv_wr_start .. ibv_wr_complete
 *                       is the QP's critical section (ibv_wr_post(3), CONCURRENCY), so each
 *                       RDMA WRITE lands its own bytes.
 *
 * Expected values come from the man pages and the count of WRs posted, never from
 * softhca. Exit 0 when every check holds; each check prints one line. */
#define PROG "postcheck"
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "side.h"

#define DEPTH 16
#define QUIET_MS 400       /* no completion for this long: none is coming */

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Every completion the CQ gives until it has been quiet for QUIET_MS: up to max of
 * them into wcs; the count of all. */
static int drain(struct ibv_cq *cq, struct ibv_wc *wcs, int max)
{
	double last = now_ms();
	struct ibv_wc wc;
	int n = 0, got;

	while (now_ms() - last < QUIET_MS) {
		got = ibv_poll_cq(cq, 1, &wc);
		if (got < 0)
			die("ibv_poll_cq");
		if (got == 0) {
			usleep(1000);
			continue;
		}
		if (n < max)
			wcs[n] = wc;
		n++;
		last = now_ms();
	}
	return n;
}

/* The side's QP replaced by a new one (on the same CQ, with srq if given) connected to
 * itself. */
static void fresh_qp(struct side *s, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr qa = {0};
	struct peer_info me;

	if (s->qp && ibv_destroy_qp(s->qp))
		die("ibv_destroy_qp");
	qa.send_cq = qa.recv_cq = s->cq;
	qa.srq = srq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = DEPTH;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	s->qp = ibv_create_qp(s->pd, &qa);
	if (!s->qp)
		die("ibv_create_qp");
	me = (struct peer_info){s->qp->qp_num, 0, 0, s->gid};
	connect_qp(s, &me);
}

static void to_err(struct side *s)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};

	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE))
		die("ERR");
}

/* n signaled 8-byte RDMA WRITEs within the side's buffer, wr_id i, chained. */
static struct ibv_send_wr *writes(struct side *s, int n, struct ibv_sge *sge)
{
	struct ibv_send_wr *w = calloc((size_t)n, sizeof(*w));
	int i;

	if (!w)
		die("calloc");
	*sge = (struct ibv_sge){(uintptr_t)s->buf, 8, s->mr->lkey};
	for (i = 0; i < n; i++) {
		w[i].wr_id = (uint64_t)i;
		w[i].opcode = IBV_WR_RDMA_WRITE;
		w[i].sg_list = sge;
		w[i].num_sge = 1;
		w[i].send_flags = IBV_SEND_SIGNALED;
		w[i].wr.rdma.remote_addr = (uintptr_t)s->buf + 2048;
		w[i].wr.rdma.rkey = s->mr->rkey;
		w[i].next = i + 1 < n ? &w[i + 1] : NULL;
	}
	return w;
}

static struct ibv_recv_wr *recvs(struct side *s, int n, struct ibv_sge *sge)
{
	struct ibv_recv_wr *w = calloc((size_t)n, sizeof(*w));
	int i;

	if (!w)
		die("calloc");
	*sge = (struct ibv_sge){(uintptr_t)s->rbuf, 64, s->rmr->lkey};
	for (i = 0; i < n; i++) {
		w[i].wr_id = (uint64_t)i;
		w[i].sg_list = sge;
		w[i].num_sge = 1;
		w[i].next = i + 1 < n ? &w[i + 1] : NULL;
	}
	return w;
}

/* The completions are exactly wr_ids 0 .. want-1, in order, each of status st. */
static int exactly(const struct ibv_wc *wcs, int n, int want, enum ibv_wc_status st)
{
	int i;

	if (n != want)
		return 0;
	for (i = 0; i < n; i++)
		if (wcs[i].wr_id != (uint64_t)i || wcs[i].status != st)
			return 0;
	return 1;
}

static long at(const void *bad, const void *base, size_t size)
{
	return bad ? (long)(((const char *)bad - (const char *)base) / (long)size) : -1;
}

/* A chain of `total` WRITEs on a DEPTH-deep send queue. */
static void send_overflow(struct side *s, int total)
{
	struct ibv_wc wcs[64];
	struct ibv_sge sge;
	struct ibv_send_wr *w, *bad = NULL;
	int rc, n;

	fresh_qp(s, NULL);
	w = writes(s, total, &sge);
	rc = ibv_post_send(s->qp, w, &bad);
	CHECK(rc == ENOMEM && bad == &w[DEPTH], "ibv_post_send of %d WRs on a %d-deep send "
	      "queue: ENOMEM, bad_wr at WR %d (got %s, bad_wr at WR %ld)", total, DEPTH, DEPTH,
	      strerror(rc), at(bad, w, sizeof(*w)));
	n = drain(s->cq, wcs, 64);
	CHECK(exactly(wcs, n, DEPTH, IBV_WC_SUCCESS), "and WRs 0..%d complete, no other "
	      "(%d completions)", DEPTH - 1, n);
	free(w);
}

/* A chain of 3 WRITEs whose WR[1] is bad as spoil makes it; errno want. */
static void send_bad_middle(struct side *s, const char *what, void (*spoil)(struct ibv_send_wr *))
{
	struct ibv_wc wcs[8];
	struct ibv_sge sge;
	struct ibv_send_wr *w, *bad = NULL;
	int rc, n;

	fresh_qp(s, NULL);
	w = writes(s, 3, &sge);
	spoil(&w[1]);
	rc = ibv_post_send(s->qp, w, &bad);
	CHECK(rc == EINVAL && bad == &w[1], "ibv_post_send of 3 WRs whose WR 1 %s: EINVAL, "
	      "bad_wr at WR 1 (got %s, bad_wr at WR %ld)", what, strerror(rc),
	      at(bad, w, sizeof(*w)));
	n = drain(s->cq, wcs, 8);
	CHECK(exactly(wcs, n, 1, IBV_WC_SUCCESS), "and WR 0 completes, no other (%d "
	      "completions)", n);
	free(w);
}

static void bad_opcode(struct ibv_send_wr *w)
{
	w->opcode = (enum ibv_wr_opcode)99;
}

static void two_sges(struct ibv_send_wr *w)
{
	w->num_sge = 2;       /* the QP's max_send_sge is 1 */
}

static void recv_overflow(struct side *s)
{
	struct ibv_wc wcs[64];
	struct ibv_sge sge;
	struct ibv_recv_wr *w, *bad = NULL;
	int rc, n;

	fresh_qp(s, NULL);
	w = recvs(s, 300, &sge);
	rc = ibv_post_recv(s->qp, w, &bad);
	CHECK(rc == ENOMEM && bad == &w[DEPTH], "ibv_post_recv of 300 WRs on a %d-deep "
	      "receive queue: ENOMEM, bad_wr at WR %d (got %s, bad_wr at WR %ld)", DEPTH,
	      DEPTH, strerror(rc), at(bad, w, sizeof(*w)));
	to_err(s);
	n = drain(s->cq, wcs, 64);
	CHECK(exactly(wcs, n, DEPTH, IBV_WC_WR_FLUSH_ERR), "and WRs 0..%d flush at ERR, no "
	      "other (%d completions)", DEPTH - 1, n);
	free(w);

	/* the provider's own refusal in the middle of a chain */
	fresh_qp(s, NULL);
	w = recvs(s, 10, &sge);
	w[5].num_sge = 2;
	rc = ibv_post_recv(s->qp, w, &bad);
	CHECK(rc == EINVAL && bad == &w[5], "ibv_post_recv of 10 WRs whose WR 5 has 2 SGEs "
	      "(max_recv_sge 1): EINVAL, bad_wr at WR 5 (got %s, bad_wr at WR %ld)",
	      strerror(rc), at(bad, w, sizeof(*w)));
	to_err(s);
	n = drain(s->cq, wcs, 64);
	CHECK(exactly(wcs, n, 5, IBV_WC_WR_FLUSH_ERR), "and WRs 0..4 flush at ERR, no other "
	      "(%d completions)", n);
	free(w);
}

static void srq_overflow(struct side *s)
{
	struct ibv_srq_init_attr sa = {0};
	struct ibv_wc wcs[64], rwcs[64];
	struct ibv_sge sge, ssge;
	struct ibv_recv_wr *w, *bad = NULL;
	struct ibv_send_wr *sends, *sbad;
	struct ibv_srq *srq;
	int rc, n, i, nr = 0, ok = 1;

	sa.attr.max_wr = DEPTH;
	sa.attr.max_sge = 1;
	srq = ibv_create_srq(s->pd, &sa);
	if (!srq)
		die("ibv_create_srq");
	w = recvs(s, 300, &sge);
	rc = ibv_post_srq_recv(srq, w, &bad);
	CHECK(rc == ENOMEM && bad == &w[DEPTH], "ibv_post_srq_recv of 300 WRs on a %d-deep "
	      "SRQ: ENOMEM, bad_wr at WR %d (got %s, bad_wr at WR %ld)", DEPTH, DEPTH,
	      strerror(rc), at(bad, w, sizeof(*w)));
	/* DEPTH SENDs take its receives: wr_ids 0..DEPTH-1 in order, then it has room */
	fresh_qp(s, srq);
	sends = writes(s, DEPTH, &ssge);
	for (i = 0; i < DEPTH; i++)
		sends[i].opcode = IBV_WR_SEND;
	if (ibv_post_send(s->qp, sends, &sbad))
		die("post SENDs");
	n = drain(s->cq, wcs, 64);
	for (i = 0; i < n && i < 64; i++) {
		if (wcs[i].opcode != IBV_WC_RECV)
			continue;
		if (wcs[i].status != IBV_WC_SUCCESS)
			ok = 0;
		rwcs[nr++] = wcs[i];
	}
	for (i = 0; i < nr; i++)
		ok &= rwcs[i].wr_id == (uint64_t)i;
	CHECK(ok && nr == DEPTH && n == 2 * DEPTH, "and %d SENDs take WRs 0..%d of it (%d "
	      "receives of %d completions)", DEPTH, DEPTH - 1, nr, n);
	w[0].next = NULL;
	rc = ibv_post_srq_recv(srq, w, &bad);
	CHECK(rc == 0, "and then it has room for one more (%s)", strerror(rc));
	free(sends);
	free(w);
	if (ibv_destroy_qp(s->qp))
		die("ibv_destroy_qp");
	s->qp = NULL;
	if (ibv_destroy_srq(srq))
		die("ibv_destroy_srq");
}

static void mode_badwr(void)
{
	struct side s = {0};

	open_ctx(&s);
	s.buf = unaligned(4096, 1);
	s.rbuf = unaligned(4096, 2);
	s.mr = ibv_reg_mr(s.pd, s.buf, 4096, ACCESS);
	s.rmr = ibv_reg_mr(s.pd, s.rbuf, 4096, ACCESS);
	if (!s.mr || !s.rmr)
		die("ibv_reg_mr");
	send_overflow(&s, 20);
	send_overflow(&s, 100000);
	send_bad_middle(&s, "has opcode 99", bad_opcode);
	send_bad_middle(&s, "has 2 SGEs (max_send_sge 1)", two_sges);
	recv_overflow(&s);
	srq_overflow(&s);
}

/* -- nulls ---------------------------------------------------------------------------- */

/* A call made in a child: what it returns (0 for success, else the errno) as the
 * child's exit status; the parent checks it died of no signal and gave want. */
static void in_child(const char *what, int want, int (*call)(struct side *))
{
	int status;
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		struct side s = {0};
		struct peer_info me;

		open_side(&s);
		s.buf = unaligned(4096, 1);
		s.mr = ibv_reg_mr(s.pd, s.buf, 4096, ACCESS);
		if (!s.mr)
			die("ibv_reg_mr");
		me = (struct peer_info){s.qp->qp_num, 0, 0, s.gid};
		connect_qp(&s, &me);
		_exit(call(&s) & 0xff);
	}
	if (waitpid(pid, &status, 0) != pid)
		die("waitpid");
	if (WIFSIGNALED(status)) {
		CHECK(0, "%s: %s (killed by signal %d: %s)", what, strerror(want),
		      WTERMSIG(status), strsignal(WTERMSIG(status)));
		return;
	}
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == want, "%s: %s (got %s)", what,
	      strerror(want), strerror(WEXITSTATUS(status)));
}

static int qp_null_attr(struct side *s)
{
	errno = 0;
	return ibv_create_qp(s->pd, NULL) ? 0 : errno;
}

static int qp_with(struct side *s, int null_send, int null_recv)
{
	struct ibv_qp_init_attr qa = {0};

	qa.send_cq = null_send ? NULL : s->cq;
	qa.recv_cq = null_recv ? NULL : s->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	errno = 0;
	return ibv_create_qp(s->pd, &qa) ? 0 : errno;
}

static int qp_null_send_cq(struct side *s)
{
	return qp_with(s, 1, 0);
}

static int qp_null_recv_cq(struct side *s)
{
	return qp_with(s, 0, 1);
}

static int modify_null(struct side *s)
{
	return ibv_modify_qp(s->qp, NULL, IBV_QP_STATE);
}

static int query_null_init(struct side *s)
{
	struct ibv_qp_attr a;

	return ibv_query_qp(s->qp, &a, IBV_QP_STATE, NULL);
}

static int query_null_attr(struct side *s)
{
	struct ibv_qp_init_attr ia;

	return ibv_query_qp(s->qp, NULL, IBV_QP_STATE, &ia);
}

/* A chain of two: WR 0 good, WR 1 with a NULL SGE list; bad_wr must name WR 1 and WR 0
 * complete. */
static int send_null_sges(struct side *s)
{
	struct ibv_sge sge;
	struct ibv_send_wr *w = writes(s, 2, &sge), *bad = NULL;
	struct ibv_wc wcs[4];
	int rc;

	w[1].sg_list = NULL;
	rc = ibv_post_send(s->qp, w, &bad);
	if (rc != EINVAL || bad != &w[1] || drain(s->cq, wcs, 4) != 1 || wcs[0].wr_id != 0)
		return rc ? (rc == EINVAL ? EFAULT : rc) : EEXIST;
	return rc;
}

static int recv_null_sges(struct side *s)
{
	struct ibv_recv_wr w = {.wr_id = 1, .sg_list = NULL, .num_sge = 1}, *bad = NULL;
	int rc = ibv_post_recv(s->qp, &w, &bad);

	return rc == EINVAL && bad != &w ? EFAULT : rc;
}

static int srq_null_attr(struct side *s)
{
	errno = 0;
	return ibv_create_srq(s->pd, NULL) ? 0 : errno;
}

static int query_srq_null(struct side *s)
{
	struct ibv_srq_init_attr sa = {0};
	struct ibv_srq *srq;

	sa.attr.max_wr = 4;
	sa.attr.max_sge = 1;
	srq = ibv_create_srq(s->pd, &sa);
	if (!srq)
		return EEXIST;
	return ibv_query_srq(srq, NULL);
}

static int ah_null_attr(struct side *s)
{
	errno = 0;
	return ibv_create_ah(s->pd, NULL) ? 0 : errno;
}

static void mode_nulls(void)
{
	in_child("ibv_create_qp(pd, NULL) fails", EINVAL, qp_null_attr);
	in_child("ibv_create_qp with a NULL send_cq fails", EINVAL, qp_null_send_cq);
	in_child("ibv_create_qp of an RC QP with a NULL recv_cq and no SRQ fails", EINVAL,
		 qp_null_recv_cq);
	in_child("ibv_modify_qp(qp, NULL, IBV_QP_STATE) fails", EINVAL, modify_null);
	in_child("ibv_query_qp with a NULL init_attr fails", EINVAL, query_null_init);
	in_child("ibv_query_qp with a NULL attr fails", EINVAL, query_null_attr);
	in_child("ibv_post_send of a WR with sg_list NULL and num_sge 1 fails at it, the WR "
		 "before it posted", EINVAL, send_null_sges);
	in_child("ibv_post_recv of a WR with sg_list NULL and num_sge 1 fails at it", EINVAL,
		 recv_null_sges);
	in_child("ibv_create_srq(pd, NULL) fails", EINVAL, srq_null_attr);
	in_child("ibv_query_srq(srq, NULL) fails", EINVAL, query_srq_null);
	in_child("ibv_create_ah(pd, NULL) fails", EINVAL, ah_null_attr);
}

/* -- zerolen -------------------------------------------------------------------------- */

static void mode_zerolen(void)
{
	struct side s = {0};
	struct peer_info me;
	struct ibv_sge rsge;
	struct ibv_recv_wr rwr = {0}, *rbad;
	struct ibv_send_wr w = {0}, *bad;
	struct ibv_wc wcs[8];
	int n, i, got_send = 0, got_recv = 0;

	open_side(&s);
	s.rbuf = unaligned(4096, 3);
	s.rmr = ibv_reg_mr(s.pd, s.rbuf, 4096, ACCESS);
	if (!s.rmr)
		die("ibv_reg_mr");
	me = (struct peer_info){s.qp->qp_num, 0, 0, s.gid};
	connect_qp(&s, &me);
	rsge = (struct ibv_sge){(uintptr_t)s.rbuf, 64, s.rmr->lkey};
	rwr.wr_id = 77;
	rwr.sg_list = &rsge;
	rwr.num_sge = 1;
	if (ibv_post_recv(s.qp, &rwr, &rbad))
		die("post_recv");

	w.wr_id = 1;
	w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	w.send_flags = IBV_SEND_SIGNALED;
	w.imm_data = htonl(0x12345678);
	w.num_sge = 0;          /* no bytes, no rkey, no address */
	if (ibv_post_send(s.qp, &w, &bad))
		die("post RDMA_WRITE_WITH_IMM");
	n = drain(s.cq, wcs, 8);
	for (i = 0; i < n && i < 8; i++) {
		if (wcs[i].wr_id == 1)
			got_send = wcs[i].status == IBV_WC_SUCCESS &&
				   wcs[i].opcode == IBV_WC_RDMA_WRITE;
		if (wcs[i].wr_id == 77)
			got_recv = wcs[i].status == IBV_WC_SUCCESS &&
				   wcs[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
				   wcs[i].byte_len == 0 && (wcs[i].wc_flags & IBV_WC_WITH_IMM) &&
				   ntohl(wcs[i].imm_data) == 0x12345678;
	}
	CHECK(n == 2 && got_send, "a zero-length RDMA_WRITE_WITH_IMM with rkey 0 completes "
	      "successfully (%d completions, status %d)", n, n ? (int)wcs[0].status : -1);
	CHECK(got_recv, "and takes a receive: IBV_WC_RECV_RDMA_WITH_IMM, byte_len 0, "
	      "imm_data 0x12345678");

	w.wr_id = 2;
	w.opcode = IBV_WR_RDMA_WRITE;
	if (ibv_post_send(s.qp, &w, &bad))
		die("post RDMA_WRITE");
	n = drain(s.cq, wcs, 8);
	CHECK(n == 1 && wcs[0].wr_id == 2 && wcs[0].status == IBV_WC_SUCCESS,
	      "a zero-length RDMA_WRITE with rkey 0 completes successfully (%d completions, "
	      "status %d)", n, n ? (int)wcs[0].status : -1);

	w.wr_id = 3;
	w.opcode = IBV_WR_RDMA_READ;
	if (ibv_post_send(s.qp, &w, &bad))
		die("post RDMA_READ");
	n = drain(s.cq, wcs, 8);
	CHECK(n == 1 && wcs[0].wr_id == 3 && wcs[0].status == IBV_WC_SUCCESS &&
	      wcs[0].opcode == IBV_WC_RDMA_READ, "a zero-length RDMA_READ with rkey 0 completes "
	      "successfully (%d completions, status %d)", n, n ? (int)wcs[0].status : -1);

	/* the QP is still RTS and its receive queue was not flushed */
	if (ibv_post_recv(s.qp, &rwr, &rbad))
		die("post_recv");
	w.wr_id = 4;
	w.opcode = IBV_WR_SEND;
	if (ibv_post_send(s.qp, &w, &bad))
		die("post SEND");
	n = drain(s.cq, wcs, 8);
	CHECK(n == 2 && wcs[0].status == IBV_WC_SUCCESS && wcs[1].status == IBV_WC_SUCCESS,
	      "and the QP still works: a SEND after them completes on both sides (%d "
	      "completions)", n);
}

/* -- wrbatch -------------------------------------------------------------------------- */

/* The side's QP replaced by an extended one (RDMA WRITE and READ builders) connected to
 * itself, DEPTH deep. */
static void fresh_qp_ex(struct side *s)
{
	struct ibv_qp_init_attr_ex qa = {0};
	struct peer_info me;

	if (s->qp && ibv_destroy_qp(s->qp))
		die("ibv_destroy_qp");
	qa.send_cq = qa.recv_cq = s->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = DEPTH;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = 64;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.pd = s->pd;
	qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ;
	s->qp = ibv_create_qp_ex(s->ctx, &qa);
	if (!s->qp)
		die("ibv_create_qp_ex");
	s->qpx = ibv_qp_to_qp_ex(s->qp);
	me = (struct peer_info){s->qp->qp_num, 0, 0, s->gid};
	connect_qp(s, &me);
}

/* n signaled 8-byte RDMA WRITEs built on the side's extended QP, wr_id i; WR odd (if
 * not -1) an RDMA READ given inline data, which ibv_wr_post(3) allows only for SEND
 * and RDMA_WRITE. */
static void build_writes(struct side *s, int n, int odd)
{
	uint64_t v = 0x1122334455667788ULL;
	int i;

	for (i = 0; i < n; i++) {
		s->qpx->wr_id = (uint64_t)i;
		s->qpx->wr_flags = IBV_SEND_SIGNALED;
		if (i == odd) {
			ibv_wr_rdma_read(s->qpx, s->mr->rkey, (uintptr_t)s->buf + 2048);
			ibv_wr_set_inline_data(s->qpx, &v, sizeof(v));
			continue;
		}
		ibv_wr_rdma_write(s->qpx, s->mr->rkey, (uintptr_t)s->buf + 2048);
		ibv_wr_set_sge(s->qpx, s->mr->lkey, (uintptr_t)s->buf, 8);
	}
}

/* A run of n WRITEs (WR odd spoiled as build_writes does) completed; its return. */
static int run_of(struct side *s, int n, int odd)
{
	ibv_wr_start(s->qpx);
	build_writes(s, n, odd);
	return ibv_wr_complete(s->qpx);
}

/* After a failed run: no completion comes, and a run of 3 then completes WRs 0..2, no
 * other. */
static void nothing_posted(struct side *s, const char *what)
{
	struct ibv_wc wcs[64];
	int n, rc;

	n = drain(s->cq, wcs, 64);
	CHECK(n == 0, "and no WR of %s completes (%d completions)", what, n);
	rc = run_of(s, 3, -1);
	n = drain(s->cq, wcs, 64);
	CHECK(rc == 0 && exactly(wcs, n, 3, IBV_WC_SUCCESS), "and a run of 3 after it "
	      "completes WRs 0..2, no other (%s, %d completions)", strerror(rc), n);
}

static void mode_wrbatch(void)
{
	struct ibv_wc wcs[64];
	struct side s = {0};
	int rc, n;

	open_ctx(&s);
	s.buf = unaligned(4096, 1);
	s.mr = ibv_reg_mr(s.pd, s.buf, 4096, ACCESS);
	if (!s.mr)
		die("ibv_reg_mr");

	/* the queue holds max_send_wr WRs (ibv_create_qp(3)): DEPTH fit, DEPTH + 1 not */
	fresh_qp_ex(&s);
	rc = run_of(&s, DEPTH, -1);
	n = drain(s.cq, wcs, 64);
	CHECK(rc == 0 && exactly(wcs, n, DEPTH, IBV_WC_SUCCESS), "ibv_wr_complete of a run "
	      "of %d WRITEs on a %d-deep send queue: WRs 0..%d complete (%s, %d completions)",
	      DEPTH, DEPTH, DEPTH - 1, strerror(rc), n);
	rc = run_of(&s, DEPTH + 1, -1);
	CHECK(rc == ENOMEM, "ibv_wr_complete of a run of %d WRITEs on a %d-deep send queue "
	      "fails: ENOMEM (got %s)", DEPTH + 1, DEPTH, strerror(rc));
	nothing_posted(&s, "the run of 17");

	/* past the 256 WRs of one posting */
	rc = run_of(&s, 300, -1);
	CHECK(rc == ENOMEM, "ibv_wr_complete of a run of 300 WRITEs fails: ENOMEM (got %s)",
	      strerror(rc));
	nothing_posted(&s, "the run of 300");

	/* a WR the verbs forbid after one that is fine */
	rc = run_of(&s, 3, 1);
	CHECK(rc == EINVAL, "ibv_wr_complete of WRITE, READ with inline data, WRITE fails: "
	      "EINVAL (got %s)", strerror(rc));
	nothing_posted(&s, "the run with a bad WR 1");

	/* ibv_wr_abort discards what was built */
	ibv_wr_start(s.qpx);
	build_writes(&s, 5, -1);
	ibv_wr_abort(s.qpx);
	nothing_posted(&s, "an aborted run of 5");
}

/* -- wrthreads ------------------------------------------------------------------------ */

#define RACE_SLOTS 300
#define SLOT 64

struct racer {
	struct side *s;
	int which;          /* 0: ibv_post_send, 1: ibv_wr_* */
	int failed;         /* a post that failed with other than ENOMEM */
};

static void slot_bytes(int which, int i, uint8_t *out)
{
	int k;

	for (k = 0; k < SLOT; k++)
		out[k] = pat(which + 3, (size_t)i * SLOT + k);
}

/* RACE_SLOTS signaled RDMA WRITEs of SLOT inline bytes each into slot i of the racer's
 * half of the buffer; a full send queue (ENOMEM: nothing of that post was taken) is
 * tried again. */
static void *race(void *arg)
{
	struct racer *r = arg;
	struct side *s = r->s;
	uint8_t data[SLOT];
	uint64_t remote;
	int i, rc;

	for (i = 0; i < RACE_SLOTS; i++) {
		slot_bytes(r->which, i, data);
		remote = (uintptr_t)s->buf + ((size_t)r->which * RACE_SLOTS + i) * SLOT;
		do {
			if (r->which == 0) {
				struct ibv_sge sge = {(uintptr_t)data, SLOT, 0};
				struct ibv_send_wr w = {0}, *bad;

				w.wr_id = (uint64_t)i;
				w.opcode = IBV_WR_RDMA_WRITE;
				w.sg_list = &sge;
				w.num_sge = 1;
				w.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
				w.wr.rdma.remote_addr = remote;
				w.wr.rdma.rkey = s->mr->rkey;
				rc = ibv_post_send(s->qp, &w, &bad);
			} else {
				ibv_wr_start(s->qpx);
				s->qpx->wr_id = (uint64_t)i;
				s->qpx->wr_flags = IBV_SEND_SIGNALED;
				ibv_wr_rdma_write(s->qpx, s->mr->rkey, remote);
				ibv_wr_set_inline_data(s->qpx, data, SLOT);
				rc = ibv_wr_complete(s->qpx);
			}
			if (rc == ENOMEM)
				usleep(200);
		} while (rc == ENOMEM);
		if (rc)
			r->failed++;
	}
	return NULL;
}

static void mode_wrthreads(void)
{
	struct racer r[2];
	pthread_t t[2];
	struct side s = {0};
	struct ibv_wc wc;
	uint8_t want[SLOT];
	double last;
	int i, j, got = 0, bad_wc = 0, wrong = 0, n;

	open_ctx(&s);
	s.cq = ibv_create_cq(s.ctx, 4 * RACE_SLOTS, NULL, NULL, 0);
	s.buf = unaligned(2 * RACE_SLOTS * SLOT, 1);
	memset(s.buf, 0, 2 * RACE_SLOTS * SLOT);
	s.mr = ibv_reg_mr(s.pd, s.buf, 2 * RACE_SLOTS * SLOT, ACCESS);
	if (!s.cq || !s.mr)
		die("ibv_create_cq / ibv_reg_mr");
	fresh_qp_ex(&s);
	for (i = 0; i < 2; i++) {
		r[i] = (struct racer){&s, i, 0};
		if (pthread_create(&t[i], NULL, race, &r[i]))
			die("pthread_create");
	}
	/* every completion, while the racers post and after, until quiet */
	last = now_ms();
	while (got < 2 * RACE_SLOTS && now_ms() - last < 10000) {
		n = ibv_poll_cq(s.cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq");
		if (!n) {
			usleep(100);
			continue;
		}
		got++;
		bad_wc += wc.status != IBV_WC_SUCCESS;
		last = now_ms();
	}
	for (i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	for (j = 0; j < 2; j++) {
		for (i = 0; i < RACE_SLOTS; i++) {
			slot_bytes(j, i, want);
			wrong += memcmp(s.buf + ((size_t)j * RACE_SLOTS + i) * SLOT, want, SLOT) != 0;
		}
	}
	CHECK(!r[0].failed && !r[1].failed && got == 2 * RACE_SLOTS && !bad_wc,
	      "%d ibv_post_send and %d ibv_wr_complete of one inline RDMA WRITE each, from "
	      "two threads on one QP, all complete successfully (%d failed posts, %d "
	      "completions, %d not successful)", RACE_SLOTS, RACE_SLOTS,
	      r[0].failed + r[1].failed, got, bad_wc);
	CHECK(wrong == 0, "and every WRITE landed its own %d bytes (%d of %d slots wrong)",
	      SLOT, wrong, 2 * RACE_SLOTS);
}

/* -- iova ----------------------------------------------------------------------------- */

static void mode_iova(void)
{
	struct side s = {0};
	uint8_t *buf;
	struct ibv_mr *mr;
	uint64_t iova;

	open_ctx(&s);
	buf = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		die("mmap");
	memset(buf, 1, 8192);
	/* the last page of the address space and one past it */
	iova = UINT64_MAX - 4095;
	errno = 0;
	mr = ibv_reg_mr_iova(s.pd, buf, 8192, iova, ACCESS);
	CHECK(!mr && errno == EINVAL, "ibv_reg_mr_iova of 8192 bytes at iova %#llx (past "
	      "2^64) fails: %s", (unsigned long long)iova, strerror(mr ? 0 : errno));
	errno = 0;
	mr = ibv_reg_mr_iova(s.pd, buf, 8192, UINT64_MAX - 8191, ACCESS);
	CHECK(mr != NULL, "ibv_reg_mr_iova of 8192 bytes ending at 2^64 - 1 is registered (%s)",
	      strerror(mr ? 0 : errno));
	if (mr)
		ibv_dereg_mr(mr);
	errno = 0;
	mr = ibv_reg_mr(s.pd, (void *)(uintptr_t)(UINT64_MAX - 4095), 8192, ACCESS);
	CHECK(!mr && errno == EINVAL, "ibv_reg_mr of 8192 bytes at %#llx (addr + length wraps) "
	      "fails: %s", (unsigned long long)(UINT64_MAX - 4095), strerror(mr ? 0 : errno));
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(mode, "badwr"))
		mode_badwr();
	else if (!strcmp(mode, "nulls"))
		mode_nulls();
	else if (!strcmp(mode, "zerolen"))
		mode_zerolen();
	else if (!strcmp(mode, "iova"))
		mode_iova();
	else if (!strcmp(mode, "wrbatch"))
		mode_wrbatch();
	else if (!strcmp(mode, "wrthreads"))
		mode_wrthreads();
	else {
		fprintf(stderr, "usage: postcheck badwr|nulls|zerolen|iova|wrbatch|wrthreads\n");
		return 2;
	}
	return failures ? 1 : 0;
}
