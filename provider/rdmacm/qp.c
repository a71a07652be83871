/* The id's QP (rdma_create_qp(3), rdma_create_qp_ex, rdma_init_qp_attr(3)) and the id's
 * options (rdma_set_option(3)). The QP is the provider's, made with ibv_create_qp_ex on
 * the id's device and moved as librdmacm moves it: INIT at creation, RTR and RTS with
 * what the CM exchange gave (cma.c), ERR before a DREQ. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cm.h"
#include "ud.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVS 16

/* librdmacm's default PD of a device, shared by the ids on it (rdma_create_qp with no
 * PD): one per verbs context, as librdmacm keeps one per cma_device. */
static struct {
	pthread_mutex_t lock;
	int n;
	struct ibv_context *ctx[MAX_DEVS];
	struct ibv_pd *pd[MAX_DEVS];
} pds = {.lock = PTHREAD_MUTEX_INITIALIZER};

static struct ibv_pd *default_pd(struct ibv_context *ctx)
{
	struct ibv_pd *pd = NULL;
	int i;

	pthread_mutex_lock(&pds.lock);
	for (i = 0; i < pds.n && !pd; i++)
		if (pds.ctx[i] == ctx)
			pd = pds.pd[i];
	if (!pd && pds.n < MAX_DEVS) {
		pd = ibv_alloc_pd(ctx);
		if (pd) {
			pds.ctx[pds.n] = ctx;
			pds.pd[pds.n++] = pd;
		}
	} else if (!pd) {
		errno = ENOMEM;
	}
	pthread_mutex_unlock(&pds.lock);
	return pd;
}

EXPORT int rdma_init_qp_attr(struct rdma_cm_id *cid, struct ibv_qp_attr *attr, int *mask)
{
	struct cm_id *id = (struct cm_id *)cid;
	struct ibv_port_attr pa;
	enum ibv_qp_state want;

	if (!cid || !attr || !mask)
		return fail(EINVAL);
	want = attr->qp_state;
	if (cid->qp_type == IBV_QPT_UD)
		return cm_ud_qp_attr(cid, attr, mask);
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = want;
	switch (want) {
	case IBV_QPS_INIT:
		attr->pkey_index = 0;
		attr->port_num = 1;
		/* The kernel's: no remote access before a connection (rdma_cm's own INIT);
		 * once the REQ or REP is known, the IB CM's (cm_init_qp_init_attr): remote
		 * WRITE always, remote READ and atomics when this side has responder
		 * resources, which the peer's READs and atomics take. */
		attr->qp_access_flags = 0;
		if (id->peer_qpn) {
			attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
			if (id->rr)
				attr->qp_access_flags |= IBV_ACCESS_REMOTE_READ |
							 IBV_ACCESS_REMOTE_ATOMIC;
		}
		*mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
		return 0;
	case IBV_QPS_RTR:
		if (!id->peer_qpn)
			return fail(EINVAL);        /* no REQ or REP yet */
		attr->path_mtu = IBV_MTU_1024;
		if (cid->verbs && !ibv_query_port(cid->verbs, 1, &pa))
			attr->path_mtu = pa.active_mtu;
		attr->dest_qp_num = id->peer_qpn;
		attr->rq_psn = id->peer_psn;
		attr->max_dest_rd_atomic = id->rr;
		/* The kernel's IB CM gives rdma_cm QPs 0 (cm_init_qp_rtr_attr): IBTA's code
		 * for the longest RNR NAK timer, 655.36 ms, so an RNR retry count of a few
		 * covers a peer that posts its receives seconds late (tgtd's iSER NOP-In,
		 * sent every 5 s, may come just after a login response, before libiscsi
		 * has posted its next receive). A program lowers it with ibv_modify_qp. */
		attr->min_rnr_timer = 0;
		attr->ah_attr.is_global = 1;
		attr->ah_attr.grh.dgid = cid->route.addr.addr.ibaddr.dgid;
		attr->ah_attr.grh.sgid_index = 0;
		attr->ah_attr.grh.hop_limit = 64;
		/* RDMA_OPTION_ID_TOS: RoCE carries the ToS as the GRH's traffic class */
		attr->ah_attr.grh.traffic_class = id->tos;
		attr->ah_attr.port_num = 1;
		*mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		return 0;
	case IBV_QPS_RTS:
		if (!id->peer_qpn)
			return fail(EINVAL);
		attr->sq_psn = id->my_psn;
		/* The IB CM's local ACK timeout for a RoCE path, unless
		 * RDMA_OPTION_ID_ACK_TIMEOUT: rdma_cm's packet lifetime 16 plus one, raised
		 * by the HCA's local_ca_ack_delay 16 (cm_ack_timeout) to 18, 4.096 us * 2^18,
		 * about 1.07 s per try. A shorter one gave up on a loaded peer that a kernel
		 * device's QP would still have waited for. */
		attr->timeout = id->has_ack_timeout ? id->ack_timeout : 18;
		attr->retry_cnt = id->retry;
		attr->rnr_retry = id->rnr;
		attr->max_rd_atomic = id->depth;
		*mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			IBV_QP_RNR_RETRY;
		/* An initiator depth of 0 (perftest -R's for WRITE and SEND) says the
		 * program issues no READ or atomic: the QP keeps its own value, as the
		 * device refuses 0 (no READ could ever go). */
		if (id->depth)
			*mask |= IBV_QP_MAX_QP_RD_ATOMIC;
		return 0;
	default:
		return fail(EINVAL);
	}
}

int cm_move_qp(struct rdma_cm_id *cid, enum ibv_qp_state state)
{
	struct ibv_qp_attr a = {.qp_state = state};
	int mask, rc;

	/* As librdmacm before RTR: INIT again, now with the connection's access flags. */
	if (state == IBV_QPS_RTR) {
		rc = cm_move_qp(cid, IBV_QPS_INIT);
		if (rc)
			return rc;
	}
	if (rdma_init_qp_attr(cid, &a, &mask))
		return errno;
	return ibv_modify_qp(cid->qp, &a, mask);
}

int cm_qp_to_err(struct rdma_cm_id *cid)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};

	return cid->qp ? ibv_modify_qp(cid->qp, &a, IBV_QP_STATE) : 0;
}

/* A CQ and its completion channel for an id whose QP was given none: the CQ's
 * context is the id, as rdma_verbs.h's rdma_get_send_comp / rdma_get_recv_comp check. */
static struct ibv_cq *own_cq(struct rdma_cm_id *cid, uint32_t n,
			     struct ibv_comp_channel **ch)
{
	struct ibv_cq *cq;

	*ch = ibv_create_comp_channel(cid->verbs);
	if (!*ch)
		return NULL;
	cq = ibv_create_cq(cid->verbs, (int)(n ? n : 1), cid, *ch, 0);
	if (!cq) {
		ibv_destroy_comp_channel(*ch);
		*ch = NULL;
	}
	return cq;
}

static void drop_own_cqs(struct cm_id *id)
{
	struct rdma_cm_id *cid = &id->id;

	if (id->own_cqs & 1) {
		ibv_destroy_cq(cid->send_cq);
		ibv_destroy_comp_channel(cid->send_cq_channel);
	}
	if (id->own_cqs & 2) {
		ibv_destroy_cq(cid->recv_cq);
		ibv_destroy_comp_channel(cid->recv_cq_channel);
	}
	id->own_cqs = 0;
	cid->send_cq = cid->recv_cq = NULL;
	cid->send_cq_channel = cid->recv_cq_channel = NULL;
}

static int give_cqs(struct cm_id *id, struct ibv_qp_init_attr_ex *a)
{
	struct rdma_cm_id *cid = &id->id;

	if (!a->send_cq) {
		cid->send_cq = own_cq(cid, a->cap.max_send_wr, &cid->send_cq_channel);
		if (!cid->send_cq)
			return errno;
		id->own_cqs |= 1;
		a->send_cq = cid->send_cq;
	}
	if (!a->recv_cq) {
		cid->recv_cq = own_cq(cid, a->cap.max_recv_wr, &cid->recv_cq_channel);
		if (!cid->recv_cq) {
			drop_own_cqs(id);
			return errno;
		}
		id->own_cqs |= 2;
		a->recv_cq = cid->recv_cq;
	}
	return 0;
}

/* rdma_create_qp_ex: the extended attributes as ibv_create_qp_ex(3) takes them (the
 * provider refuses what it does not model); the PD is attr's when IBV_QP_INIT_ATTR_PD
 * says so, else the device's default one. */
EXPORT int rdma_create_qp_ex(struct rdma_cm_id *cid, struct ibv_qp_init_attr_ex *attr)
{
	struct cm_id *id = (struct cm_id *)cid;
	struct ibv_qp_init_attr_ex a;
	struct ibv_qp *qp;
	int rc;

	if (!cid || !attr || !cid->verbs)
		return fail(EINVAL);
	if (cid->qp)
		return fail(EINVAL);        /* one QP per id */
	a = *attr;
	if (!(a.comp_mask & IBV_QP_INIT_ATTR_PD) || !a.pd) {
		a.pd = default_pd(cid->verbs);
		if (!a.pd)
			return -1;
		a.comp_mask |= IBV_QP_INIT_ATTR_PD;
	}
	if (a.pd->context != cid->verbs)
		return fail(EINVAL);
	/* rdma_create_ep's callers often leave it 0: the id's type (its port space's) */
	if (!a.qp_type)
		a.qp_type = cid->qp_type;
	if (a.qp_type != cid->qp_type)     /* RC for RDMA_PS_TCP, UD for RDMA_PS_UDP */
		return fail(EOPNOTSUPP);
	rc = give_cqs(id, &a);
	if (rc)
		return fail(rc);
	qp = ibv_create_qp_ex(cid->verbs, &a);
	if (!qp) {
		rc = errno;
		drop_own_cqs(id);
		return fail(rc);
	}
	cid->qp = qp;
	rc = a.qp_type == IBV_QPT_UD ? cm_ud_ready_qp(cid) : cm_move_qp(cid, IBV_QPS_INIT);
	if (rc) {
		ibv_destroy_qp(qp);
		cid->qp = NULL;
		drop_own_cqs(id);
		return fail(rc);
	}
	attr->cap = a.cap;
	cid->pd = a.pd;
	cid->send_cq = a.send_cq;
	cid->recv_cq = a.recv_cq;
	cid->send_cq_channel = a.send_cq->channel;
	cid->recv_cq_channel = a.recv_cq->channel;
	cid->qp_type = a.qp_type;
	return 0;
}

EXPORT int rdma_create_qp(struct rdma_cm_id *cid, struct ibv_pd *pd,
			  struct ibv_qp_init_attr *qp_init_attr)
{
	struct ibv_qp_init_attr_ex a;
	int rc;

	if (!cid || !qp_init_attr)
		return fail(EINVAL);
	memset(&a, 0, sizeof(a));
	memcpy(&a, qp_init_attr, sizeof(*qp_init_attr));
	a.pd = pd;
	a.comp_mask = pd ? IBV_QP_INIT_ATTR_PD : 0;
	rc = rdma_create_qp_ex(cid, &a);
	if (!rc)
		qp_init_attr->cap = a.cap;
	return rc;
}

EXPORT void rdma_destroy_qp(struct rdma_cm_id *cid)
{
	if (cid->qp)
		ibv_destroy_qp(cid->qp);
	cid->qp = NULL;
	drop_own_cqs((struct cm_id *)cid);
}

static int option_u8(const void *v, size_t len, uint8_t *out)
{
	if (!v || len != sizeof(uint8_t))
		return EINVAL;
	*out = *(const uint8_t *)v;
	return 0;
}

static int option_int(const void *v, size_t len, int *out)
{
	if (!v || len != sizeof(int))
		return EINVAL;
	*out = *(const int *)v;
	return 0;
}

/* rdma_set_option(3) at level RDMA_OPTION_ID: the ToS (the QP's traffic class), the
 * local ACK timeout (the QP's timeout at RTS), REUSEADDR (a later rdma_bind_addr may
 * share a port, cma.c) and AFONLY (an IPv6 id bound after it takes no IPv4
 * connection and shares its port with an IPv4 id; IPv4 ids always are so). A value of the wrong size is EINVAL; an option rdma_cm does not have, like
 * the kernel's, ENOSYS; path records (RDMA_OPTION_IB_PATH) are not modelled. */
EXPORT int rdma_set_option(struct rdma_cm_id *cid, int level, int optname, void *optval,
			   size_t optlen)
{
	struct cm_id *id = (struct cm_id *)cid;
	int rc, v;

	if (!cid)
		return fail(EINVAL);
	if (level == RDMA_OPTION_IB)
		return fail(optname == RDMA_OPTION_IB_PATH ? EOPNOTSUPP : ENOSYS);
	if (level != RDMA_OPTION_ID)
		return fail(ENOSYS);
	switch (optname) {
	case RDMA_OPTION_ID_TOS:
		rc = option_u8(optval, optlen, &id->tos);
		break;
	case RDMA_OPTION_ID_ACK_TIMEOUT:
		rc = option_u8(optval, optlen, &id->ack_timeout);
		if (!rc && id->ack_timeout > 31)
			rc = EINVAL;             /* IBTA's 5-bit field */
		id->has_ack_timeout = !rc;
		break;
	case RDMA_OPTION_ID_REUSEADDR:
		rc = option_int(optval, optlen, &v);
		if (!rc && cid->route.addr.src_sin.sin_port)
			rc = EINVAL;             /* the kernel's: only before the id is bound */
		if (!rc)
			id->reuseaddr = !!v;
		break;
	case RDMA_OPTION_ID_AFONLY:
		rc = option_int(optval, optlen, &v);
		if (!rc)
			id->afonly = !!v;
		break;
	default:
		rc = ENOSYS;
	}
	return rc ? fail(rc) : 0;
}
