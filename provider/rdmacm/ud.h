/* The RDMA_PS_UDP ids of softhca's librdmacm (ud.c): UD QPs readied by rdma_create_qp,
 * and the param.ud of their events. */
#ifndef SOFTHCA_CM_UD_H
#define SOFTHCA_CM_UD_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "../mp.h"

/* rdma_init_qp_attr(3) for a UD id: INIT with the port space's Q_Key, RTR, RTS. */
int cm_ud_qp_attr(struct rdma_cm_id *cid, struct ibv_qp_attr *attr, int *mask);
/* A new UD QP through INIT, RTR and RTS (librdmacm readies it: no REP to wait for). */
int cm_ud_ready_qp(struct rdma_cm_id *cid);
/* An event of a UD id: param.ud from the daemon's header ``h`` (qpn, qkey) and the
 * id's route (the AH to the peer for ESTABLISHED); private data already in pdata. */
void cm_ud_param(struct rdma_cm_event *ev, struct rdma_cm_id *cid, struct mp_val h,
		 const void *pdata, size_t n);

#endif
