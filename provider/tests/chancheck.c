/* A verbs program of ours for completion channels (tests/native/test_channels.py), as
 * middleware uses them: the channel's fd made non-blocking and polled before any CQ is
 * bound to it (UCX, libiscsi), then two CQs on it, their events read with
 * ibv_get_cq_event and acknowledged, and the destroy order a kernel channel enforces
 * (EBUSY while a CQ is bound). One RC QP connected to itself carries the SENDs. */
#define PROG "chancheck"
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "side.h"

static int fd_valid(int fd)
{
	return fcntl(fd, F_GETFL) != -1;
}

/* A thread that polls a channel's fd until told to stop, counting the answers that
 * are not "nothing yet" (the channel has no armed CQ, so POLLIN is wrong too). */
struct watch {
	int fd, stop;
	long polls, bad;
	short last_bad;
};

static void *watch_main(void *arg)
{
	struct watch *w = arg;

	while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
		struct pollfd p = {.fd = w->fd, .events = POLLIN};
		int n = poll(&p, 1, 1);

		w->polls++;
		if (n != 0 || p.revents) {
			w->bad++;
			w->last_bad = p.revents;
		}
	}
	return NULL;
}

/* One SEND of the QP to itself, its receive posted first. */
static void send_one(struct side *s, uint8_t *buf, struct ibv_mr *mr)
{
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *rbad;

	if (ibv_post_recv(s->qp, &rwr, &rbad))
		die("ibv_post_recv");
	if (post(s, IBV_WR_SEND, buf + 64, 64, mr->lkey, 0, 0))
		die("ibv_post_send");
}

/* Waits (poll(2), 10 s at most) for the channel's next event and reads it. */
static struct ibv_cq *next_event(struct ibv_comp_channel *ch, void **cq_ctx)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	struct ibv_cq *cq = NULL;
	int n = poll(&p, 1, 10000);

	if (n != 1 || !(p.revents & POLLIN))
		return NULL;
	if (ibv_get_cq_event(ch, &cq, cq_ctx))
		return NULL;
	return cq;
}

static int drain(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n, got = 0;

	while ((n = ibv_poll_cq(cq, 1, &wc)) > 0) {
		if (wc.status != IBV_WC_SUCCESS)
			printf(PROG ": FAIL: completion status %s\n", ibv_wc_status_str(wc.status));
		got += n;
	}
	return got;
}

int main(void)
{
	struct side s = {0};
	struct ibv_qp_init_attr qa = {0};
	struct peer_info self;
	struct ibv_comp_channel *ch, *ch2;
	struct ibv_cq *scq, *rcq, *ev1, *ev2, *cq;
	struct pollfd p;
	struct stat st;
	void *c1 = NULL, *c2 = NULL, *cctx;
	int stdin_flags = fcntl(0, F_GETFL), flags, n, fd, fd2, rc, sends = 0, recvs = 0;
	uint8_t *buf = unaligned(128, 1);
	struct ibv_mr *mr;

	open_ctx(&s);

	/* Before any CQ: the fd is the channel's own, non-blocking on request, pollable. */
	ch = ibv_create_comp_channel(s.ctx);
	if (!ch)
		die("ibv_create_comp_channel");
	fd = ch->fd;
	CHECK(fd > 2 && fd_valid(fd) && fstat(fd, &st) == 0,
	      "ibv_create_comp_channel gives an open fd of its own (fd %d)", fd);
	if (!(fd > 2 && fd_valid(fd))) {
		printf(PROG ": FAIL: stopping: the channel's fd is not a channel\n");
		return 1;
	}
	flags = fcntl(fd, F_GETFL);
	CHECK(flags != -1 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0 &&
	      (fcntl(fd, F_GETFL) & O_NONBLOCK),
	      "fcntl(F_SETFL, O_NONBLOCK) on it before any CQ is bound");
	p = (struct pollfd){.fd = fd, .events = POLLIN};
	n = poll(&p, 1, 0);
	CHECK(n == 0 && p.revents == 0, "poll(POLLIN, timeout 0) before any CQ: 0 (got %d, "
	      "revents 0x%x)", n, p.revents);
	errno = 0;
	n = (int)read(fd, buf, 8);
	CHECK(n == -1 && errno == EAGAIN, "read of the empty non-blocking channel: EAGAIN "
	      "(%s)", strerror(errno));
	errno = 0;
	cq = NULL;
	rc = ibv_get_cq_event(ch, &cq, &cctx);
	CHECK(rc == -1 && errno == EAGAIN && !cq,
	      "ibv_get_cq_event on it with no event: -1, EAGAIN (%d, %s)", rc, strerror(errno));
	CHECK(fcntl(0, F_GETFL) == stdin_flags, "the program's stdin flags are untouched");

	/* A channel no CQ ever used is destroyed at once, its fd closed. */
	ch2 = ibv_create_comp_channel(s.ctx);
	if (!ch2)
		die("ibv_create_comp_channel (second)");
	fd2 = ch2->fd;
	CHECK(fd2 > 2 && fd2 != fd && fd_valid(fd2), "a second channel has an fd of its own "
	      "(fd %d)", fd2);
	rc = ibv_destroy_comp_channel(ch2);
	CHECK(rc == 0 && !fd_valid(fd2), "destroying it unused: 0 and its fd closed "
	      "(rc %d)", rc);

	/* The fd's lifecycle: polled from another thread (as libiscsi and UCX poll theirs
	 * from their event loops) while CQs come and go on the channel and other channels
	 * with CQs of their own are made and destroyed, it is never closed, replaced or
	 * hung up: poll answers nothing but "no event". */
	{
		struct watch w = {.fd = fd};
		pthread_t t;
		int i, same = 1;

		if (pthread_create(&t, NULL, watch_main, &w))
			die("pthread_create");
		for (i = 0; i < 200; i++) {
			struct ibv_comp_channel *other = ibv_create_comp_channel(s.ctx);
			struct ibv_cq *a = ibv_create_cq(s.ctx, 4, NULL, ch, 0);
			struct ibv_cq *b = other ? ibv_create_cq(s.ctx, 4, NULL, other, 0) : NULL;

			if (!other || !a || !b)
				die("ibv_create_comp_channel / ibv_create_cq (churn)");
			same &= ch->fd == fd;
			if (ibv_destroy_cq(b) || ibv_destroy_comp_channel(other) ||
			    ibv_destroy_cq(a))
				die("destroy (churn)");
		}
		__atomic_store_n(&w.stop, 1, __ATOMIC_RELEASE);
		pthread_join(t, NULL);
		CHECK(same && ch->fd == fd && fd_valid(fd) && w.polls > 0 && w.bad == 0,
		      "polled from a thread while 200 CQs and 200 other channels come and go: "
		      "the fd stays the channel's, no POLLHUP, POLLERR or POLLNVAL (%ld polls, "
		      "%ld bad, last revents 0x%x)", w.polls, w.bad, w.last_bad);
	}

	/* Two CQs on the one channel: the QP's send CQ and its receive CQ. */
	scq = ibv_create_cq(s.ctx, 16, &c1, ch, 0);
	rcq = ibv_create_cq(s.ctx, 16, &c2, ch, 0);
	if (!scq || !rcq)
		die("ibv_create_cq on the channel");
	CHECK(ch->fd == fd && fd_valid(fd) && (fcntl(fd, F_GETFL) & O_NONBLOCK),
	      "binding two CQs keeps the channel's fd and its O_NONBLOCK");
	n = poll(&p, 1, 0);
	CHECK(n == 0, "poll with two idle CQs bound: 0 (got %d)", n);

	qa.send_cq = scq;
	qa.recv_cq = rcq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 16;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	s.qp = ibv_create_qp(s.pd, &qa);
	if (!s.qp)
		die("ibv_create_qp");
	self.qpn = s.qp->qp_num;
	self.gid = s.gid;
	connect_qp(&s, &self);
	mr = ibv_reg_mr(s.pd, buf, 128, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("ibv_reg_mr");

	/* Armed: one SEND gives one event on each CQ. */
	if (ibv_req_notify_cq(scq, 0) || ibv_req_notify_cq(rcq, 0))
		die("ibv_req_notify_cq");
	send_one(&s, buf, mr);
	ev1 = next_event(ch, &cctx);
	CHECK(ev1 == scq || ev1 == rcq, "poll says readable and ibv_get_cq_event gives one "
	      "of the channel's CQs");
	CHECK(ev1 && cctx == (ev1 == scq ? &c1 : &c2), "with that CQ's cq_context");
	ev2 = next_event(ch, &cctx);
	CHECK(ev2 && ev2 != ev1 && (ev2 == scq || ev2 == rcq),
	      "and the next event is the other CQ's");
	CHECK(ev2 && cctx == (ev2 == scq ? &c1 : &c2), "with its cq_context");
	if (!ev1 || !ev2) {
		printf(PROG ": FAIL: stopping: no events\n");
		return 1;
	}
	ibv_ack_cq_events(ev1, 1);
	ibv_ack_cq_events(ev2, 1);
	sends += drain(scq);
	recvs += drain(rcq);
	CHECK(sends == 1 && recvs == 1, "the CQs hold the SEND's and the RECV's completions "
	      "(%d, %d)", sends, recvs);

	/* Not re-armed: completions, and no event. */
	send_one(&s, buf, mr);
	for (n = 0; (sends < 2 || recvs < 2) && n < 100000; n++) {
		sends += drain(scq);
		recvs += drain(rcq);
	}
	n = poll(&p, 1, 200);
	CHECK(sends == 2 && recvs == 2 && n == 0,
	      "a SEND with the CQs not re-armed completes and raises no event (poll %d)", n);

	/* Re-armed: events again, and two events of one CQ acknowledged at once. */
	if (ibv_req_notify_cq(rcq, 0))
		die("ibv_req_notify_cq");
	send_one(&s, buf, mr);
	ev1 = next_event(ch, &cctx);
	CHECK(ev1 == rcq, "re-arming the receive CQ: its event, only (%s)",
	      ev1 == rcq ? "rcq" : ev1 == scq ? "scq" : "none");
	recvs += drain(rcq);
	if (ibv_req_notify_cq(rcq, 0))
		die("ibv_req_notify_cq");
	send_one(&s, buf, mr);
	ev2 = next_event(ch, &cctx);
	CHECK(ev2 == rcq, "and once more");
	ibv_ack_cq_events(rcq, 2);
	errno = 0;
	rc = ibv_get_cq_event(ch, &cq, &cctx);
	CHECK(rc == -1 && errno == EAGAIN, "then the channel is empty: EAGAIN (%s)",
	      strerror(errno));

	/* Objects still in use: EBUSY, as the kernel answers (a teardown in the wrong
	 * order, as qperf's, meets it), and they stay usable. */
	rc = ibv_destroy_cq(rcq);
	CHECK(rc == EBUSY, "ibv_destroy_cq of a CQ a QP uses: EBUSY (%d)", rc);
	rc = ibv_dealloc_pd(s.pd);
	CHECK(rc == EBUSY, "ibv_dealloc_pd of a PD with an MR and a QP: EBUSY (%d)", rc);
	if (ibv_req_notify_cq(rcq, 0))
		die("ibv_req_notify_cq");
	send_one(&s, buf, mr);
	ev1 = next_event(ch, &cctx);
	CHECK(ev1 == rcq, "and the CQ still raises its events");
	if (ev1)
		ibv_ack_cq_events(ev1, 1);
	recvs += drain(rcq);
	for (n = 0; sends < 5 && n < 100000; n++)
		sends += drain(scq);

	/* The destroy order: the channel outlives its CQs, as the kernel's. */
	rc = ibv_destroy_comp_channel(ch);
	CHECK(rc == EBUSY && fd_valid(fd),
	      "ibv_destroy_comp_channel with two CQs bound: EBUSY, the fd still open (%d)", rc);
	if (ibv_destroy_qp(s.qp) || ibv_dereg_mr(mr) || ibv_destroy_cq(scq))
		die("destroy qp/mr/cq");
	rc = ibv_destroy_comp_channel(ch);
	CHECK(rc == EBUSY, "with one CQ bound: EBUSY (%d)", rc);
	if (ibv_destroy_cq(rcq))
		die("ibv_destroy_cq");
	rc = ibv_destroy_comp_channel(ch);
	CHECK(rc == 0 && !fd_valid(fd), "with none: 0 and its fd closed (%d)", rc);
	CHECK(fcntl(0, F_GETFL) == stdin_flags, "the program's stdin flags still untouched");

	ibv_destroy_cq(s.cq);
	ibv_dealloc_pd(s.pd);
	ibv_close_device(s.ctx);
	printf(PROG ": %s (%d failures)\n", failures ? "FAIL" : "done", failures);
	return failures ? 1 : 0;
}
