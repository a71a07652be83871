/* Memory windows, ibv_rereg_mr and ibv_resize_cq over the daemon (server/mw_verbs.py;
 * docs/semantics.md section 11 says what the device does with them).
 *
 * A window is the daemon's object: ibv_alloc_mw names it by the session's handle, and
 * its binds are work requests of a QP's send queue, posted with the window's handle
 * (shca_encode_send_wr's "bind"). ibv_bind_mw (type 1) posts one and gives the window
 * its next rkey at once, as the verb does; libibverbs' inline ibv_bind_mw has already
 * refused a type 2 window and an MR of another PD. */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "softhca.h"

struct ibv_mw *shca_alloc_mw(struct ibv_pd *ibpd, enum ibv_mw_type type)
{
	struct shca_context *ctx = to_sctx(ibpd->context);
	struct shca_pd *pd = to_spd(ibpd);
	struct shca_mw *mw = calloc(1, sizeof(*mw));
	struct mp_buf b;
	struct shca_frame r;
	int rc;

	if (!mw) {
		errno = ENOMEM;
		return NULL;
	}
	shca_begin(ctx->conn, &b, SHCA_V_ALLOC_MW, SHCA_NREQ_ALLOC_MW);
	mp_kv_uint(&b, SHCA_K_PD, pd->handle);
	mp_kv_uint(&b, SHCA_K_TYPE, (uint32_t)type);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = shca_get_u32(&r, SHCA_R_MW, &mw->handle);
		if (!rc)
			rc = shca_get_u32(&r, SHCA_R_RKEY, &mw->mw.rkey);
		shca_frame_free(&r);
	}
	if (rc) {
		free(mw);
		errno = rc;
		return NULL;
	}
	mw->mw.context = ibpd->context;
	mw->mw.pd = ibpd;
	mw->mw.type = type;
	mw->mw.handle = mw->handle;
	return &mw->mw;
}

int shca_dealloc_mw(struct ibv_mw *ibmw)
{
	struct shca_mw *mw = to_smw(ibmw);
	int rc = shca_call_simple(to_sctx(ibmw->context), SHCA_V_DEALLOC_MW, SHCA_K_MW, mw->handle);

	if (!rc)
		free(mw);
	return rc;
}

int shca_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind)
{
	struct ibv_send_wr wr, *bad = NULL;
	int rc;

	if (mw_bind->bind_info.mw_access_flags & IBV_ACCESS_ZERO_BASED) {
		shca_log("ibv_bind_mw: EINVAL: zero-based windows are not supported");
		return EINVAL;
	}
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = mw_bind->wr_id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = mw_bind->send_flags;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info = mw_bind->bind_info;
	rc = qp->context->ops.post_send(qp, &wr, &bad);
	if (rc)
		return rc;
	/* ibv_bind_mw(3): the new rkey is the window's now; the user undoes it if the
	 * bind completes in error. */
	mw->rkey = wr.bind_mw.rkey;
	return 0;
}

int shca_rereg_mr(struct verbs_mr *vmr, int flags, struct ibv_pd *pd, void *addr,
		  size_t length, int access)
{
	struct shca_mr *mr = to_smr(&vmr->ibv_mr);
	struct shca_context *ctx = to_sctx(vmr->ibv_mr.context);
	struct mp_buf b;
	struct shca_frame r;
	int rc;

	(void)addr;
	(void)length;
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		/* The new pages would have to be shared with the daemon as ibv_reg_mr shares
		 * them (mem.c); not modelled: deregister and register again. */
		shca_log("ibv_rereg_mr: EOPNOTSUPP: IBV_REREG_MR_CHANGE_TRANSLATION");
		return EOPNOTSUPP;
	}
	shca_begin(ctx->conn, &b, SHCA_V_REREG_MR, SHCA_NREQ_REREG_MR + 2 /* pd, access */);
	mp_kv_uint(&b, SHCA_K_MR, mr->handle);
	mp_kv_uint(&b, SHCA_K_FLAGS, (uint32_t)flags);
	mp_kv_uint(&b, SHCA_K_PD, (flags & IBV_REREG_MR_CHANGE_PD) && pd ?
		   to_spd(pd)->handle : 0);
	mp_kv_uint(&b, SHCA_K_ACCESS, (uint32_t)access);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (!rc)
		shca_frame_free(&r);
	return rc;
}

int shca_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct shca_context *ctx = to_sctx(ibcq->context);
	struct shca_cq *cq = to_scq(ibcq);
	struct ibv_wc *ring;
	struct mp_buf b;
	struct shca_frame r;
	uint32_t i;
	int rc;

	if (cqe <= 0 || cqe > ctx->attr.max_cqe) {
		shca_log("ibv_resize_cq: EINVAL: cqe %d is outside [1, max_cqe %d]", cqe,
			 ctx->attr.max_cqe);
		return EINVAL;
	}
	if (cq->shared.base)
		return shca_cq_ring_resize(ctx, cq, cqe);
	ring = shca_alloc((size_t)cqe * sizeof(*ring));
	if (!ring)
		return ENOMEM;
	/* The daemon refuses fewer entries than it has pushed and this process has not
	 * polled; from its reply on it pushes at most cqe, so the ring's entries fit. */
	shca_begin(ctx->conn, &b, SHCA_V_RESIZE_CQ, SHCA_NREQ_RESIZE_CQ);
	mp_kv_uint(&b, SHCA_K_CQ, cq->handle);
	mp_kv_uint(&b, SHCA_K_CQE, (uint32_t)cqe);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (rc) {
		shca_free(ring);
		return rc;
	}
	shca_frame_free(&r);
	pthread_mutex_lock(&ctx->conn->core.lock);
	for (i = 0; i < cq->count && i < (uint32_t)cqe; i++)
		ring[i] = cq->ring[(cq->head + i) % cq->cap];
	shca_free(cq->ring);
	cq->ring = ring;
	cq->cap = (uint32_t)cqe;
	cq->head = 0;
	ibcq->cqe = cqe;
	pthread_mutex_unlock(&ctx->conn->core.lock);
	return 0;
}
