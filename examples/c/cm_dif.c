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
	struct cex *c = &s->c;

	if (!ctx)
		cex_die("the rdma_cm id has no device");
	cex_open_qp(c, ctx, 64, 16, 1);
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
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
	struct cex *c = &s->c;
	struct cex_dif_io io;
	struct offer offer;
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

	cex_dif_io_init(c, &io, BLOCKS * BLK, BLOCKS * (BLK + PI), SEED);
	/* the configure WR on the connected QP (in RTS), before the data WRs that use it */
	cex_configure_wire_dif(c, io.mkey, IBV_ACCESS_LOCAL_WRITE, &io.sge, BG, APP, REF);
	cex_dif_io_write(c, &io);
	send_msg(s, "written");
	cex_dif_io_read(c, &io);
	send_msg(s, "done");
	/* the QP is ours: to ERR before the DREQ, as librdmacm does to its own */
	qp_to(s, IBV_QPS_ERR);
	if (rdma_disconnect(s->id))
		cex_die("rdma_disconnect: %s", strerror(errno));
	expect_event(s, RDMA_CM_EVENT_DISCONNECTED);
	cex_dif_io_free(&io);
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
