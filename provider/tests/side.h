/* What the C test programs (provider/tests/memcheck.c, mwcheck.c, dvcheck.c) share: one
 * side of a connection (a device context, PD, CQ and RC QP), connecting it, waiting for a
 * completion, patterned buffers and a posting helper. Each check prints "<PROG>: ok: ..."
 * or "<PROG>: FAIL: ..."; PROG is defined by the including program, and so may ACCESS be
 * (the access flags of its registrations and QPs). */
#ifndef SHCA_TESTS_SIDE_H
#define SHCA_TESTS_SIDE_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef ACCESS
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
		IBV_ACCESS_REMOTE_ATOMIC)
#endif
#define UNUSED __attribute__((unused))

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;     /* dvcheck: the QP's ibv_wr_* view */
	struct mlx5dv_qp_ex *mqp;  /* dvcheck: and its mlx5dv view */
	uint8_t *buf, *rbuf;       /* malloc'ed, deliberately unaligned */
	struct ibv_mr *mr, *rmr;
	union ibv_gid gid;
};

struct peer_info {
	uint32_t qpn;
	uint32_t rkey;     /* of the peer's MR (dvcheck: its MKEY) */
	uint64_t addr;
	union ibv_gid gid;
};

UNUSED static int failures;

#define CHECK(cond, ...) do { \
	if (cond) { printf(PROG ": ok: " __VA_ARGS__); printf("\n"); } \
	else { printf(PROG ": FAIL: " __VA_ARGS__); printf("\n"); failures++; } \
	fflush(stdout); \
} while (0)

UNUSED static uint8_t pat(int which, size_t i)
{
	return (uint8_t)(i * (2 * which + 5) + 17 * which + (i >> 8));
}

UNUSED static void die(const char *what)
{
	printf(PROG ": FAIL: %s: %s\n", what, strerror(errno));
	exit(2);
}

/* The first device's context, a PD, a CQ and port 1's GID: a side without its QP. */
UNUSED static void open_ctx(struct side *s)
{
	struct ibv_device **list = ibv_get_device_list(NULL);

	if (!list || !list[0])
		die("no device");
	s->ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!s->ctx)
		die("ibv_open_device");
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	if (!s->pd || !s->cq)
		die("pd/cq");
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid");
}

/* open_ctx and an RC QP of ibv_create_qp. */
UNUSED static void open_side(struct side *s)
{
	struct ibv_qp_init_attr qa = {0};

	open_ctx(s);
	qa.send_cq = qa.recv_cq = s->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 16;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	s->qp = ibv_create_qp(s->pd, &qa);
	if (!s->qp)
		die("ibv_create_qp");
}

/* Connects the side's QP to the peer's (INIT, RTR, RTS); a peer of the side's own QPN
 * and GID connects it to itself. */
UNUSED static void connect_qp(struct side *s, const struct peer_info *p)
{
	struct ibv_qp_attr a = {0};

	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = ACCESS;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		die("INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = p->qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = p->gid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			  IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
}

UNUSED static struct ibv_wc wait_wc(struct side *s)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(s->cq, 1, &wc);
	} while (n == 0);
	if (n < 0)
		die("ibv_poll_cq");
	return wc;
}

/* A malloc'ed buffer whose start is not page aligned, filled with a pattern. */
UNUSED static uint8_t *unaligned(size_t n, int which)
{
	uint8_t *p = malloc(n + 123);
	size_t i;

	if (!p)
		die("malloc");
	p += 123;
	for (i = 0; i < n; i++)
		p[i] = pat(which, i);
	return p;
}

UNUSED static int post(struct side *s, enum ibv_wr_opcode op, void *local, uint32_t len,
		uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = {.addr = (uintptr_t)local, .length = len, .lkey = lkey};
	struct ibv_send_wr wr = {0}, *bad;

	wr.wr_id = op;
	wr.opcode = op;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(s->qp, &wr, &bad);
}

/* The line of /proc/self/maps whose range holds p: its permissions (perms, 8 bytes) and
 * its name in name (n bytes; "" when anonymous). Returns 0, or -1 when no mapping holds p
 * (or the file cannot be read). */
UNUSED static int mapping_of_addr(const void *p, char perms[8], char *name, size_t n)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int rc = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char nm[256] = "";

		if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %255[^\n]", &lo, &hi, perms, nm) < 3)
			continue;
		if (lo <= (uintptr_t)p && (uintptr_t)p < hi) {
			snprintf(name, n, "%s", nm);
			rc = 0;
			break;
		}
	}
	fclose(f);
	return rc;
}

#endif
