/* softhca's librdmacm (docs/native.md, "The connection manager"): rdma_cm calls become
 * cm_* control requests to the daemon, whose connection manager talks to the peer's
 * daemon; the QPs are the provider's, moved through their states here with verbs. */
#ifndef SOFTHCA_CM_H
#define SOFTHCA_CM_H

#include <pthread.h>
#include <errno.h>
#include <stdint.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "../core.h"
#include "../frame.h"
#include "../mp.h"
#include "../wire_enc.h"

struct cm_conn {
	struct shca_core core;      /* the requests, the reader thread (../core.h) */
	pthread_t reader;
	struct shca_frame welcome;
	/* the reader thread's: a pushed event, kept (or freed) by the callee (cma.c's
	 * queues it on its id's channel) */
	void (*on_event)(struct shca_frame *f);
};

/* One rdma_cm_id: the user's struct first. */
struct cm_id {
	struct rdma_cm_id id;
	uint32_t handle;
	struct cm_id *next;            /* every id, under g.lock */
	int own_channel;               /* made for a synchronous id (channel NULL) */
	/* the connection: the peer QP's number and PSN, ours, the negotiated values */
	uint32_t peer_qpn, peer_psn, my_psn;
	uint8_t rr, depth, retry, rnr;
	struct ibv_qp_init_attr ep_attr; /* rdma_create_ep's, for rdma_get_request */
	struct ibv_pd *ep_pd;
	int has_ep_attr;
	int own_cqs;                   /* 1: send CQ, 2: recv CQ made by rdma_create_qp */
	/* rdma_set_option(3)'s: the traffic class, the local ACK timeout, SO_REUSEADDR's
	 * and IPV6_V6ONLY's counterparts */
	uint8_t tos, ack_timeout;
	int has_ack_timeout, reuseaddr, afonly;
	/* events handed up for this id (a CONNECT_REQUEST counts for its listener) and
	 * those acknowledged, under g.lock: rdma_migrate_id waits for them to meet */
	unsigned long reported, acked;
};

int cm_connect(struct cm_conn *c, const char *path, void (*on_event)(struct shca_frame *f));
void cm_begin(struct cm_conn *c, struct mp_buf *b, const char *verb, uint32_t nfields);
int cm_call(struct cm_conn *c, struct mp_buf *b, const void *payload, size_t plen,
	    struct shca_frame *r);
/* qp.c: the id's QP moved as librdmacm moves it (rdma_init_qp_attr's attributes). */
int cm_move_qp(struct rdma_cm_id *cid, enum ibv_qp_state state);
int cm_qp_to_err(struct rdma_cm_id *cid);

static inline int fail(int e)
{
	errno = e;
	return -1;
}

/* conn.c: a line on stderr, "softhca-rdmacm: " first. */
void cm_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
