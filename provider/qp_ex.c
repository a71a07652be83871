/* The extended post-send API (ibv_wr_post(3)): between ibv_wr_start and
 * ibv_wr_complete each builder opens a WR with the QP's wr_id and wr_flags and the
 * setters give it its data. mlx5dv's MKEY configure builders (dv.c) add their calls to
 * the same batch. ibv_wr_complete posts the batch in order, as runs: consecutive send
 * WRs in one post_send request marked wr_complete, consecutive configure calls in one
 * mkey_configure request; the daemon applies a request whole or refuses it whole: a
 * send run is checked WR by WR, the send queue's room for all of it included, before
 * any of it is posted (ibv_wr_post(3): a posting that fails is aborted whole, none of
 * it reaches the queue; no room is ENOMEM, as mlx5's overflow check gives). ibv_wr_abort
 * drops the batch. A failed setter, a misplaced call or a builder this device does not
 * model makes ibv_wr_complete fail, posting nothing. A batch that mixes both kinds is
 * not one request, though: when the daemon refuses a later run (say a configure whose
 * values are wrong), the runs before it stay posted (docs/native.md). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "softhca.h"
#include "wr.h"

static void open_wr(struct ibv_qp_ex *qpx, enum ibv_wr_opcode op)
{
	struct shca_qp *qp = to_sqp_ex(qpx);

	shca_wr_close(qp);
	shca_dv_end_configure(qp);
	memset(&qp->cur, 0, sizeof(qp->cur));
	qp->cur.wr_id = qpx->wr_id;
	qp->cur.send_flags = qpx->wr_flags;
	qp->cur.opcode = op;
	qp->cur.sg_list = qp->cur_sge;
	qp->cur_bounced = 0;
	qp->wr_open = 1;
}

/* ibv_wr_post(3), CONCURRENCY: ibv_wr_start .. ibv_wr_complete/abort is a critical
 * section of the QP, which the provider's lock makes; it is ibv_post_send's too, since
 * both fill the QP's bounce pages with inline data from their start. */
static void wr_start(struct ibv_qp_ex *qpx)
{
	struct shca_qp *qp = to_sqp_ex(qpx);

	pthread_mutex_lock(&qp->post_lock);
	shca_batch_free(qp);
	qp->wr_error = 0;
	qp->wr_open = 0;
	qp->bounce_used = 0;
}

static int wr_complete(struct ibv_qp_ex *qpx)
{
	struct shca_qp *qp = to_sqp_ex(qpx);
	int rc;

	shca_wr_close(qp);
	shca_dv_end_configure(qp);
	rc = qp->wr_error;
	if (!rc)
		rc = shca_batch_post(qp);
	shca_batch_free(qp);
	qp->wr_error = 0;
	pthread_mutex_unlock(&qp->post_lock);
	return rc;
}

static void wr_abort(struct ibv_qp_ex *qpx)
{
	struct shca_qp *qp = to_sqp_ex(qpx);

	shca_batch_free(qp);
	qp->wr_open = 0;
	qp->wr_error = 0;
	pthread_mutex_unlock(&qp->post_lock);
}

static void wr_send(struct ibv_qp_ex *qpx)
{
	open_wr(qpx, IBV_WR_SEND);
}

static void wr_send_imm(struct ibv_qp_ex *qpx, __be32 imm)
{
	open_wr(qpx, IBV_WR_SEND_WITH_IMM);
	to_sqp_ex(qpx)->cur.imm_data = imm;
}

static void wr_send_inv(struct ibv_qp_ex *qpx, uint32_t rkey)
{
	open_wr(qpx, IBV_WR_SEND_WITH_INV);
	to_sqp_ex(qpx)->cur.invalidate_rkey = rkey;
}

static void wr_rdma(struct ibv_qp_ex *qpx, enum ibv_wr_opcode op, uint32_t rkey,
		    uint64_t addr)
{
	open_wr(qpx, op);
	to_sqp_ex(qpx)->cur.wr.rdma.rkey = rkey;
	to_sqp_ex(qpx)->cur.wr.rdma.remote_addr = addr;
}

static void wr_rdma_write(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr)
{
	wr_rdma(qpx, IBV_WR_RDMA_WRITE, rkey, addr);
}

static void wr_rdma_write_imm(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr,
			      __be32 imm)
{
	wr_rdma(qpx, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, addr);
	to_sqp_ex(qpx)->cur.imm_data = imm;
}

static void wr_rdma_read(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr)
{
	wr_rdma(qpx, IBV_WR_RDMA_READ, rkey, addr);
}

static void wr_atomic(struct ibv_qp_ex *qpx, enum ibv_wr_opcode op, uint32_t rkey,
		      uint64_t addr, uint64_t compare_add, uint64_t swap)
{
	struct shca_qp *qp = to_sqp_ex(qpx);

	open_wr(qpx, op);
	qp->cur.wr.atomic.rkey = rkey;
	qp->cur.wr.atomic.remote_addr = addr;
	qp->cur.wr.atomic.compare_add = compare_add;
	qp->cur.wr.atomic.swap = swap;
}

static void wr_atomic_cmp_swp(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr,
			      uint64_t compare, uint64_t swap)
{
	wr_atomic(qpx, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, addr, compare, swap);
}

static void wr_atomic_fetch_add(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr,
				uint64_t add)
{
	wr_atomic(qpx, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, addr, add, 0);
}

static void unsupported(struct ibv_qp_ex *qpx, const char *what)
{
	struct shca_qp *qp = to_sqp_ex(qpx);

	shca_wr_close(qp);
	shca_dv_end_configure(qp);
	shca_log("%s: EOPNOTSUPP: not modelled on an RC QP of softhca", what);
	shca_wr_fail(qp, EOPNOTSUPP);
}

static void wr_local_inv(struct ibv_qp_ex *qpx, uint32_t rkey)
{
	open_wr(qpx, IBV_WR_LOCAL_INV);
	to_sqp_ex(qpx)->cur.invalidate_rkey = rkey;
}

/* A window's bind (provider/mw.c; the device's checks are the daemon's). */
static void wr_bind_mw(struct ibv_qp_ex *qpx, struct ibv_mw *mw, uint32_t rkey,
		       const struct ibv_mw_bind_info *info)
{
	struct shca_qp *qp = to_sqp_ex(qpx);

	open_wr(qpx, IBV_WR_BIND_MW);
	qp->cur.bind_mw.mw = mw;
	qp->cur.bind_mw.rkey = rkey;
	if (info)
		qp->cur.bind_mw.bind_info = *info;
}

static void wr_send_tso(struct ibv_qp_ex *qpx, void *hdr, uint16_t sz, uint16_t mss)
{
	(void)hdr;
	(void)sz;
	(void)mss;
	unsupported(qpx, "ibv_wr_send_tso");
}

/* ibv_wr_set_ud_addr(3): the open WR's wr.ud (a UD QP's; shca_encode_send_wr sends it). */
static void wr_set_ud_addr(struct ibv_qp_ex *qpx, struct ibv_ah *ah, uint32_t qpn,
			   uint32_t qkey)
{
	to_sqp_ex(qpx)->cur.wr.ud.ah = ah;
	to_sqp_ex(qpx)->cur.wr.ud.remote_qpn = qpn;
	to_sqp_ex(qpx)->cur.wr.ud.remote_qkey = qkey;
}

static void wr_set_xrc_srqn(struct ibv_qp_ex *qpx, uint32_t srqn)
{
	(void)srqn;
	unsupported(qpx, "ibv_wr_set_xrc_srqn");
}

/* The 8 bytes travel in the WR (compare_add, little-endian as they lie in memory), as
 * rxe copies them into its WQE; shca_encode_send_wr sends them for a WR without SGEs. */
static void wr_atomic_write(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr,
			    const void *data)
{
	struct shca_qp *qp = to_sqp_ex(qpx);
	uint64_t v = 0;
	int i;

	open_wr(qpx, IBV_WR_ATOMIC_WRITE);
	for (i = 7; i >= 0; i--)
		v = (v << 8) | ((const uint8_t *)data)[i];
	qp->cur.wr.atomic.rkey = rkey;
	qp->cur.wr.atomic.remote_addr = addr;
	qp->cur.wr.atomic.compare_add = v;
}

static int need_open(struct shca_qp *qp, const char *what)
{
	if (qp->wr_open)
		return 1;
	shca_log("%s: EINVAL: no WR was started by a builder", what);
	shca_wr_fail(qp, EINVAL);
	return 0;
}

static void wr_set_sge_list(struct ibv_qp_ex *qpx, size_t n, const struct ibv_sge *sg)
{
	struct shca_qp *qp = to_sqp_ex(qpx);

	if (!need_open(qp, "ibv_wr_set_sge_list"))
		return;
	if (n > sizeof(qp->cur_sge) / sizeof(qp->cur_sge[0])) {
		qp->wr_error = EINVAL;
		return;
	}
	memcpy(qp->cur_sge, sg, n * sizeof(*sg));
	qp->cur.num_sge = (int)n;
	qp->cur.send_flags &= ~IBV_SEND_INLINE;
	qp->cur_bounced = 0;
}

static void wr_set_sge(struct ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr, uint32_t len)
{
	struct ibv_sge sge = {.addr = addr, .length = len, .lkey = lkey};

	wr_set_sge_list(qpx, 1, &sge);
}

/* ibv_wr_set_inline_data(3): the bytes are copied now, the buffer is the caller's again
 * when the call returns. */
static void wr_set_inline_data_list(struct ibv_qp_ex *qpx, size_t n,
				    const struct ibv_data_buf *bufs)
{
	struct shca_qp *qp = to_sqp_ex(qpx);
	struct ibv_sge sg[32];
	size_t i;
	int rc;

	if (!need_open(qp, "ibv_wr_set_inline_data"))
		return;
	if (n > sizeof(sg) / sizeof(sg[0])) {
		qp->wr_error = EINVAL;
		return;
	}
	for (i = 0; i < n; i++) {
		sg[i].addr = (uintptr_t)bufs[i].addr;
		sg[i].length = (uint32_t)bufs[i].length;
		sg[i].lkey = 0;
	}
	rc = shca_inline_sge(qp, sg, (int)n, &qp->cur_sge[0]);
	if (rc) {
		qp->wr_error = rc;
		return;
	}
	qp->cur.num_sge = 1;
	qp->cur.send_flags |= IBV_SEND_INLINE;
	qp->cur_bounced = 1;
}

static void wr_set_inline_data(struct ibv_qp_ex *qpx, void *addr, size_t len)
{
	struct ibv_data_buf b = {.addr = addr, .length = len};

	wr_set_inline_data_list(qpx, 1, &b);
}

void shca_qp_ex_init(struct shca_qp *qp, uint64_t send_ops_flags)
{
	struct ibv_qp_ex *x = &qp->vqp.qp_ex;

	(void)send_ops_flags;
	mp_init(&qp->wrs);
	x->wr_start = wr_start;
	x->wr_complete = wr_complete;
	x->wr_abort = wr_abort;
	x->wr_send = wr_send;
	x->wr_send_imm = wr_send_imm;
	x->wr_send_inv = wr_send_inv;
	x->wr_rdma_write = wr_rdma_write;
	x->wr_rdma_write_imm = wr_rdma_write_imm;
	x->wr_rdma_read = wr_rdma_read;
	x->wr_atomic_cmp_swp = wr_atomic_cmp_swp;
	x->wr_atomic_fetch_add = wr_atomic_fetch_add;
	x->wr_local_inv = wr_local_inv;
	x->wr_bind_mw = wr_bind_mw;
	x->wr_send_tso = wr_send_tso;
	x->wr_set_ud_addr = wr_set_ud_addr;
	x->wr_set_xrc_srqn = wr_set_xrc_srqn;
	x->wr_atomic_write = wr_atomic_write;
	x->wr_set_sge = wr_set_sge;
	x->wr_set_sge_list = wr_set_sge_list;
	x->wr_set_inline_data = wr_set_inline_data;
	x->wr_set_inline_data_list = wr_set_inline_data_list;
}
