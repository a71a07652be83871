/* A C check of softhca's librdmacm where no rdmacm-utils program looks
 * (tests/native/test_rdmacm.py): rdma_set_option's answers, rdma_resolve_addr's
 * timeout, what rdma_disconnect does to both sides' QPs, and the timewait that follows
 * (RDMA_CM_EVENT_TIMEWAIT_EXIT once the connection's QP may be used again). Each mode
 * prints one line per fact, judged by the test.
 *
 *   cmcheck options
 *   cmcheck resolve ADDR TIMEOUT_MS
 *   cmcheck flush-server PORT
 *   cmcheck flush-client ADDR PORT
 *   cmcheck exit-server PORT        (DISCONNECTED when the client's process ends)
 *   cmcheck exit-client ADDR PORT   (connects, then exits without rdma_disconnect)
 *   cmcheck addrinfo ADDR           (rdma_getaddrinfo from the hints' addresses; a
 *                                    loopback bind has no device, ADDR's has)
 *   cmcheck access-server PORT RR   (rdma_init_qp_attr's INIT access: unconnected, at
 *                                    the CONNECT_REQUEST, after rdma_accept with RR
 *                                    responder resources)
 *   cmcheck access-client ADDR PORT DEPTH  (connects with initiator depth DEPTH)
 *   cmcheck migrate ADDR            (rdma_migrate_id: pending events move, the wait
 *                                    for an unacknowledged one, to and from synchronous)
 *   cmcheck ip-binds V4ADDR         (IPv6 binds and resolves: the wildcard, loopback,
 *                                    IPv4-mapped, an address no interface has; the
 *                                    port a v4 wildcard holds, with and without AFONLY)
 *   cmcheck ip-server ADDR PORT AFONLY N  (a listener on ADDR, v4 or v6; AFONLY 0 or 1
 *                                    set before the bind, -1 left alone; accepts N
 *                                    connections and prints each one's addresses)
 *   cmcheck ip-client PORT ADDR...  (connects to each ADDR in turn; the first is
 *                                    retried while it is rejected, until the listener
 *                                    is up)
 *   cmcheck rnr-server PORT DELAY_MS (accepts asking the client's QP for RNR retry
 *                                    count 1, and posts its one receive DELAY_MS after
 *                                    ESTABLISHED: the client's SEND meets an RNR NAK)
 *   cmcheck rnr-client ADDR PORT    (connects and SENDs at once; the SEND's status
 *                                    and how long it took)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>

#define NRECV 4

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void die(const char *what)
{
	printf("FAIL %s: %s\n", what, strerror(errno));
	exit(1);
}

static struct rdma_cm_event *expect(struct rdma_event_channel *ch,
				    enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;

	if (rdma_get_cm_event(ch, &ev))
		die("rdma_get_cm_event");
	if (ev->event != want) {
		printf("FAIL wanted %s, got %s status %d\n", rdma_event_str(want),
		       rdma_event_str(ev->event), ev->status);
		exit(1);
	}
	return ev;
}

static void set_opt(struct rdma_cm_id *id, const char *name, int level, int opt,
		    void *v, size_t len)
{
	int rc = rdma_set_option(id, level, opt, v, len);

	printf("%s %s\n", name, rc ? strerror(errno) : "ok");
}

static int options(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id, *other;
	struct sockaddr_in sin = {.sin_family = AF_INET};
	uint8_t tos = 32, timeout = 18, big = 32;
	int one = 1;

	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_create_id(ch, &other, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	set_opt(id, "tos", RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos));
	set_opt(id, "tos-int", RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &one, sizeof(one));
	set_opt(id, "ack-timeout", RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, 1);
	set_opt(id, "ack-timeout-32", RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &big, 1);
	set_opt(id, "afonly", RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof(one));
	set_opt(id, "unknown", RDMA_OPTION_ID, 77, &one, sizeof(one));
	set_opt(id, "ib-path", RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, &one, sizeof(one));
	set_opt(id, "reuseaddr", RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof(one));
	set_opt(other, "reuseaddr-other", RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one,
		sizeof(one));
	/* two ids that both asked for REUSEADDR bind one port */
	sin.sin_port = htons(7391);
	printf("bind %s\n", rdma_bind_addr(id, (struct sockaddr *)&sin) ? strerror(errno) : "ok");
	printf("bind-shared %s\n",
	       rdma_bind_addr(other, (struct sockaddr *)&sin) ? strerror(errno) : "ok");
	/* ... but neither may listen on it while the other holds it */
	printf("listen-shared %s\n", rdma_listen(id, 1) ? strerror(errno) : "ok");
	set_opt(id, "reuseaddr-bound", RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one,
		sizeof(one));
	rdma_destroy_id(other);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	return 0;
}

static int resolve(const char *addr, int timeout_ms)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(7392)};
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	double t0;

	inet_pton(AF_INET, addr, &sin.sin_addr);
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	t0 = now_ms();
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, timeout_ms))
		die("rdma_resolve_addr");
	if (rdma_get_cm_event(ch, &ev))
		die("rdma_get_cm_event");
	printf("event %s status %d ms %.0f\n", rdma_event_str(ev->event), ev->status,
	       now_ms() - t0);
	rdma_ack_cm_event(ev);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	return 0;
}

/* The id's QP with NRECV receives posted (its own CQs: rdma_create_qp makes them). */
static struct ibv_mr *qp_with_recvs(struct rdma_cm_id *id, char *buf)
{
	struct ibv_qp_init_attr a = {.cap = {.max_send_wr = 4, .max_recv_wr = NRECV,
					     .max_send_sge = 1, .max_recv_sge = 1},
				     .qp_type = IBV_QPT_RC};
	struct ibv_mr *mr;
	int i;

	if (rdma_create_qp(id, NULL, &a))
		die("rdma_create_qp");
	mr = ibv_reg_mr(id->pd, buf, 64 * NRECV, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("ibv_reg_mr");
	for (i = 0; i < NRECV; i++) {
		struct ibv_sge sge = {(uintptr_t)buf + 64 * i, 64, mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;

		if (ibv_post_recv(id->qp, &wr, &bad))
			die("ibv_post_recv");
	}
	return mr;
}

/* The receives' completions (each a flush once the QP is in ERR), within 5 s. */
static void flushed(const char *who, struct rdma_cm_id *id)
{
	struct ibv_wc wc[NRECV];
	int n = 0, flush = 0, i, k;
	double t0 = now_ms();

	while (n < NRECV && now_ms() - t0 < 5000) {
		k = ibv_poll_cq(id->recv_cq, NRECV - n, wc);
		for (i = 0; i < k; i++)
			flush += wc[i].status == IBV_WC_WR_FLUSH_ERR;
		n += k > 0 ? k : 0;
	}
	printf("%s flushed %d of %d\n", who, flush, NRECV);
}

static int pending(struct rdma_cm_id *id)
{
	struct ibv_wc wc;

	return ibv_poll_cq(id->recv_cq, 1, &wc);
}

/* The timewait after a disconnect: TIMEWAIT_EXIT (rdma_get_cm_event(3)), and how long
 * it took from the DISCONNECTED event. */
static void timewait(struct rdma_event_channel *ch, const char *who, double since)
{
	struct rdma_cm_event *ev = expect(ch, RDMA_CM_EVENT_TIMEWAIT_EXIT);

	printf("%s TIMEWAIT_EXIT status %d after %.0f ms\n", who, ev->status,
	       now_ms() - since);
	rdma_ack_cm_event(ev);
}

static int flush_server(int port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
	struct rdma_cm_id *lid, *id;
	struct rdma_cm_event *ev;
	static char buf[64 * NRECV];
	double t;

	if (!ch || rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_bind_addr(lid, (struct sockaddr *)&sin) || rdma_listen(lid, 1))
		die("rdma_listen");
	ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	id = ev->id;
	rdma_ack_cm_event(ev);
	qp_with_recvs(id, buf);
	if (rdma_accept(id, NULL))
		die("rdma_accept");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
	t = now_ms();
	printf("server DISCONNECTED, completions before its own rdma_disconnect: %d\n",
	       pending(id));
	if (rdma_disconnect(id))
		die("rdma_disconnect");
	flushed("server", id);
	timewait(ch, "server", t);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_id(lid);
	return 0;
}

static int flush_client(const char *addr, int port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
	struct rdma_cm_id *id;
	static char buf[64 * NRECV];

	inet_pton(AF_INET, addr, &sin.sin_addr);
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000))
		die("rdma_resolve_addr");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 2000))
		die("rdma_resolve_route");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	qp_with_recvs(id, buf);
	if (rdma_connect(id, NULL))
		die("rdma_connect");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	if (rdma_disconnect(id))
		die("rdma_disconnect");
	flushed("client", id);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
	printf("client DISCONNECTED\n");
	timewait(ch, "client", now_ms());
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	return 0;
}

/* Accept one connection, then wait up to 10 s for DISCONNECTED: the peer process exits
 * without rdma_disconnect, and its CM must tell this side, as the kernel's does for the
 * ids of a process that dies. */
static int exit_server(int port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
	struct rdma_cm_id *lid, *id;
	struct rdma_cm_event *ev;
	static char buf[64 * NRECV];
	struct pollfd pfd;
	double t;

	if (!ch || rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_bind_addr(lid, (struct sockaddr *)&sin) || rdma_listen(lid, 1))
		die("rdma_listen");
	ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	id = ev->id;
	rdma_ack_cm_event(ev);
	qp_with_recvs(id, buf);
	if (rdma_accept(id, NULL))
		die("rdma_accept");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	t = now_ms();
	printf("server ESTABLISHED\n");
	pfd.fd = ch->fd;
	pfd.events = POLLIN;
	if (poll(&pfd, 1, 10000) != 1) {
		printf("server no event within 10000 ms\n");
		return 1;
	}
	ev = expect(ch, RDMA_CM_EVENT_DISCONNECTED);
	printf("server DISCONNECTED after %.0f ms\n", now_ms() - t);
	rdma_ack_cm_event(ev);
	return 0;
}

static int exit_client(const char *addr, int port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
	struct rdma_cm_id *id;
	static char buf[64 * NRECV];

	inet_pton(AF_INET, addr, &sin.sin_addr);
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000))
		die("rdma_resolve_addr");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 2000))
		die("rdma_resolve_route");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	qp_with_recvs(id, buf);
	if (rdma_connect(id, NULL))
		die("rdma_connect");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	printf("client ESTABLISHED, exiting\n");
	_exit(0);
}

static const char *access_names(struct rdma_cm_id *id, char *buf)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT};
	int mask;

	if (rdma_init_qp_attr(id, &a, &mask))
		die("rdma_init_qp_attr");
	snprintf(buf, 96, "%s%s%s%s", a.qp_access_flags & IBV_ACCESS_REMOTE_WRITE ?
		 " REMOTE_WRITE" : "", a.qp_access_flags & IBV_ACCESS_REMOTE_READ ?
		 " REMOTE_READ" : "", a.qp_access_flags & IBV_ACCESS_REMOTE_ATOMIC ?
		 " REMOTE_ATOMIC" : "", a.qp_access_flags ? "" : " none");
	return buf + 1;
}

/* The QP's RNR retry count (ibv_query_qp), -1 if it cannot be read. */
static int rnr_retry_of(struct rdma_cm_id *id)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	if (ibv_query_qp(id->qp, &a, IBV_QP_RNR_RETRY, &ia))
		return -1;
	return a.rnr_retry;
}

static int access_server(int port, int rr)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
	struct rdma_conn_param p = {.responder_resources = rr, .initiator_depth = 1,
				    .rnr_retry_count = 3};
	struct rdma_cm_id *lid, *id;
	struct rdma_cm_event *ev;
	static char buf[64 * NRECV];
	char names[96];

	if (!ch || rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_bind_addr(lid, (struct sockaddr *)&sin) || rdma_listen(lid, 1))
		die("rdma_listen");
	printf("server unconnected: %s\n", access_names(lid, names));
	ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	id = ev->id;
	/* the peer's initiator depth: the event's responder resources (the IB CM hands
	 * the REQ's values up as this side's to give) */
	printf("server request with initiator depth %u: %s\n",
	       ev->param.conn.responder_resources, access_names(id, names));
	printf("server request event: responder_resources %u initiator_depth %u\n",
	       ev->param.conn.responder_resources, ev->param.conn.initiator_depth);
	rdma_ack_cm_event(ev);
	qp_with_recvs(id, buf);
	if (rdma_accept(id, &p))
		die("rdma_accept");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	printf("server accepted with responder resources %d: %s\n", rr,
	       access_names(id, names));
	printf("server qp rnr_retry %d\n", rnr_retry_of(id));
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_disconnect(id);
	return 0;
}

static int access_client(const char *addr, int port, int depth)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
	struct rdma_conn_param p = {.responder_resources = 1, .initiator_depth = depth,
				    .retry_count = 7, .rnr_retry_count = 7};
	struct rdma_cm_id *id;
	static char buf[64 * NRECV];

	inet_pton(AF_INET, addr, &sin.sin_addr);
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000))
		die("rdma_resolve_addr");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 2000))
		die("rdma_resolve_route");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	qp_with_recvs(id, buf);
	if (rdma_connect(id, &p))
		die("rdma_connect");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	printf("client ESTABLISHED\n");
	printf("client qp rnr_retry %d\n", rnr_retry_of(id));
	if (rdma_disconnect(id))
		die("rdma_disconnect");
	return 0;
}

/* A WC of cq within 10 s; its status, or -1 for none. */
static int one_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	double t0 = now_ms();

	while (now_ms() - t0 < 10000)
		if (ibv_poll_cq(cq, 1, wc) == 1)
			return wc->status;
	return -1;
}

/* The RNR NAK timer rdma_cm gives the QP: the kernel's IB CM gives 0 (655.36 ms), so
 * a receive posted a few hundred ms late still takes the peer's SEND with RNR retry
 * count 1 (one NAK, one wait). */
static int rnr_server(int port, int delay_ms)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
	struct rdma_conn_param p = {.responder_resources = 1, .initiator_depth = 1,
				    .rnr_retry_count = 1};
	struct ibv_qp_init_attr a = {.cap = {.max_send_wr = 4, .max_recv_wr = 4,
					     .max_send_sge = 1, .max_recv_sge = 1},
				     .qp_type = IBV_QPT_RC};
	struct ibv_qp_attr rtr = {.qp_state = IBV_QPS_RTR};
	struct rdma_cm_id *lid, *id;
	struct rdma_cm_event *ev;
	static char buf[64];
	struct ibv_mr *mr;
	struct ibv_wc wc;
	int mask, st;

	if (!ch || rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_bind_addr(lid, (struct sockaddr *)&sin) || rdma_listen(lid, 1))
		die("rdma_listen");
	ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	id = ev->id;
	rdma_ack_cm_event(ev);
	if (rdma_create_qp(id, NULL, &a))
		die("rdma_create_qp");
	mr = ibv_reg_mr(id->pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("ibv_reg_mr");
	if (rdma_accept(id, &p))
		die("rdma_accept");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	if (rdma_init_qp_attr(id, &rtr, &mask))
		die("rdma_init_qp_attr");
	printf("server rtr min_rnr_timer %u (mask has it: %s)\n", rtr.min_rnr_timer,
	       mask & IBV_QP_MIN_RNR_TIMER ? "yes" : "no");
	usleep(delay_ms * 1000);
	{
		struct ibv_sge sge = {(uintptr_t)buf, sizeof(buf), mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad;

		if (ibv_post_recv(id->qp, &wr, &bad))
			die("ibv_post_recv");
	}
	st = one_wc(id->recv_cq, &wc);
	printf("server receive posted %d ms late: %s, %u bytes\n", delay_ms,
	       st < 0 ? "none" : ibv_wc_status_str(wc.status), st < 0 ? 0 : wc.byte_len);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_disconnect(id);
	return 0;
}

static int rnr_client(const char *addr, int port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
	struct rdma_cm_id *id;
	static char buf[64 * NRECV];
	struct ibv_mr *mr;
	struct ibv_wc wc;
	double t0;
	int st;

	inet_pton(AF_INET, addr, &sin.sin_addr);
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000))
		die("rdma_resolve_addr");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 2000))
		die("rdma_resolve_route");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	mr = qp_with_recvs(id, buf);
	if (rdma_connect(id, NULL))
		die("rdma_connect");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	printf("client qp rnr_retry %d\n", rnr_retry_of(id));
	{
		struct ibv_sge sge = {(uintptr_t)buf, 32, mr->lkey};
		struct ibv_send_wr wr = {.wr_id = 7, .sg_list = &sge, .num_sge = 1,
					 .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED}, *bad;

		t0 = now_ms();
		if (ibv_post_send(id->qp, &wr, &bad))
			die("ibv_post_send");
	}
	st = one_wc(id->send_cq, &wc);
	printf("client send: %s after %.0f ms\n",
	       st < 0 ? "no completion" : ibv_wc_status_str(wc.status), now_ms() - t0);
	if (rdma_disconnect(id))
		die("rdma_disconnect");
	return 0;
}

static const char *ntop(const struct sockaddr *a, char *buf)
{
	const struct sockaddr_in *s = (const struct sockaddr_in *)a;

	if (!a)
		return "none";
	snprintf(buf, 64, "%s:%u", inet_ntoa(s->sin_addr), ntohs(s->sin_port));
	return buf;
}

static int addrinfo(const char *addr)
{
	struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(7471)};
	struct sockaddr_in lo = {.sin_family = AF_INET};
	struct sockaddr_in mine = {.sin_family = AF_INET};
	struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP}, *res;
	struct rdma_cm_id *id;
	char a[64], b[64];

	inet_pton(AF_INET, addr, &peer.sin_addr);
	hints.ai_dst_addr = (struct sockaddr *)&peer;
	hints.ai_dst_len = sizeof(peer);
	if (rdma_getaddrinfo(NULL, NULL, &hints, &res))
		die("rdma_getaddrinfo");
	printf("active from hints: dst %s\n", ntop(res->ai_dst_addr, a));
	rdma_freeaddrinfo(res);
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_port_space = RDMA_PS_TCP;
	hints.ai_src_addr = (struct sockaddr *)&peer;
	hints.ai_src_len = sizeof(peer);
	if (rdma_getaddrinfo(NULL, "7472", &hints, &res))
		die("rdma_getaddrinfo passive");
	printf("passive from hints: src %s dst %s\n", ntop(res->ai_src_addr, a),
	       ntop(res->ai_dst_addr, b));
	rdma_freeaddrinfo(res);

	inet_pton(AF_INET, "127.0.0.1", &lo.sin_addr);
	if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(id, (struct sockaddr *)&lo))
		die("bind 127.0.0.1");
	printf("bound 127.0.0.1: device %s\n", id->verbs ? "yes" : "none");
	rdma_destroy_id(id);
	inet_pton(AF_INET, addr, &mine.sin_addr);
	if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(id, (struct sockaddr *)&mine))
		die("bind ADDR");
	printf("bound %s: device %s\n", addr, id->verbs ? "yes" : "none");
	rdma_destroy_id(id);
	return 0;
}

/* rdma_migrate_id(3), with rdma_resolve_addr to ADDR (this daemon's own address: its
 * ADDR_RESOLVED comes at once) as the event source. */
struct migrating {
	struct rdma_cm_id *id;
	struct rdma_event_channel *to;
	int rc, done;
};

static void *migrate_main(void *arg)
{
	struct migrating *m = arg;

	m->rc = rdma_migrate_id(m->id, m->to);
	__atomic_store_n(&m->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static int readable(struct rdma_event_channel *ch, int ms)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};

	return poll(&p, 1, ms) == 1;
}

static int migrate(const char *addr)
{
	struct rdma_event_channel *a = rdma_create_event_channel();
	struct rdma_event_channel *b = rdma_create_event_channel();
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(7393)};
	struct timespec ms300 = {0, 300 * 1000 * 1000};
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	struct migrating m;
	pthread_t t;
	int rc;

	inet_pton(AF_INET, addr, &sin.sin_addr);
	if (!a || !b || rdma_create_id(a, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	/* 1. An event queued on A, unread, moves with the id to B. */
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000))
		die("rdma_resolve_addr");
	if (!readable(a, 5000))
		die("no event on A");
	if (rdma_migrate_id(id, b))
		die("rdma_migrate_id to B");
	printf("pending moved: A readable %d, B readable %d, id channel is B %d\n",
	       readable(a, 0), readable(b, 0), id->channel == b);
	if (rdma_get_cm_event(b, &ev))
		die("rdma_get_cm_event B");
	printf("B event %s status %d id matches %d\n", rdma_event_str(ev->event), ev->status,
	       ev->id == id);
	/* 2. Back to A while that event is not acknowledged: the call waits for the ack. */
	m = (struct migrating){.id = id, .to = a};
	if (pthread_create(&t, NULL, migrate_main, &m))
		die("pthread_create");
	nanosleep(&ms300, NULL);
	printf("migrate with an event unacknowledged: returned %d\n",
	       __atomic_load_n(&m.done, __ATOMIC_SEQ_CST));
	rdma_ack_cm_event(ev);
	pthread_join(t, NULL);
	printf("after the ack: returned %d rc %d, id channel is A %d\n", m.done, m.rc,
	       id->channel == a);
	/* 3. A new event goes to the id's new channel only. */
	if (rdma_resolve_route(id, 2000))
		die("rdma_resolve_route");
	if (!readable(a, 5000))
		die("no event on A");
	printf("new event: A readable 1, B readable %d\n", readable(b, 0));
	if (rdma_get_cm_event(a, &ev))
		die("rdma_get_cm_event A");
	printf("A event %s status %d\n", rdma_event_str(ev->event), ev->status);
	rdma_ack_cm_event(ev);
	/* 4. NULL: synchronous, then NULL again is EINVAL, then back to B. */
	rc = rdma_migrate_id(id, NULL);
	printf("to synchronous: rc %d, channel is neither A nor B %d\n", rc,
	       id->channel != a && id->channel != b && id->channel != NULL);
	errno = 0;
	rc = rdma_migrate_id(id, NULL);
	printf("synchronous again: rc %d errno %s\n", rc, errno == EINVAL ? "EINVAL" :
	       strerror(errno));
	rc = rdma_migrate_id(id, b);
	printf("synchronous to B: rc %d, id channel is B %d\n", rc, id->channel == b);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(a);
	rdma_destroy_event_channel(b);
	return 0;
}

/* An address as "AF_INET 10.0.0.1:7" or "AF_INET6 [::1]:7" (the family the id holds). */
static const char *sa_text(const struct sockaddr *a, char *buf)
{
	char ip[INET6_ADDRSTRLEN];

	if (a->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)a;

		inet_ntop(AF_INET, &s->sin_addr, ip, sizeof(ip));
		snprintf(buf, 80, "AF_INET %s:%u", ip, ntohs(s->sin_port));
	} else if (a->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)a;

		inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof(ip));
		snprintf(buf, 80, "AF_INET6 [%s]:%u", ip, ntohs(s->sin6_port));
	} else {
		snprintf(buf, 80, "family %d", a->sa_family);
	}
	return buf;
}

/* ADDR (either family's text) and PORT as a sockaddr. */
static struct sockaddr *sa_of(const char *addr, int port, struct sockaddr_storage *ss)
{
	struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;

	memset(ss, 0, sizeof(*ss));
	if (inet_pton(AF_INET6, addr, &s6->sin6_addr) == 1) {
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(port);
	} else if (inet_pton(AF_INET, addr, &s4->sin_addr) == 1) {
		s4->sin_family = AF_INET;
		s4->sin_port = htons(port);
	} else {
		printf("FAIL address %s\n", addr);
		exit(1);
	}
	return (struct sockaddr *)ss;
}

static const char *rc_text(int rc)
{
	return rc ? strerror(errno) : "ok";
}

/* One id bound to ADDR:PORT, AFONLY set first when afonly >= 0; NULL when it fails. */
static struct rdma_cm_id *bound(struct rdma_event_channel *ch, const char *addr, int port,
				int afonly, const char *label)
{
	struct sockaddr_storage ss;
	struct rdma_cm_id *id;
	char text[80];
	int rc;

	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (afonly >= 0 && rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &afonly,
					   sizeof(afonly)))
		die("rdma_set_option AFONLY");
	rc = rdma_bind_addr(id, sa_of(addr, port, &ss));
	printf("%s %s", label, rc_text(rc));
	if (!rc)
		printf(" %s", sa_text(rdma_get_local_addr(id), text));
	printf("\n");
	if (rc) {
		rdma_destroy_id(id);
		return NULL;
	}
	return id;
}

static int ip_binds(const char *v4)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *ids[8], *id;
	struct sockaddr_storage ss;
	char mapped[64];
	int n = 0, rc, i;

	if (!ch)
		die("rdma_create_event_channel");
	snprintf(mapped, sizeof(mapped), "::ffff:%s", v4);
	ids[n++] = bound(ch, "::", 7401, -1, "bind-any6");
	ids[n++] = bound(ch, "::1", 7402, -1, "bind-loopback6");
	ids[n++] = bound(ch, mapped, 7403, -1, "bind-mapped");
	ids[n++] = bound(ch, "2001:db8::1", 7404, -1, "bind-foreign6");
	/* A v4 wildcard's port: a v6 wildcard shares it only when it is AFONLY. */
	ids[n++] = bound(ch, "0.0.0.0", 7405, -1, "bind-any4");
	ids[n++] = bound(ch, "::", 7405, -1, "bind-any6-same-port");
	ids[n++] = bound(ch, "::", 7405, 1, "bind-any6-afonly-same-port");
	for (i = 0; i < n; i++)
		if (ids[i])
			printf("listen-%d %s\n", i, rc_text(rdma_listen(ids[i], 1)));
	/* A resolve to an IPv6 address that names no daemon: no route to it. */
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	rc = rdma_resolve_addr(id, NULL, sa_of("2001:db8::2", 7406, &ss), 1000);
	printf("resolve-foreign6 %s\n", rc_text(rc));
	/* Bound to one family, resolving the other: the kernel's EINVAL. */
	rc = rdma_bind_addr(id, sa_of("0.0.0.0", 0, &ss));
	if (rc)
		die("rdma_bind_addr");
	rc = rdma_resolve_addr(id, NULL, sa_of(mapped, 7406, &ss), 1000);
	printf("resolve-other-family %s\n", rc_text(rc));
	rdma_destroy_id(id);
	for (i = 0; i < n; i++)
		if (ids[i])
			rdma_destroy_id(ids[i]);
	rdma_destroy_event_channel(ch);
	return 0;
}

static void print_conn(const char *who, struct rdma_cm_id *id)
{
	char a[80], b[80];

	printf("%s local %s peer %s\n", who, sa_text(rdma_get_local_addr(id), a),
	       sa_text(rdma_get_peer_addr(id), b));
}

static void plain_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr a = {.cap = {.max_send_wr = 1, .max_recv_wr = 1,
					     .max_send_sge = 1, .max_recv_sge = 1},
				     .qp_type = IBV_QPT_RC};

	if (rdma_create_qp(id, NULL, &a))
		die("rdma_create_qp");
}

static int ip_server(const char *addr, int port, int afonly, int n)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid;
	struct rdma_cm_event *ev;
	int accepted = 0, gone = 0;

	if (!ch)
		die("rdma_create_event_channel");
	lid = bound(ch, addr, port, afonly, "server bind");
	if (!lid)
		return 1;
	if (rdma_listen(lid, 4))
		die("rdma_listen");
	print_conn("server listening", lid);
	while (gone < n) {
		if (rdma_get_cm_event(ch, &ev))
			die("rdma_get_cm_event");
		switch (ev->event) {
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			print_conn("server request", ev->id);
			plain_qp(ev->id);
			if (rdma_accept(ev->id, NULL))
				die("rdma_accept");
			break;
		case RDMA_CM_EVENT_ESTABLISHED:
			print_conn("server established", ev->id);
			accepted++;
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			rdma_disconnect(ev->id);
			gone++;
			break;
		default:
			printf("server event %s status %d\n", rdma_event_str(ev->event),
			       ev->status);
		}
		rdma_ack_cm_event(ev);
	}
	printf("server accepted %d\n", accepted);
	return 0;
}

static void ip_disconnect(struct rdma_event_channel *ch, struct rdma_cm_id *id)
{
	rdma_disconnect(id);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
}

/* One connect to ADDR:PORT: 0 established, else the REJECTED status (or -1). An
 * established connection is kept in *keep when keep is given, else disconnected. */
static int ip_connect(struct rdma_event_channel *ch, const char *addr, int port, int quiet,
		      struct rdma_cm_id **keep)
{
	struct sockaddr_storage ss;
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	char a[80], b[80];
	int st;

	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_resolve_addr(id, NULL, sa_of(addr, port, &ss), 2000))
		die("rdma_resolve_addr");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	sa_text(rdma_get_local_addr(id), a);
	sa_text(rdma_get_peer_addr(id), b);
	if (rdma_resolve_route(id, 2000))
		die("rdma_resolve_route");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	plain_qp(id);
	if (rdma_connect(id, NULL))
		die("rdma_connect");
	if (rdma_get_cm_event(ch, &ev))
		die("rdma_get_cm_event");
	if (ev->event == RDMA_CM_EVENT_ESTABLISHED || !quiet)
		printf("client resolved local %s peer %s\n", a, b);
	if (ev->event == RDMA_CM_EVENT_ESTABLISHED) {
		rdma_ack_cm_event(ev);
		print_conn("client established", id);
		if (keep) {
			*keep = id;
			return 0;
		}
		ip_disconnect(ch, id);
		return 0;
	}
	st = ev->event == RDMA_CM_EVENT_REJECTED ? ev->status : -1;
	if (!quiet)
		printf("client %s status %d\n", rdma_event_str(ev->event), ev->status);
	rdma_ack_cm_event(ev);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	return st;
}

/* The first connection stays up while the others are tried, so the server is still
 * there for them; it goes last. */
static int ip_client(int port, int naddr, char **addrs)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct timespec ms200 = {0, 200000000};
	struct rdma_cm_id *first = NULL;
	int i, tries;

	if (!ch)
		die("rdma_create_event_channel");
	/* the first: until the server's rdma_listen is there (REJECTED 8 before it) */
	for (tries = 0; ip_connect(ch, addrs[0], port, tries < 50, &first) != 0; tries++) {
		if (tries >= 50)
			return 1;
		nanosleep(&ms200, NULL);
	}
	for (i = 1; i < naddr; i++)
		ip_connect(ch, addrs[i], port, 0, NULL);
	ip_disconnect(ch, first);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 2 && !strcmp(argv[1], "options"))
		return options();
	if (argc == 4 && !strcmp(argv[1], "resolve"))
		return resolve(argv[2], atoi(argv[3]));
	if (argc == 3 && !strcmp(argv[1], "flush-server"))
		return flush_server(atoi(argv[2]));
	if (argc == 4 && !strcmp(argv[1], "flush-client"))
		return flush_client(argv[2], atoi(argv[3]));
	if (argc == 3 && !strcmp(argv[1], "exit-server"))
		return exit_server(atoi(argv[2]));
	if (argc == 4 && !strcmp(argv[1], "exit-client"))
		return exit_client(argv[2], atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "access-server"))
		return access_server(atoi(argv[2]), atoi(argv[3]));
	if (argc == 5 && !strcmp(argv[1], "access-client"))
		return access_client(argv[2], atoi(argv[3]), atoi(argv[4]));
	if (argc == 3 && !strcmp(argv[1], "addrinfo"))
		return addrinfo(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "migrate"))
		return migrate(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "ip-binds"))
		return ip_binds(argv[2]);
	if (argc == 6 && !strcmp(argv[1], "ip-server"))
		return ip_server(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
	if (argc >= 4 && !strcmp(argv[1], "ip-client"))
		return ip_client(atoi(argv[2]), argc - 3, argv + 3);
	if (argc == 4 && !strcmp(argv[1], "rnr-server"))
		return rnr_server(atoi(argv[2]), atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "rnr-client"))
		return rnr_client(argv[2], atoi(argv[3]));
	fprintf(stderr, "usage: cmcheck options | resolve ADDR MS | flush-server PORT | "
		"flush-client ADDR PORT | exit-server PORT | exit-client ADDR PORT | "
		"access-server PORT RR | access-client ADDR PORT DEPTH | addrinfo ADDR | "
		"migrate ADDR | ip-binds V4ADDR | ip-server ADDR PORT AFONLY N | "
		"ip-client PORT ADDR... | rnr-server PORT DELAY_MS | rnr-client ADDR PORT\n");
	return 2;
}
