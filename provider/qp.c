/* RC, UC and UD queue pairs: create (plain, extended and mlx5dv_create_qp's), modify (the
 * address vector's softhca GID decoded into the peer daemon), query, destroy, and the two
 * post verbs (their WRs encoded by wr.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "softhca.h"
#include "wr.h"

/* What a QP offers for IBV_SEND_INLINE when asked for less (ibv_create_qp(3): the
 * provider may return more than requested); ConnectX's own figure for RC. */
#define DEFAULT_INLINE 236
#define MAX_INLINE 1024

/* -- QP --------------------------------------------------------------------------- */

/* send_ops_flags: the ibv_wr_* builders the application asked for (ibv_qp_ex; the
 * provider offers them all), dv_send_ops: mlx5dv_create_qp's (the daemon takes MKEY
 * configure WRs on a QP made with MLX5DV_QP_EX_WITH_MKEY_CONFIGURE), create_flags:
 * mlx5dv_create_qp's. */
static struct ibv_qp *create_qp(struct ibv_context *ibctx, struct ibv_pd *ibpd,
				struct ibv_qp_init_attr *attr, uint64_t send_ops_flags,
				int extended, uint64_t dv_send_ops, uint32_t create_flags)
{
	struct shca_context *ctx = to_sctx(ibctx);
	struct shca_qp *qp;
	struct mp_buf b;
	struct shca_frame r;
	uint32_t inl, qpn = 0, seq = 0, took = 0;
	int rc, queues = 0, ring;

	/* ibv_create_qp(3): the attributes, the send CQ, and the receive CQ unless the
	 * receives come from an SRQ (or an XRC target's); without them, EINVAL. */
	if (!attr || !attr->send_cq ||
	    (!attr->recv_cq && !attr->srq && attr->qp_type != IBV_QPT_XRC_SEND &&
	     attr->qp_type != IBV_QPT_XRC_RECV)) {
		shca_log("ibv_create_qp: EINVAL: %s", !attr ? "no qp_init_attr" :
			 !attr->send_cq ? "no send_cq" : "no recv_cq and no SRQ");
		errno = EINVAL;
		return NULL;
	}
	inl = attr->cap.max_inline_data;
	if (inl > MAX_INLINE) {
		/* EINVAL, and no word unless asked: mlx5 and rxe say it in their debug
		 * logs only, and libfabric's probe for the largest value meets it a dozen
		 * times per process */
		shca_debug("ibv_create_qp: EINVAL: max_inline_data %u exceeds the device's %d",
			   inl, MAX_INLINE);
		errno = EINVAL;
		return NULL;
	}
	if (inl < DEFAULT_INLINE)
		inl = DEFAULT_INLINE;
	qp = shca_alloc(sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	qp->max_inline = inl;
	qp->max_send_sge = attr->cap.max_send_sge;
	qp->max_recv_sge = attr->cap.max_recv_sge;
	/* The queues that go into a ring shared with the daemon (wq.c): the send queue
	 * unless mlx5dv's MKEY builders post to it (their configure WRs are requests the
	 * daemon applies at post, and one queue takes WRs one way only), the receive queue
	 * unless an SRQ takes its place. */
	if (attr->qp_type == IBV_QPT_RC || attr->qp_type == IBV_QPT_UC ||
	    attr->qp_type == IBV_QPT_UD)
		queues = (dv_send_ops & (MLX5DV_QP_EX_WITH_MKEY_CONFIGURE | MLX5DV_QP_EX_WITH_MR_LIST |
					 MLX5DV_QP_EX_WITH_MR_INTERLEAVED) ? 0 : SHCA_WQ_QUEUE_SEND) |
			 (attr->srq ? 0 : SHCA_WQ_QUEUE_RECV);
	ring = !shca_wq_make(ctx, qp, queues,
			     attr->cap.max_send_wr ? attr->cap.max_send_wr : 1,
			     attr->cap.max_recv_wr ? attr->cap.max_recv_wr : 1, &seq);
	/* every field; srq only when the QP takes its receives from one, the ring's two
	 * when it has one */
	shca_begin(ctx->conn, &b, SHCA_V_CREATE_QP, SHCA_NFIELDS_CREATE_QP - !attr->srq -
		   (ring ? 0 : 2));
	if (ring) {
		mp_kv_uint(&b, SHCA_K_RING, seq);
		mp_kv_uint(&b, SHCA_K_RING_QUEUES, (uint32_t)queues);
	}
	if (attr->srq)
		mp_kv_uint(&b, SHCA_K_SRQ, to_ssrq(attr->srq)->handle);
	mp_kv_uint(&b, SHCA_K_PD, to_spd(ibpd)->handle);
	mp_kv_uint(&b, SHCA_K_SCQ, to_scq(attr->send_cq)->handle);
	mp_kv_uint(&b, SHCA_K_RCQ, to_scq(attr->recv_cq)->handle);
	mp_kv_uint(&b, SHCA_K_QP_TYPE, attr->qp_type);
	mp_kv_uint(&b, SHCA_K_MAX_SEND_WR, attr->cap.max_send_wr ? attr->cap.max_send_wr : 1);
	mp_kv_uint(&b, SHCA_K_MAX_RECV_WR, attr->cap.max_recv_wr ? attr->cap.max_recv_wr : 1);
	mp_kv_uint(&b, SHCA_K_MAX_SEND_SGE, attr->cap.max_send_sge);
	mp_kv_uint(&b, SHCA_K_MAX_RECV_SGE, attr->cap.max_recv_sge);
	mp_kv_uint(&b, SHCA_K_MAX_INLINE_DATA, inl);
	mp_str(&b, SHCA_K_SQ_SIG_ALL);
	mp_bool(&b, attr->sq_sig_all != 0);
	/* The daemon's QP takes configure WRs (what each MKEY builder posts) when any MKEY
	 * builder is allowed; which one the application may call the builders check. */
	mp_kv_uint(&b, SHCA_K_SEND_OPS_FLAGS,
		   dv_send_ops & (MLX5DV_QP_EX_WITH_MKEY_CONFIGURE | MLX5DV_QP_EX_WITH_MR_LIST |
				  MLX5DV_QP_EX_WITH_MR_INTERLEAVED) ?
		   MLX5DV_QP_EX_WITH_MKEY_CONFIGURE : 0);
	mp_kv_uint(&b, SHCA_K_CREATE_FLAGS, create_flags);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = shca_get_u32(&r, SHCA_R_QP, &qp->handle);
		if (!rc)
			rc = shca_get_u32(&r, SHCA_R_QP_NUM, &qpn);
		if (!rc && ring)
			rc = shca_get_u32(&r, SHCA_R_RING_QUEUES, &took);
		shca_frame_free(&r);
	}
	if (rc) {
		shca_wq_unmap(qp);
		shca_free(qp);
		errno = rc;
		return NULL;
	}
	attr->cap.max_inline_data = inl;
	qp->max_send_wr = attr->cap.max_send_wr;
	qp->max_recv_wr = attr->cap.max_recv_wr;
	qp->sq_sig_all = attr->sq_sig_all;
	qp->vqp.qp.context = ibctx;
	qp->vqp.qp.qp_context = attr->qp_context;
	qp->vqp.qp.pd = ibpd;
	qp->vqp.qp.send_cq = attr->send_cq;
	qp->vqp.qp.recv_cq = attr->recv_cq;
	qp->vqp.qp.srq = attr->srq;
	qp->vqp.qp.handle = qp->handle;
	qp->vqp.qp.qp_num = qpn;
	qp->vqp.qp.state = IBV_QPS_RESET;
	qp->vqp.qp.qp_type = attr->qp_type;
	pthread_mutex_init(&qp->vqp.qp.mutex, NULL);
	pthread_mutex_init(&qp->post_lock, NULL);
	pthread_mutex_init(&qp->recv_lock, NULL);
	pthread_cond_init(&qp->vqp.qp.cond, NULL);
	if (ring)
		shca_wq_keep(qp, (int)took);
	if (extended) {
		qp->vqp.comp_mask |= VERBS_QP_EX;
		shca_qp_ex_init(qp, send_ops_flags);
	}
	qp->dv_send_ops = dv_send_ops;
	shca_dv_qp_init(qp);
	pthread_mutex_lock(&ctx->conn->core.lock);
	qp->next = ctx->qps;
	ctx->qps = qp;
	pthread_mutex_unlock(&ctx->conn->core.lock);
	return &qp->vqp.qp;
}

struct ibv_qp *shca_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	return create_qp(pd->context, pd, attr, 0, 0, 0, 0);
}

/* ibv_create_qp_ex, with mlx5dv_create_qp's send_ops_flags and create_flags. */
static struct ibv_qp *create_qp_dv(struct ibv_context *ibctx, struct ibv_qp_init_attr_ex *ax,
				    uint64_t dv_send_ops, uint32_t create_flags)
{
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp;
	uint64_t ops = 0;

	if (!ax || !(ax->comp_mask & IBV_QP_INIT_ATTR_PD) || !ax->pd) {
		errno = EINVAL;
		return NULL;
	}
	if (ax->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
					IBV_QP_INIT_ATTR_CREATE_FLAGS)) {
		shca_log("ibv_create_qp_ex: EOPNOTSUPP: comp_mask %#x names attributes that "
			 "are not modelled", ax->comp_mask);
		errno = EOPNOTSUPP;
		return NULL;
	}
	/* IBV_QP_CREATE_BLOCK_SELF_MCAST_LB (mlx5 takes it) asks that the QP not receive the
	 * multicast it sends: softhca has no multicast (ibv_attach_mcast is not modelled),
	 * no QP receives any, so the request holds. Any other flag is refused. */
	if ((ax->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) &&
	    (ax->create_flags & ~(uint32_t)IBV_QP_CREATE_BLOCK_SELF_MCAST_LB)) {
		shca_log("ibv_create_qp_ex: EOPNOTSUPP: create_flags %#x are not modelled",
			 ax->create_flags);
		errno = EOPNOTSUPP;
		return NULL;
	}
	memset(&a, 0, sizeof(a));
	a.qp_context = ax->qp_context;
	a.send_cq = ax->send_cq;
	a.recv_cq = ax->recv_cq;
	a.srq = ax->srq;
	a.cap = ax->cap;
	a.qp_type = ax->qp_type;
	a.sq_sig_all = ax->sq_sig_all;
	if (ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
		ops = ax->send_ops_flags;
	qp = create_qp(ibctx, ax->pd, &a, ops, (ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
		       != 0, dv_send_ops, create_flags);
	if (qp)
		ax->cap = a.cap;
	return qp;
}

struct ibv_qp *shca_create_qp_ex(struct ibv_context *ibctx,
					struct ibv_qp_init_attr_ex *ax)
{
	return create_qp_dv(ibctx, ax, 0, 0);
}

/* The man pages' MKEY builders (dv.c), each needing its mlx5dv send_ops_flags bit. */
#define MKEY_OPS (MLX5DV_QP_EX_WITH_MR_INTERLEAVED | MLX5DV_QP_EX_WITH_MR_LIST | \
		  MLX5DV_QP_EX_WITH_MKEY_CONFIGURE)

struct ibv_qp *shca_dv_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *qp_attr,
				 struct mlx5dv_qp_init_attr *dv)
{
	const uint64_t known = MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS |
			       MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	/* DISABLE_SCATTER_TO_CQE only changes where hardware puts small receives, never
	 * what the application sees; softhca never scatters into a CQE. */
	const uint32_t flags_ok = MLX5DV_QP_CREATE_SIG_PIPELINING |
				  MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE;
	uint64_t ops = 0;
	uint32_t flags = 0;

	if (!qp_attr) {
		errno = EINVAL;
		return NULL;
	}
	if (dv && dv->comp_mask & ~known) {
		shca_log("mlx5dv_create_qp: EOPNOTSUPP: comp_mask %#llx (DC, DCI streams) is not "
			 "modelled", (unsigned long long)(dv->comp_mask & ~known));
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (dv && dv->comp_mask & MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS)
		flags = dv->create_flags;
	if (flags & ~flags_ok) {
		shca_log("mlx5dv_create_qp: EOPNOTSUPP: create_flags %#x are not modelled",
			 flags & ~flags_ok);
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (dv && dv->comp_mask & MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS)
		ops = dv->send_ops_flags;
	if (ops & ~(uint64_t)MKEY_OPS) {
		shca_log("mlx5dv_create_qp: EOPNOTSUPP: send_ops_flags %#llx (raw WQEs, memcpy) "
			 "are not modelled", (unsigned long long)(ops & ~(uint64_t)MKEY_OPS));
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (ops && !(qp_attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) {
		shca_log("mlx5dv_create_qp: EINVAL: mlx5dv send_ops_flags need an extended QP "
			 "(IBV_QP_INIT_ATTR_SEND_OPS_FLAGS in qp_attr->comp_mask)");
		errno = EINVAL;
		return NULL;
	}
	return create_qp_dv(context, qp_attr, ops, flags & MLX5DV_QP_CREATE_SIG_PIPELINING);
}

int shca_destroy_qp(struct ibv_qp *ibqp)
{
	struct shca_context *ctx = to_sctx(ibqp->context);
	struct shca_qp *qp = to_sqp(ibqp);
	int rc = SHCA_DESTROY_LISTED(ctx, SHCA_V_DESTROY_QP, SHCA_K_QP, &ctx->qps, qp);

	if (rc)
		return rc;
	if (qp->bounce)
		shca_dereg(qp->bounce);
	free(qp->bounce_buf);
	shca_wq_unmap(qp);
	shca_batch_free(qp);
	shca_free(qp);
	return 0;
}

/* The address vector's dgid is a softhca GID, fe80::<IPv4>:<port>:<device index>: the
 * daemon and device the peer QP lives on (the address resolution RoCE does with ARP
 * or ND, done here by decoding). */
int shca_av_dest(struct shca_context *ctx, const struct ibv_ah_attr *ah, char *host,
		 size_t hlen, unsigned *port, const char **dev, const char *verb)
{
	const uint8_t *g = ah->grh.dgid.raw;
	unsigned idx;
	int i;

	if (!ah->is_global) {
		shca_log("%s: EINVAL: RoCE requires a GRH: the address vector has "
			 "is_global 0 (a RoCE port routes by GID: set is_global 1 and the "
			 "peer's dgid; ibv_rc_pingpong: -g 0, qperf: -cm1)", verb);
		return EINVAL;
	}
	for (i = 0; i < 8; i++) {
		if (g[i] != (i == 0 ? 0xfe : i == 1 ? 0x80 : 0)) {
			shca_log("%s: EINVAL: dgid is not a softhca GID (fe80::<IPv4>:"
				 "<port>:<device>): no daemon is reachable through it", verb);
			return EINVAL;
		}
	}
	snprintf(host, hlen, "%u.%u.%u.%u", g[8], g[9], g[10], g[11]);
	*port = (unsigned)g[12] << 8 | g[13];
	idx = (unsigned)g[14] << 8 | g[15];
	/* Daemons name their devices alike (mlx5_0, ...): index i of the peer is the
	 * device this daemon lists at i. */
	if ((int)idx >= ctx->ndevices) {
		shca_log("%s: EINVAL: dgid names device %u; the daemon has %d", verb, idx,
			 ctx->ndevices);
		return EINVAL;
	}
	*dev = ctx->devices[idx];
	return 0;
}

struct qp_field {
	int bit;
	const char *name;
	size_t off;
	size_t size;
};

#define F(bit, name, member) {bit, name, offsetof(struct ibv_qp_attr, member), \
			      sizeof(((struct ibv_qp_attr *)0)->member)}
static const struct qp_field qp_fields[] = {
	F(IBV_QP_STATE, SHCA_K_QP_STATE, qp_state),
	F(IBV_QP_EN_SQD_ASYNC_NOTIFY, SHCA_K_EN_SQD_ASYNC_NOTIFY, en_sqd_async_notify),
	F(IBV_QP_ACCESS_FLAGS, SHCA_K_QP_ACCESS_FLAGS, qp_access_flags),
	F(IBV_QP_PATH_MTU, SHCA_K_PATH_MTU, path_mtu),
	F(IBV_QP_TIMEOUT, SHCA_K_TIMEOUT, timeout),
	F(IBV_QP_RETRY_CNT, SHCA_K_RETRY_CNT, retry_cnt),
	F(IBV_QP_RNR_RETRY, SHCA_K_RNR_RETRY, rnr_retry),
	F(IBV_QP_RQ_PSN, SHCA_K_RQ_PSN, rq_psn),
	F(IBV_QP_MAX_QP_RD_ATOMIC, SHCA_K_MAX_RD_ATOMIC, max_rd_atomic),
	F(IBV_QP_MIN_RNR_TIMER, SHCA_K_MIN_RNR_TIMER, min_rnr_timer),
	F(IBV_QP_SQ_PSN, SHCA_K_SQ_PSN, sq_psn),
	F(IBV_QP_MAX_DEST_RD_ATOMIC, SHCA_K_MAX_DEST_RD_ATOMIC, max_dest_rd_atomic),
	F(IBV_QP_DEST_QPN, SHCA_K_DEST_QP_NUM, dest_qp_num),
	F(IBV_QP_QKEY, SHCA_K_QKEY, qkey),
};
#undef F

static uint64_t field_value(const struct ibv_qp_attr *a, const struct qp_field *f)
{
	const uint8_t *p = (const uint8_t *)a + f->off;

	switch (f->size) {
	case 1: return *p;
	case 2: return *(const uint16_t *)p;
	case 4: return *(const uint32_t *)p;
	default: return 0;
	}
}

int shca_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	struct shca_context *ctx = to_sctx(ibqp->context);
	struct shca_qp *qp = to_sqp(ibqp);
	/* The port, the P_Key index and the current state the caller asserts are
	 * checked here: the device has one port and one P_Key. */
	const int local = IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_CUR_STATE;
	char host[32];
	unsigned port = 0;
	const char *dev = NULL;
	struct mp_buf b;
	struct shca_frame r;
	uint32_t n = 0, state;
	size_t i;
	int rc;

	if (!attr) {
		shca_log("ibv_modify_qp: EINVAL: no attr");
		return EINVAL;
	}
	if ((mask & IBV_QP_PORT) && attr->port_num != 1) {
		shca_log("ibv_modify_qp: EINVAL: port %u does not exist (the device has port 1)",
			 attr->port_num);
		return EINVAL;
	}
	if ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0) {
		shca_log("ibv_modify_qp: EINVAL: P_Key index %u is outside the one-entry table",
			 attr->pkey_index);
		return EINVAL;
	}
	if (mask & IBV_QP_AV) {
		rc = shca_av_dest(ctx, &attr->ah_attr, host, sizeof(host), &port, &dev,
				  "ibv_modify_qp");
		if (rc)
			return rc;
		n += 3;
	}
	for (i = 0; i < sizeof(qp_fields) / sizeof(qp_fields[0]); i++)
		if (mask & qp_fields[i].bit)
			n++;
	shca_begin(ctx->conn, &b, SHCA_V_MODIFY_QP, SHCA_NREQ_MODIFY_QP);
	mp_kv_uint(&b, SHCA_K_QP, qp->handle);
	mp_kv_uint(&b, SHCA_K_MASK, (uint32_t)(mask & ~local));
	mp_str(&b, SHCA_K_ATTR);
	mp_map(&b, n);
	for (i = 0; i < sizeof(qp_fields) / sizeof(qp_fields[0]); i++)
		if (mask & qp_fields[i].bit)
			mp_kv_uint(&b, qp_fields[i].name, field_value(attr, &qp_fields[i]));
	if (mask & IBV_QP_AV) {
		mp_str(&b, SHCA_K_DEST_HOST);
		mp_str(&b, host);
		mp_kv_uint(&b, SHCA_K_DEST_PORT, port);
		mp_str(&b, SHCA_K_DEST_DEV);
		mp_str(&b, dev);
	}
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	if (!shca_get_u32(&r, SHCA_R_STATE, &state))
		ibqp->state = (enum ibv_qp_state)state;
	shca_frame_free(&r);
	if (ibqp->state == IBV_QPS_RESET)
		shca_wq_reset(qp);
	return 0;
}

int shca_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask,
			 struct ibv_qp_init_attr *init)
{
	struct shca_context *ctx = to_sctx(ibqp->context);
	struct shca_qp *qp = to_sqp(ibqp);
	struct mp_buf b;
	struct shca_frame r;
	struct mp_val a;
	uint64_t v;
	int rc;

	(void)mask;
	if (!attr || !init) {
		shca_log("ibv_query_qp: EINVAL: no %s", !attr ? "attr" : "init_attr");
		return EINVAL;
	}
	shca_begin(ctx->conn, &b, SHCA_V_QUERY_QP, SHCA_NREQ_QUERY_QP);
	mp_kv_uint(&b, SHCA_K_QP, qp->handle);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	memset(attr, 0, sizeof(*attr));
	memset(init, 0, sizeof(*init));
	if (mp_find(r.hdr, SHCA_R_ATTR, &a)) {
		if (mp_find_uint(a, SHCA_R_QP_STATE, &v))
			attr->qp_state = attr->cur_qp_state = (enum ibv_qp_state)v;
		if (mp_find_uint(a, SHCA_R_PATH_MTU, &v))
			attr->path_mtu = (enum ibv_mtu)v;
		if (mp_find_uint(a, SHCA_R_DEST_QP_NUM, &v))
			attr->dest_qp_num = (uint32_t)v;
		if (mp_find_uint(a, SHCA_R_TIMEOUT, &v))
			attr->timeout = (uint8_t)v;
		if (mp_find_uint(a, SHCA_R_RETRY_CNT, &v))
			attr->retry_cnt = (uint8_t)v;
		if (mp_find_uint(a, SHCA_R_RNR_RETRY, &v))
			attr->rnr_retry = (uint8_t)v;
		if (mp_find_uint(a, SHCA_R_QKEY, &v))     /* a UD QP's (udaddy's reply uses it) */
			attr->qkey = (uint32_t)v;
	}
	shca_frame_free(&r);
	attr->port_num = 1;
	attr->cap.max_send_wr = qp->max_send_wr;
	attr->cap.max_recv_wr = qp->max_recv_wr;
	attr->cap.max_send_sge = qp->max_send_sge;
	attr->cap.max_recv_sge = qp->max_recv_sge;
	attr->cap.max_inline_data = qp->max_inline;
	init->qp_context = ibqp->qp_context;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->cap = attr->cap;
	init->qp_type = ibqp->qp_type;
	init->sq_sig_all = qp->sq_sig_all;
	return 0;
}

/* The WR i places after wr in its chain. */
static struct ibv_send_wr *send_nth(struct ibv_send_wr *wr, uint32_t i)
{
	while (i-- && wr)
		wr = wr->next;
	return wr;
}

/* EIO for a post in a forked child, or after the daemon's connection ended: a device
 * that died (IBV_EVENT_DEVICE_FATAL) takes no WR, whatever the QP's state says. A post
 * on requests learns it from its request; one on a ring must ask. */
static int post_gone(struct shca_context *ctx, const char *verb)
{
	if (shca_forked(ctx, verb))
		return EIO;
	if (__atomic_load_n(&ctx->conn->core.dead, __ATOMIC_ACQUIRE)) {
		shca_log("%s: EIO: the daemon's connection is gone", verb);
		return EIO;
	}
	return 0;
}

/* ibv_post_send(3): on failure *bad is the first WR not posted and every WR before it
 * is posted. The chain goes as requests of up to SHCA_MAX_WRS_PER_POST WRs; the daemon
 * takes a request's WRs in order up to the first it refuses and says which (its index), and
 * a WR the provider refuses itself ends the request before it: the WRs ahead of it
 * still go, and *bad is it. Nothing after a refused WR is sent. */
int shca_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
			  struct ibv_send_wr **bad)
{
	struct shca_qp *qp = to_sqp(ibqp);
	struct ibv_send_wr *first;
	struct mp_buf wrs;
	uint32_t n, taken;
	size_t mark;
	int rc = 0, sent;

	if (post_gone(to_sctx(ibqp->context), "ibv_post_send")) {
		*bad = wr;
		return EIO;
	}
	if (qp->sq.base)
		return shca_wq_post_send(qp, wr, bad);
	/* the bounce pages are the QP's: one post at a time fills them */
	pthread_mutex_lock(&qp->post_lock);
	while (wr && !rc) {
		first = wr;
		mp_init(&wrs);
		n = 0;
		qp->bounce_used = 0;
		for (; wr && n < SHCA_MAX_WRS_PER_POST; wr = wr->next, n++) {
			mark = wrs.len;
			rc = shca_encode_send_wr(qp, &wrs, wr, 0);
			if (rc) {
				wrs.len = mark;     /* the refused WR's partial encoding */
				break;
			}
		}
		sent = n ? shca_post_send_batch(qp, &wrs, n, 0, &taken) : 0;
		mp_free(&wrs);
		if (sent) {
			rc = sent;
			wr = send_nth(first, taken < n ? taken : 0);
		}
		if (rc)
			*bad = wr;
	}
	pthread_mutex_unlock(&qp->post_lock);
	return rc;
}

int shca_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
			  struct ibv_recv_wr **bad)
{
	struct shca_qp *qp = to_sqp(ibqp);

	if (qp->rq.base) {
		if (post_gone(to_sctx(ibqp->context), "ibv_post_recv")) {
			*bad = wr;
			return EIO;
		}
		return shca_wq_post_recv(qp, wr, bad);
	}
	return shca_post_recv_wrs(to_sctx(ibqp->context), SHCA_V_POST_RECV, SHCA_K_QP, qp->handle,
				  qp->max_recv_sge, "QP's max_recv_sge", wr, bad);
}

