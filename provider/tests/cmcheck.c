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
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
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
	fprintf(stderr, "usage: cmcheck options | resolve ADDR MS | flush-server PORT | "
		"flush-client ADDR PORT | exit-server PORT | exit-client ADDR PORT\n");
	return 2;
}
