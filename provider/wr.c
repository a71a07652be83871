/* Send and receive WRs as the daemon's requests take them (docs/protocol.md): a WR's
 * encoding (its SGEs, IBV_SEND_INLINE's bytes copied into the QP's bounce pages), a
 * chain of WRs as post requests, and the ibv_wr_* batch of qp_ex.c and dv.c, kept as
 * runs of one kind each and posted in order by ibv_wr_complete. Below qp.c, qp_ex.c and
 * dv.c, which all build WRs; it calls only the connection (conn.c) and verbs.c's MRs. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "softhca.h"
#include "wr.h"


/* IBV_SEND_INLINE: the bytes may be in memory no MR covers (ibv_post_send(3): the
 * lkey is not checked), and the daemon reads them at post time. They are copied into
 * the QP's own registered bounce pages, which the daemon has read before the post's
 * reply comes back, so one post at a time may use them. */
int shca_inline_sge(struct shca_qp *qp, const struct ibv_sge *sg, int n,
		    struct ibv_sge *out)
{
	size_t total = 0, need;
	int i;

	for (i = 0; i < n; i++)
		total += sg[i].length;
	if (total > qp->max_inline) {
		shca_log("ibv_post_send: EINVAL: %zu bytes of inline data exceed max_inline_data "
			 "%u", total, qp->max_inline);
		return EINVAL;
	}
	need = (size_t)qp->max_inline * SHCA_MAX_WRS_PER_POST;
	if (!qp->bounce) {
		struct ibv_mr *mr;

		if (posix_memalign((void **)&qp->bounce_buf, 4096, need))
			return ENOMEM;
		mr = shca_reg_mr(qp->vqp.qp.pd, qp->bounce_buf, need,
				 (uintptr_t)qp->bounce_buf, 0);
		if (!mr) {
			free(qp->bounce_buf);
			qp->bounce_buf = NULL;
			return errno;
		}
		qp->bounce = to_smr(mr);
	}
	out->addr = (uintptr_t)qp->bounce_buf + qp->bounce_used;
	out->length = (uint32_t)total;
	out->lkey = qp->bounce->vmr.ibv_mr.lkey;
	for (i = 0; i < n; i++) {
		memcpy(qp->bounce_buf + qp->bounce_used, (void *)(uintptr_t)sg[i].addr,
		       sg[i].length);
		qp->bounce_used += sg[i].length;
	}
	return 0;
}

int shca_encode_send_wr(struct shca_qp *qp, struct mp_buf *b, const struct ibv_send_wr *wr,
			int bounced)
{
	const struct ibv_sge *sg = wr->sg_list;
	struct ibv_sge one = {0};
	int rc, ud, nsge = wr->num_sge;

	/* Refused here, at its WR (an opcode the device does not know among them); the
	 * ones it knows but a QP cannot take the daemon refuses (at the same WR). */
	rc = shca_send_wr_shape(qp, wr);
	if (rc)
		return rc;
	ud = qp->vqp.qp.qp_type == IBV_QPT_UD;
	if (ud && !wr->wr.ud.ah) {
		shca_log("ibv_post_send: EINVAL: a UD WR needs wr.ud.ah");
		return EINVAL;
	}
	if (wr->opcode == IBV_WR_BIND_MW && !wr->bind_mw.mw)
		return EINVAL;
	if ((wr->send_flags & IBV_SEND_INLINE) && wr->num_sge && !bounced) {
		rc = shca_inline_sge(qp, wr->sg_list, wr->num_sge, &one);
		if (rc)
			return rc;
		sg = &one;
		nsge = 1;
	}
	/* the map itself is wire_enc.c's (tests/unit/test_wire_codec.py holds it to the
	 * daemon's decoder); here what only the QP knows: the handles of its AH and MW */
	shca_wire_send_wr(b, wr, sg, nsge, ud,
			  ud ? to_sah(wr->wr.ud.ah)->handle : 0,
			  wr->opcode == IBV_WR_BIND_MW ? to_smw(wr->bind_mw.mw)->handle : 0);
	return 0;
}

/* n encoded WRs as one post_send request. all: the WRs of an ibv_wr_complete, which
 * the daemon posts all or none (ibv_wr_post(3)); else ibv_post_send's, taken in order
 * up to the first refused (*taken then says how many). */
int shca_post_send_batch(struct shca_qp *qp, struct mp_buf *wrs, uint32_t n, int all,
			 uint32_t *taken)
{
	struct shca_context *ctx = to_sctx(qp->vqp.qp.context);
	struct mp_buf b;

	shca_begin(ctx->conn, &b, SHCA_V_POST_SEND, SHCA_POST_SEND_NFIELDS(all));
	shca_wire_post_send(&b, qp->handle, wrs, n, all);
	return shca_call_post(ctx->conn, &b, taken);
}

static struct ibv_recv_wr *recv_nth(struct ibv_recv_wr *wr, uint32_t i)
{
	while (i-- && wr)
		wr = wr->next;
	return wr;
}

/* ibv_post_recv and ibv_post_srq_recv: the chain wr as requests of verb (the queue's
 * handle under key) of up to SHCA_MAX_WRS_PER_POST WRs each, every WR's num_sge checked
 * against max_sge (what is named "limit" in the log line) before its request goes.
 * *bad as for ibv_post_send: a WR refused here ends its request before it (the WRs
 * ahead of it still go), and a request the daemon refuses in part names the WR. */
_Static_assert(SHCA_NREQ_POST_RECV == SHCA_NREQ_POST_SRQ_RECV,
	       "post_recv and post_srq_recv take as many fields (one request head below)");

int shca_post_recv_wrs(struct shca_context *ctx, const char *verb, const char *key,
		       uint32_t handle, uint32_t max_sge, const char *limit,
		       struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct ibv_recv_wr *w, *first;
	struct mp_buf b;
	uint32_t n, i, taken;
	int rc = 0, sent;

	while (wr && !rc) {
		first = wr;
		for (n = 0, w = wr; w && n < SHCA_MAX_WRS_PER_POST; w = w->next, n++) {
			if (w->num_sge < 0 || w->num_sge > SHCA_MAX_SGE ||
			    (uint32_t)w->num_sge > max_sge) {
				shca_log("ibv_%s: EINVAL: num_sge %d exceeds the %s %u", verb,
					 w->num_sge, limit, max_sge);
				rc = EINVAL;
				break;
			}
			if (w->num_sge && !w->sg_list) {
				shca_log("ibv_%s: EINVAL: wr_id %llu has num_sge %d and no sg_list",
					 verb, (unsigned long long)w->wr_id, w->num_sge);
				rc = EINVAL;
				break;
			}
		}
		/* w: the WR refused here, or the first of the next request */
		sent = 0;
		if (n) {
			shca_begin(ctx->conn, &b, verb, SHCA_NREQ_POST_RECV);
			mp_kv_uint(&b, key, handle);
			mp_str(&b, SHCA_K_WRS);
			mp_arr(&b, n);
			for (i = 0, wr = first; i < n; i++, wr = wr->next)
				shca_wire_recv_wr(&b, wr);
			sent = shca_call_post(ctx->conn, &b, &taken);
		}
		if (sent) {
			rc = sent;
			w = recv_nth(first, taken < n ? taken : 0);
		}
		if (rc)
			*bad = w;
		wr = w;
	}
	return rc;
}

void shca_wr_fail(struct shca_qp *qp, int err)
{
	if (!qp->wr_error)
		qp->wr_error = err;
}

int shca_batch_run(struct shca_qp *qp, int kind)
{
	struct shca_run *r;

	if (qp->run_kind == kind || !qp->nwrs) {
		qp->run_kind = kind;
		return 0;
	}
	if (qp->nruns == qp->cap_runs) {
		uint32_t cap = qp->cap_runs ? qp->cap_runs * 2 : 4;

		r = realloc(qp->runs, cap * sizeof(*r));
		if (!r)
			return ENOMEM;
		qp->runs = r;
		qp->cap_runs = cap;
	}
	r = &qp->runs[qp->nruns++];
	r->kind = qp->run_kind;
	r->buf = qp->wrs;
	r->n = qp->nwrs;
	mp_init(&qp->wrs);
	qp->nwrs = 0;
	qp->run_kind = kind;
	return 0;
}

void shca_batch_free(struct shca_qp *qp)
{
	uint32_t i;

	for (i = 0; i < qp->nruns; i++)
		mp_free(&qp->runs[i].buf);
	free(qp->runs);
	qp->runs = NULL;
	qp->nruns = qp->cap_runs = 0;
	mp_free(&qp->wrs);
	qp->nwrs = 0;
	qp->run_kind = 0;
	qp->batch_sends = 0;
	qp->cfg_open = 0;
	qp->sq_staged = 0;     /* a ring batch's WQEs not published are forgotten */
}

/* The WR being built goes into the batch (at the next builder or at complete). */
void shca_wr_close(struct shca_qp *qp)
{
	int rc;

	if (!qp->wr_open)
		return;
	qp->wr_open = 0;
	if (qp->wr_error)
		return;
	/* the bounce pages hold the inline data of this many WRs */
	if (qp->batch_sends >= SHCA_MAX_WRS_PER_POST) {
		shca_log("ibv_wr_complete: ENOMEM: more than %d send WRs in one batch",
			 SHCA_MAX_WRS_PER_POST);
		shca_wr_fail(qp, ENOMEM);
		return;
	}
	if (qp->sq.base) {
		/* a ring QP's batch goes into its send ring (wq.c) */
		rc = shca_wq_stage(qp, &qp->cur);
		if (rc)
			shca_wr_fail(qp, rc);
		else
			qp->batch_sends++;
		return;
	}
	rc = shca_batch_run(qp, SHCA_RUN_SEND);
	if (!rc)
		rc = shca_encode_send_wr(qp, &qp->wrs, &qp->cur, qp->cur_bounced);
	if (rc) {
		shca_wr_fail(qp, rc);
	} else {
		qp->nwrs++;
		qp->batch_sends++;
	}
}

void shca_dv_end_configure(struct shca_qp *qp)
{
	if (!qp->cfg_open)
		return;
	qp->cfg_open = 0;
	if (qp->cfg_got < qp->cfg_need) {
		shca_log("mlx5dv_wr_mkey_configure: EINVAL: %u setters announced, %u called",
			 qp->cfg_need, qp->cfg_got);
		shca_wr_fail(qp, EINVAL);
	}
}

/* A run of MKEY configure calls as one mkey_configure request, applied whole. */
static int post_configure(struct shca_qp *qp, struct shca_run *run)
{
	struct shca_context *ctx = to_sctx(qp->vqp.qp.context);
	struct mp_buf b;
	struct shca_frame r;
	int rc;

	shca_begin(ctx->conn, &b, SHCA_V_MKEY_CONFIGURE, SHCA_NREQ_MKEY_CONFIGURE);
	mp_kv_uint(&b, SHCA_K_QP, qp->handle);
	mp_str(&b, SHCA_K_CALLS);
	mp_arr(&b, run->n);
	mp_raw(&b, run->buf.p, run->buf.len);
	b.failed |= run->buf.failed;
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (!rc)
		shca_frame_free(&r);
	return rc;
}

static int post_run(struct shca_qp *qp, struct shca_run *r)
{
	uint32_t taken;

	if (!r->n)
		return 0;
	if (r->kind == SHCA_RUN_CONFIGURE)
		return post_configure(qp, r);
	return shca_post_send_batch(qp, &r->buf, r->n, 1, &taken);
}

/* ibv_wr_complete's posting: the open run closed, every run in order, each one request;
 * the first refused stops the batch (the runs before it stay posted). */
int shca_batch_post(struct shca_qp *qp)
{
	uint32_t i;
	int rc;

	if (qp->sq.base)
		return shca_wq_commit(qp);
	rc = shca_batch_run(qp, 0);     /* closes the open run */
	for (i = 0; !rc && i < qp->nruns; i++)
		rc = post_run(qp, &qp->runs[i]);
	return rc;
}
