/* RDMA_PS_UDP ids (rdma_create_id(3)): UD QPs, connected by SIDR through the daemon's
 * CM (server/cm_sidr.py). rdma_create_qp moves the QP straight to RTS with the Q_Key
 * rdma_cm gives the port space (RDMA_UDP_QKEY); rdma_connect's SIDR_REQ is answered by
 * a SIDR_REP whose QPN and Q_Key the ESTABLISHED event's param.ud carries, with an
 * ah_attr for ibv_create_ah: the route's destination GID (a global route, as RoCE's). */
#include <errno.h>
#include <string.h>

#include "../wire.h"
#include "ud.h"

int cm_ud_qp_attr(struct rdma_cm_id *cid, struct ibv_qp_attr *attr, int *mask)
{
	enum ibv_qp_state want = attr->qp_state;

	memset(attr, 0, sizeof(*attr));
	attr->qp_state = want;
	switch (want) {
	case IBV_QPS_INIT:
		attr->pkey_index = 0;
		attr->port_num = cid->port_num ? cid->port_num : 1;
		attr->qkey = RDMA_UDP_QKEY;
		*mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
		return 0;
	case IBV_QPS_RTR:
		*mask = IBV_QP_STATE;
		return 0;
	case IBV_QPS_RTS:
		attr->sq_psn = 0;
		*mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
		return 0;
	default:
		errno = EINVAL;
		return -1;
	}
}

int cm_ud_ready_qp(struct rdma_cm_id *cid)
{
	static const enum ibv_qp_state steps[] = {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS};
	struct ibv_qp_attr a;
	size_t i;
	int mask, rc;

	for (i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		a.qp_state = steps[i];
		if (cm_ud_qp_attr(cid, &a, &mask))
			return errno;
		rc = ibv_modify_qp(cid->qp, &a, mask);
		if (rc)
			return rc;
	}
	return 0;
}

void cm_ud_param(struct rdma_cm_event *ev, struct rdma_cm_id *cid, struct mp_val h,
		 const void *pdata, size_t n)
{
	struct rdma_ud_param *ud = &ev->param.ud;
	uint64_t v = 0;

	memset(ud, 0, sizeof(*ud));
	ud->private_data = n ? pdata : NULL;
	ud->private_data_len = (uint8_t)(n > 255 ? 255 : n);
	if (ev->event != RDMA_CM_EVENT_ESTABLISHED)
		return;
	mp_find_uint(h, SHCA_R_QPN, &v);
	ud->qp_num = (uint32_t)v;
	v = 0;
	mp_find_uint(h, SHCA_R_QKEY, &v);
	ud->qkey = (uint32_t)v;
	ud->ah_attr.is_global = 1;
	ud->ah_attr.grh.dgid = cid->route.addr.addr.ibaddr.dgid;
	ud->ah_attr.grh.sgid_index = 0;
	ud->ah_attr.grh.hop_limit = 64;
	ud->ah_attr.port_num = cid->port_num ? cid->port_num : 1;
}
