/* rdma_cm with a QP of the program's own: an mlx5dv QP able to configure MKEYs, moved
 * through its states by the program (rdma_init_qp_attr(3) and ibv_modify_qp), connected
 * with rdma_connect / rdma_accept naming it by qp_num, as a storage initiator and target
 * that want mlx5dv's send ops do it (rdma_create_qp makes a plain ibv QP).
 *
 *     cm_dif [-p PORT]          the target: listens on rdma_cm port PORT (any address)
 *     cm_dif [-p PORT] ADDR     the initiator: connects to the target at ADDR
 *
 * The target offers a plain buffer of 8 blocks of 520 bytes (its address, rkey and
 * length in the REP's private data, which the initiator finds in its
 * RDMA_CM_EVENT_CONNECT_RESPONSE). The initiator's memory holds plain data, 8 blocks of
 * 512 bytes; a T10-DIF MKEY over it (mlx5dv_wr_mkey_configure + mlx5dv_wr_set_mkey_sig_block:
 * bg 0xffff, app tag 0x5a5a, ref tag 0x1000, REF_REMAP, in the wire domain) adds an
 * 8-byte PI to each block as the RDMA_WRITE leaves. The initiator then SENDs "written";
 * the target prints what it holds (image target_memory), for a checker to judge
 * independently, and checks the PIs itself. The initiator RDMA_READs the buffer back
 * through the MKEY (the PIs checked and stripped), SENDs "done" and disconnects.
 *
 * Lines on stdout are cex.h's (image, mkey_check, block, check, PASS | FAIL). */
#define _GNU_SOURCE
#include "cex.h"

#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>

#define BLOCKS 8
#define BLK 512
#define PI 8
#define SEED 1777
#define BG 0xffff
#define APP 0x5a5a
#define REF 0x1000
#define MSG 16
/* The target may not listen yet when the initiator starts (rdma_cm listens in the
 * peer's CM, not on a socket one could wait for): a REJ is tried again, for a while. */
#define CONNECT_TRIES 100
#define RETRY_USECONDS 100000
#define RESOLVE_MS 5000

/* What the target offers, in the REP's private data (big endian on the wire). */
struct offer {
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct side {
	struct cex c;                    /* the device part: ctx, pd, cq, qp (cex.c's helpers) */
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;           /* the connected id */
	struct rdma_cm_id *listen_id;    /* the target's */
	uint8_t *msg;                    /* SEND / RECV messages */
	uint64_t recv_id[2];             /* the receive posted in each message slot */
	struct ibv_mr *msg_mr;
};

/* The next event of the channel, which must be `want`; its private data copied out. */
static struct rdma_cm_event *get_event(struct side *s, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;

	if (rdma_get_cm_event(s->ch, &ev))
		cex_die("rdma_get_cm_event: %s", strerror(errno));
	if (ev->event != want)
		cex_die("got %s (status %d), waiting for %s", rdma_event_str(ev->event),
			ev->status, rdma_event_str(want));
	return ev;
}

static void expect_event(struct side *s, enum rdma_cm_event_type want)
{
	rdma_ack_cm_event(get_event(s, want));
}

/* The PD, the CQ and a QP made by mlx5dv_create_qp on the id's device, with the send
 * ops the data and the MKEY configure WRs need (cex_open's, on a context librdmacm
 * opened). */
static void open_on(struct side *s, struct ibv_context *ctx)
{
	struct ibv_qp_init_attr_ex qa = {};
	struct mlx5dv_qp_init_attr dva = {};
	struct cex *c = &s->c;

	if (!ctx)
		cex_die("the rdma_cm id has no device");
	c->ctx = ctx;
	c->pd = ibv_alloc_pd(ctx);
	if (!c->pd)
		cex_die("ibv_alloc_pd: %s", strerror(errno));
	c->cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!c->cq)
		cex_die("ibv_create_cq: %s", strerror(errno));
	qa.qp_type = IBV_QPT_RC;
	qa.send_cq = c->cq;
	qa.recv_cq = c->cq;
	qa.cap.max_send_wr = 16;
	qa.cap.max_recv_wr = 16;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.pd = c->pd;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
			    IBV_QP_EX_WITH_RDMA_READ;
	dva.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	dva.send_ops_flags = MLX5DV_QP_EX_WITH_MKEY_CONFIGURE;
	c->qp = mlx5dv_create_qp(ctx, &qa, &dva);
	if (!c->qp)
		cex_die("mlx5dv_create_qp: %s", strerror(errno));
	c->qpx = ibv_qp_to_qp_ex(c->qp);
	c->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(c->qpx);
	if (!c->qpx || !c->mqpx)
		cex_die("the QP has no extended interface");
	s->msg = cex_alloc(2 * MSG);
	s->msg_mr = cex_reg_mr(c, s->msg, 2 * MSG);
	printf("qp 0x%06x by mlx5dv_create_qp on %s\n", c->qp->qp_num,
	       ibv_get_device_name(ctx->device));
}

/* The QP to `state` with the attributes rdma_cm says (rdma_init_qp_attr(3)): what
 * librdmacm itself does to a QP it made. */
static void move_qp(struct side *s, enum ibv_qp_state state, const char *name)
{
	struct ibv_qp_attr a = { .qp_state = state };
	int mask = 0, rc;

	if (rdma_init_qp_attr(s->id, &a, &mask))
		cex_die("rdma_init_qp_attr(%s): %s", name, strerror(errno));
	rc = ibv_modify_qp(s->c.qp, &a, mask);
	if (rc)
		cex_die("ibv_modify_qp(%s): %s", name, strerror(rc));
}

static void to_rts(struct side *s)
{
	/* INIT again: now with the connection's remote access (the IB CM's) */
	move_qp(s, IBV_QPS_INIT, "INIT");
	move_qp(s, IBV_QPS_RTR, "RTR");
	move_qp(s, IBV_QPS_RTS, "RTS");
}

static void qp_to(struct side *s, enum ibv_qp_state state)
{
	struct ibv_qp_attr a = { .qp_state = state };

	if (ibv_modify_qp(s->c.qp, &a, IBV_QP_STATE))
		cex_die("ibv_modify_qp(state %d): %s", state, strerror(errno));
}

static void post_recv_msg(struct side *s, int slot)
{
	s->recv_id[slot] = cex_post_recv(&s->c, s->msg_mr->lkey, (uintptr_t)(s->msg + slot * MSG), MSG);
}

static void send_msg(struct side *s, const char *text)
{
	memset(s->msg, 0, MSG);
	snprintf((char *)s->msg, MSG, "%s", text);
	cex_send(&s->c, s->msg_mr->lkey, (uintptr_t)s->msg, MSG);
}

static void wait_msg(struct side *s, int slot, const char *want)
{
	const char *got = (const char *)(s->msg + slot * MSG);

	cex_wait_recv_wr(&s->c, s->recv_id[slot], MSG);
	if (strncmp(got, want, MSG))
		cex_die("the peer sent \"%.*s\", not \"%s\"", MSG, got, want);
}

static void target(struct side *s)
{
	const size_t len = BLOCKS * (BLK + PI);
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP };
	struct rdma_addrinfo *res;
	struct rdma_conn_param cp = {};
	struct rdma_cm_event *ev;
	struct offer offer;
	struct ibv_mr *mr;
	char service[16];
	uint8_t *buf;
	uint8_t rr, depth;

	snprintf(service, sizeof(service), "%d", s->c.port);
	if (rdma_getaddrinfo(NULL, service, &hints, &res))
		cex_die("rdma_getaddrinfo(port %s): %s", service, strerror(errno));
	if (rdma_create_id(s->ch, &s->listen_id, NULL, RDMA_PS_TCP))
		cex_die("rdma_create_id: %s", strerror(errno));
	if (rdma_bind_addr(s->listen_id, res->ai_src_addr) || rdma_listen(s->listen_id, 1))
		cex_die("listen on rdma_cm port %s: %s", service, strerror(errno));
	rdma_freeaddrinfo(res);
	printf("listening on rdma_cm port %s\n", service);
	fflush(stdout);

	ev = get_event(s, RDMA_CM_EVENT_CONNECT_REQUEST);
	s->id = ev->id;
	/* this side's resources as the IB CM hands them up: its responder resources are
	 * the peer's initiator depth */
	rr = ev->param.conn.responder_resources;
	depth = ev->param.conn.initiator_depth;
	printf("connect request from qp 0x%06x\n", ev->param.conn.qp_num);
	rdma_ack_cm_event(ev);

	open_on(s, s->id->verbs);
	buf = cex_alloc(len);
	mr = cex_reg_mr(&s->c, buf, len);
	to_rts(s);
	/* both messages' receives before the REP: the initiator may SEND at once */
	post_recv_msg(s, 0);
	post_recv_msg(s, 1);

	offer = (struct offer){ .addr = htobe64((uintptr_t)buf), .rkey = htobe32(mr->rkey),
				.len = htobe32((uint32_t)len) };
	cp.qp_num = s->c.qp->qp_num;
	cp.responder_resources = rr;
	cp.initiator_depth = depth;
	cp.rnr_retry_count = 7;
	cp.private_data = &offer;
	cp.private_data_len = sizeof(offer);
	if (rdma_accept(s->id, &cp))
		cex_die("rdma_accept: %s", strerror(errno));
	expect_event(s, RDMA_CM_EVENT_ESTABLISHED);
	printf("established, offering %zu bytes at rkey 0x%08x\n", len, mr->rkey);
	fflush(stdout);

	wait_msg(s, 0, "written");
	cex_image("target_memory", buf, len);
	cex_check_dif(&s->c, "target_memory", buf, BLOCKS, BLK, BG, APP, REF);
	wait_msg(s, 1, "done");
	expect_event(s, RDMA_CM_EVENT_DISCONNECTED);
	/* the QP is ours: rdma_disconnect leaves it to us (its WRs flush in ERR) */
	qp_to(s, IBV_QPS_ERR);
	ibv_dereg_mr(mr);
	free(buf);
}

/* One connection attempt from a fresh id: 0 once established, -1 when the target
 * rejected it (not listening yet), the QP then back in RESET for the next try. */
static int connect_once(struct side *s, struct rdma_addrinfo *res, struct offer *offer)
{
	struct rdma_conn_param cp = {};
	struct rdma_cm_event *ev;

	if (rdma_create_id(s->ch, &s->id, NULL, RDMA_PS_TCP))
		cex_die("rdma_create_id: %s", strerror(errno));
	if (rdma_resolve_addr(s->id, res->ai_src_addr, res->ai_dst_addr, RESOLVE_MS))
		cex_die("rdma_resolve_addr: %s", strerror(errno));
	expect_event(s, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (rdma_resolve_route(s->id, RESOLVE_MS))
		cex_die("rdma_resolve_route: %s", strerror(errno));
	expect_event(s, RDMA_CM_EVENT_ROUTE_RESOLVED);
	if (!s->c.qp)
		open_on(s, s->id->verbs);
	else if (s->id->verbs != s->c.ctx)
		cex_die("the route's device changed between tries");
	/* INIT before the REQ, as rdma_create_qp leaves librdmacm's QPs */
	move_qp(s, IBV_QPS_INIT, "INIT");

	cp.qp_num = s->c.qp->qp_num;
	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	if (rdma_connect(s->id, &cp))
		cex_die("rdma_connect: %s", strerror(errno));
	if (rdma_get_cm_event(s->ch, &ev))
		cex_die("rdma_get_cm_event: %s", strerror(errno));
	if (ev->event == RDMA_CM_EVENT_REJECTED) {
		rdma_ack_cm_event(ev);
		qp_to(s, IBV_QPS_RESET);
		rdma_destroy_id(s->id);
		s->id = NULL;
		return -1;
	}
	/* A program that moves its own QP gets CONNECT_RESPONSE (librdmacm's own QPs go
	 * straight to ESTABLISHED): RTR and RTS, then the RTU with rdma_establish. */
	if (ev->event != RDMA_CM_EVENT_CONNECT_RESPONSE)
		cex_die("got %s (status %d), waiting for RDMA_CM_EVENT_CONNECT_RESPONSE",
			rdma_event_str(ev->event), ev->status);
	if (ev->param.conn.private_data_len < sizeof(*offer))
		cex_die("the REP carries %u bytes of private data, not an offer",
			ev->param.conn.private_data_len);
	memcpy(offer, ev->param.conn.private_data, sizeof(*offer));
	printf("connect response from qp 0x%06x\n", ev->param.conn.qp_num);
	rdma_ack_cm_event(ev);
	to_rts(s);
	if (rdma_establish(s->id))
		cex_die("rdma_establish: %s", strerror(errno));
	return 0;
}

static void initiator(struct side *s)
{
	const struct mlx5dv_sig_t10dif dif = {
		.bg_type = MLX5DV_SIG_T10DIF_CRC, .bg = BG, .app_tag = APP, .ref_tag = REF,
		.flags = MLX5DV_SIG_T10DIF_FLAG_REF_REMAP,
	};
	const struct mlx5dv_sig_block_domain wire = {
		.sig_type = MLX5DV_SIG_TYPE_T10DIF, .sig.dif = &dif,
		.block_size = MLX5DV_BLOCK_SIZE_512,
	};
	const struct mlx5dv_sig_block_attr sig = { .mem = NULL, .wire = &wire, .check_mask = 0xff };
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
	struct cex *c = &s->c;
	struct mlx5dv_mkey *mkey;
	struct mlx5dv_mkey_err e;
	struct ibv_mr *mr;
	struct ibv_sge sge;
	struct offer offer;
	uint8_t *mem, *data;
	char service[16];
	int tries;

	snprintf(service, sizeof(service), "%d", c->port);
	if (rdma_getaddrinfo(c->peer_addr, service, &hints, &res))
		cex_die("rdma_getaddrinfo(%s, %s): %s", c->peer_addr, service, strerror(errno));
	for (tries = 1; connect_once(s, res, &offer); tries++) {
		if (tries == CONNECT_TRIES)
			cex_die("%s:%s rejected %d connects: is the target listening?",
				c->peer_addr, service, tries);
		usleep(RETRY_USECONDS);
	}
	rdma_freeaddrinfo(res);
	c->peer.addr = be64toh(offer.addr);
	c->peer.rkey = be32toh(offer.rkey);
	c->peer.len = be32toh(offer.len);
	printf("established after %d connect(s): the target offers %llu bytes at rkey 0x%08x\n",
	       tries, (unsigned long long)c->peer.len, c->peer.rkey);
	if (c->peer.len < BLOCKS * (BLK + PI))
		cex_die("the target offers %llu bytes, not %d", (unsigned long long)c->peer.len,
			BLOCKS * (BLK + PI));

	mem = cex_alloc(BLOCKS * BLK);
	data = cex_alloc(BLOCKS * BLK);
	cex_pattern(data, BLOCKS * BLK, SEED);
	memcpy(mem, data, BLOCKS * BLK);
	mr = cex_reg_mr(c, mem, BLOCKS * BLK);
	mkey = cex_create_mkey(c, MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
			       MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE, 1);
	sge = (struct ibv_sge){ .addr = (uintptr_t)mem, .length = BLOCKS * BLK, .lkey = mr->lkey };
	/* the configure WR on the connected QP (in RTS), before the data WRs that use it */
	cex_configure(c, mkey, IBV_ACCESS_LOCAL_WRITE,
		      &(struct cex_layout){ .num_sges = 1, .sges = &sge }, &sig, NULL);
	cex_image("initiator_memory", mem, BLOCKS * BLK);
	/* the SGE names the MKEY from 0 and counts the wire's bytes, PIs included */
	cex_rdma_write(c, mkey->lkey, 0, BLOCKS * (BLK + PI), c->peer.rkey, c->peer.addr);
	e = cex_mkey_check(c, "after_write", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "mkey_check after the write finds nothing");
	send_msg(s, "written");
	memset(mem, 0, BLOCKS * BLK);
	cex_rdma_read(c, mkey->lkey, 0, BLOCKS * (BLK + PI), c->peer.rkey, c->peer.addr);
	cex_image("initiator_memory_read", mem, BLOCKS * BLK);
	cex_check(c, !memcmp(mem, data, BLOCKS * BLK),
		  "the read brought the data back, T10-DIFs checked and stripped");
	e = cex_mkey_check(c, "after_read", mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "every T10-DIF the target held was valid");
	send_msg(s, "done");
	/* the QP is ours: to ERR before the DREQ, as librdmacm does to its own */
	qp_to(s, IBV_QPS_ERR);
	if (rdma_disconnect(s->id))
		cex_die("rdma_disconnect: %s", strerror(errno));
	expect_event(s, RDMA_CM_EVENT_DISCONNECTED);
	mlx5dv_destroy_mkey(mkey);
	ibv_dereg_mr(mr);
	free(mem);
	free(data);
}

int main(int argc, char **argv)
{
	struct side s = {};
	int rc;

	cex_args(&s.c, argc, argv);
	s.ch = rdma_create_event_channel();
	if (!s.ch)
		cex_die("rdma_create_event_channel: %s", strerror(errno));
	if (cex_is_target(&s.c))
		target(&s);
	else
		initiator(&s);
	if (s.msg_mr)
		ibv_dereg_mr(s.msg_mr);
	free(s.msg);
	/* the device context is librdmacm's, closed with its last id: not cex_close's */
	if (s.c.qp && ibv_destroy_qp(s.c.qp))
		fprintf(stderr, "ibv_destroy_qp: %s\n", strerror(errno));
	if (s.c.cq && ibv_destroy_cq(s.c.cq))
		fprintf(stderr, "ibv_destroy_cq: %s\n", strerror(errno));
	if (s.c.pd && ibv_dealloc_pd(s.c.pd))
		fprintf(stderr, "ibv_dealloc_pd: %s\n", strerror(errno));
	s.c.qp = NULL;
	s.c.cq = NULL;
	s.c.pd = NULL;
	s.c.ctx = NULL;
	if (s.id)
		rdma_destroy_id(s.id);
	if (s.listen_id)
		rdma_destroy_id(s.listen_id);
	rdma_destroy_event_channel(s.ch);
	rc = cex_finish(&s.c);
	return rc;
}
