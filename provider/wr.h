/* wr.c: WRs encoded for the daemon's post requests, and the ibv_wr_* batch (the
 * provider's lowest file that knows a QP: qp.c, qp_ex.c, dv.c and srq.c call it). */
#ifndef SOFTHCA_WR_H
#define SOFTHCA_WR_H

#include "softhca.h"

/* SHCA_MAX_WRS_PER_POST (WRs in one post request; the bounce pages hold the inline data
 * of this many) and SHCA_MAX_SGE (SGEs of one WR: max_send_sge, max_recv_sge and an
 * SRQ's max_sge are at most this) are wire.h's, the protocol's limits. */

/* One send WR appended to b (a map the daemon's post_send takes); bounced: its SGE is
 * inline data already in the bounce pages. 0 or an errno (the WR is refused). */
int shca_encode_send_wr(struct shca_qp *qp, struct mp_buf *b, const struct ibv_send_wr *wr,
			int bounced);
/* IBV_SEND_INLINE's bytes of n SGEs copied into the QP's bounce pages, *out their SGE. */
int shca_inline_sge(struct shca_qp *qp, const struct ibv_sge *sg, int n, struct ibv_sge *out);
int shca_post_send_batch(struct shca_qp *qp, struct mp_buf *wrs, uint32_t n, int all,
			 uint32_t *taken);
int shca_post_recv_wrs(struct shca_context *ctx, const char *verb, const char *key,
		       uint32_t handle, uint32_t max_sge, const char *limit,
		       struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

/* The ibv_wr_* batch. The WR a send builder opened goes into the batch. */
void shca_wr_close(struct shca_qp *qp);
/* The open run becomes one of `kind` (the other kind's run is closed); 0 or an errno. */
int shca_batch_run(struct shca_qp *qp, int kind);
/* The batch's first error is the one ibv_wr_complete returns. */
void shca_wr_fail(struct shca_qp *qp, int err);
/* The open mlx5dv_wr_mkey_configure got all its setters (EINVAL into the batch if not). */
void shca_dv_end_configure(struct shca_qp *qp);
/* Every run of the batch posted in order: 0 or the first refusal's errno. */
int shca_batch_post(struct shca_qp *qp);
void shca_batch_free(struct shca_qp *qp);

#endif
