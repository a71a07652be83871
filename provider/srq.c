/* Shared receive queues (ibv_create_srq(3), ibv_modify_srq(3), ibv_query_srq(3),
 * ibv_destroy_srq(3), ibv_post_srq_recv(3)): the daemon's SRQ (engine/srq.py), named
 * by its handle; a QP created with one sends that handle (qp.c), and the daemon's
 * IBV_EVENT_SRQ_LIMIT_REACHED names it (conn.c finds the struct ibv_srq). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "softhca.h"
#include "wr.h"

struct ibv_srq *shca_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct shca_context *ctx = to_sctx(pd->context);
	struct shca_srq *srq;
	struct mp_buf b;
	struct shca_frame r;
	int rc;

	if (!attr) {
		shca_log("ibv_create_srq: EINVAL: no srq_init_attr");
		errno = EINVAL;
		return NULL;
	}
	if (attr->attr.max_sge == 0 || attr->attr.max_sge > SHCA_MAX_SGE) {
		shca_log("ibv_create_srq: EINVAL: max_sge %u outside 1..%d",
			 attr->attr.max_sge, SHCA_MAX_SGE);
		errno = EINVAL;
		return NULL;
	}
	srq = shca_alloc(sizeof(*srq));
	if (!srq) {
		errno = ENOMEM;
		return NULL;
	}
	shca_begin(ctx->conn, &b, SHCA_V_CREATE_SRQ, SHCA_NFIELDS_CREATE_SRQ);
	mp_kv_uint(&b, SHCA_K_PD, to_spd(pd)->handle);
	mp_kv_uint(&b, SHCA_K_MAX_WR, attr->attr.max_wr);
	mp_kv_uint(&b, SHCA_K_MAX_SGE, attr->attr.max_sge);
	mp_kv_uint(&b, SHCA_K_SRQ_LIMIT, attr->attr.srq_limit);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = shca_get_u32(&r, SHCA_R_SRQ, &srq->handle);
		shca_frame_free(&r);
	}
	if (rc) {
		shca_free(srq);
		errno = rc;
		return NULL;
	}
	srq->max_sge = attr->attr.max_sge;
	srq->srq.context = pd->context;
	srq->srq.srq_context = attr->srq_context;
	srq->srq.pd = pd;
	srq->srq.handle = srq->handle;
	pthread_mutex_init(&srq->srq.mutex, NULL);
	pthread_cond_init(&srq->srq.cond, NULL);
	pthread_mutex_lock(&ctx->conn->core.lock);
	srq->next = ctx->srqs;
	ctx->srqs = srq;
	pthread_mutex_unlock(&ctx->conn->core.lock);
	return &srq->srq;
}

int shca_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask)
{
	struct shca_context *ctx = to_sctx(ibsrq->context);
	struct mp_buf b;
	struct shca_frame r;
	int rc;

	if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) || !attr)
		return EINVAL;
	shca_begin(ctx->conn, &b, SHCA_V_MODIFY_SRQ, SHCA_NFIELDS_MODIFY_SRQ);
	mp_kv_uint(&b, SHCA_K_SRQ, to_ssrq(ibsrq)->handle);
	mp_kv_uint(&b, SHCA_K_MASK, (uint32_t)mask);
	mp_kv_uint(&b, SHCA_K_MAX_WR, mask & IBV_SRQ_MAX_WR ? attr->max_wr : 0);
	mp_kv_uint(&b, SHCA_K_SRQ_LIMIT, mask & IBV_SRQ_LIMIT ? attr->srq_limit : 0);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (!rc)
		shca_frame_free(&r);
	return rc;
}

int shca_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct shca_context *ctx = to_sctx(ibsrq->context);
	struct mp_buf b;
	struct shca_frame r;
	struct mp_val a;
	uint64_t x;
	int rc;

	if (!attr)
		return EINVAL;
	shca_begin(ctx->conn, &b, SHCA_V_QUERY_SRQ, SHCA_NREQ_QUERY_SRQ);
	mp_kv_uint(&b, SHCA_K_SRQ, to_ssrq(ibsrq)->handle);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	memset(attr, 0, sizeof(*attr));
	if (!mp_find(r.hdr, SHCA_R_ATTR, &a) || mp_kind(a) != MP_MAP) {
		shca_frame_free(&r);
		return EPROTO;
	}
	if (mp_find_uint(a, SHCA_R_MAX_WR, &x))
		attr->max_wr = (uint32_t)x;
	if (mp_find_uint(a, SHCA_R_MAX_SGE, &x))
		attr->max_sge = (uint32_t)x;
	if (mp_find_uint(a, SHCA_R_SRQ_LIMIT, &x))
		attr->srq_limit = (uint32_t)x;
	shca_frame_free(&r);
	return 0;
}

int shca_destroy_srq(struct ibv_srq *ibsrq)
{
	struct shca_context *ctx = to_sctx(ibsrq->context);
	struct shca_srq *srq = to_ssrq(ibsrq);
	int rc = SHCA_DESTROY_LISTED(ctx, SHCA_V_DESTROY_SRQ, SHCA_K_SRQ, &ctx->srqs, srq);

	if (rc)
		return rc;
	shca_free(srq);
	return 0;
}

int shca_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
		       struct ibv_recv_wr **bad)
{
	struct shca_srq *srq = to_ssrq(ibsrq);

	return shca_post_recv_wrs(to_sctx(ibsrq->context), SHCA_V_POST_SRQ_RECV, SHCA_K_SRQ,
				  srq->handle, srq->max_sge, "SRQ's max_sge", wr, bad);
}
