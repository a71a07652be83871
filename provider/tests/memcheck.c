/* memcheck: what a peer's verbs do to a program's malloc'ed memory, byte by byte, and
 * the registrations softhca must refuse.
 *
 *   memcheck transfer   two processes (fork), each with its own device context, QP and
 *                       malloc'ed buffers at unaligned addresses: A RDMA_WRITEs into B's
 *                       buffer, SENDs into B's receive buffer, RDMA_READs from B's
 *                       buffer; each side checks every byte, and that the bytes around
 *                       the targets are untouched.
 *   memcheck refuse     ibv_reg_mr of a stack buffer and of read-only memory must fail
 *                       with EINVAL, of an unmapped range with EFAULT; a receive WR
 *                       with more SGEs than its QP's or SRQ's limit, with EINVAL and
 *                       bad_wr naming it.
 *   memcheck forged     a post whose SGE leaves its registration, and an RDMA WRITE
 *                       whose remote range leaves the peer's, must not move a byte.
 *   memcheck events     a CQ that overruns gives its context IBV_EVENT_CQ_ERR naming it
 *                       (ibv_get_async_event), and its QP's WRs stop.
 *   memcheck hold       registers 64 MiB and posts, prints "ready", then waits to be
 *                       killed (the daemon must clean up after it).
 *   memcheck fatal      prints "ready", then waits in ibv_get_async_event while its
 *                       daemon is killed: IBV_EVENT_DEVICE_FATAL must come, as from a
 *                       device that died, and the verbs after it fail with EIO.
 *
 * Expected values are computed here from the patterns, never read back from softhca.
 * Exit 0 when every check holds; each check prints one line. */
#define PROG "memcheck"
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "side.h"

#define LEN 10000          /* not a multiple of anything */
#define HALO 512           /* bytes around each target that must stay as they were */
#define BUF (LEN + 2 * HALO)

static void xfer(int fd, void *p, size_t n, int out)
{
	ssize_t r = out ? write(fd, p, n) : read(fd, p, n);

	if (r != (ssize_t)n)
		die("pipe");
}

static void side_a(int rd, int wr_fd)
{
	struct side s = {0};
	struct peer_info me, peer;
	struct ibv_wc wc;
	uint8_t go;
	size_t i, bad;

	open_side(&s);
	s.buf = unaligned(BUF, 1);          /* what A writes and sends: pattern 1 */
	s.rbuf = unaligned(BUF, 9);         /* where A's READ lands: pattern 9 until then */
	s.mr = ibv_reg_mr(s.pd, s.buf, BUF, ACCESS);
	s.rmr = ibv_reg_mr(s.pd, s.rbuf, BUF, ACCESS);
	if (!s.mr || !s.rmr)
		die("A: ibv_reg_mr");
	me = (struct peer_info){s.qp->qp_num, s.mr->rkey, (uintptr_t)s.buf, s.gid};
	xfer(wr_fd, &me, sizeof(me), 1);
	xfer(rd, &peer, sizeof(peer), 0);
	connect_qp(&s, &peer);
	xfer(rd, &go, 1, 0);                /* B has posted its receive */

	if (post(&s, IBV_WR_RDMA_WRITE, s.buf + HALO, LEN, s.mr->lkey, peer.addr + HALO,
		 peer.rkey))
		die("post RDMA_WRITE");
	wc = wait_wc(&s);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE,
	      "A: RDMA_WRITE of %d bytes completed (status %d)", LEN, wc.status);
	if (post(&s, IBV_WR_SEND, s.buf, LEN, s.mr->lkey, 0, 0))
		die("post SEND");
	wc = wait_wc(&s);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND,
	      "A: SEND of %d bytes completed (status %d)", LEN, wc.status);
	/* READ B's bytes [HALO + LEN/2, ...): B wrote pattern 2 there before starting
	 * and A's WRITE covered only [HALO, HALO + LEN) of B's buffer, so the expected
	 * bytes are A's pattern for the part the WRITE covered. */
	if (post(&s, IBV_WR_RDMA_READ, s.rbuf + HALO, LEN, s.rmr->lkey, peer.addr + HALO,
		 peer.rkey))
		die("post RDMA_READ");
	wc = wait_wc(&s);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ,
	      "A: RDMA_READ of %d bytes completed (status %d)", LEN, wc.status);
	for (bad = 0, i = 0; i < LEN; i++)
		bad += s.rbuf[HALO + i] != pat(1, HALO + i);
	CHECK(bad == 0, "A: RDMA_READ put the peer's %d bytes into malloc'ed memory (%zu "
	      "differ)", LEN, bad);
	for (bad = 0, i = 0; i < HALO; i++)
		bad += s.rbuf[i] != pat(9, i) || s.rbuf[HALO + LEN + i] != pat(9, HALO + LEN + i);
	CHECK(bad == 0, "A: the %d bytes around the READ's target are untouched (%zu differ)",
	      2 * HALO, bad);
	go = 1;
	xfer(wr_fd, &go, 1, 1);
}

static void side_b(int rd, int wr_fd)
{
	struct side s = {0};
	struct peer_info me, peer;
	struct ibv_recv_wr rwr = {0}, *bad_r;
	struct ibv_sge sge;
	struct ibv_wc wc;
	uint8_t go;
	size_t i, bad;

	open_side(&s);
	s.buf = unaligned(BUF, 2);          /* A writes into it */
	s.rbuf = unaligned(BUF, 3);         /* A's SEND lands in it */
	s.mr = ibv_reg_mr(s.pd, s.buf, BUF, ACCESS);
	s.rmr = ibv_reg_mr(s.pd, s.rbuf, BUF, IBV_ACCESS_LOCAL_WRITE);
	if (!s.mr || !s.rmr)
		die("B: ibv_reg_mr");
	me = (struct peer_info){s.qp->qp_num, s.mr->rkey, (uintptr_t)s.buf, s.gid};
	xfer(rd, &peer, sizeof(peer), 0);
	xfer(wr_fd, &me, sizeof(me), 1);
	connect_qp(&s, &peer);
	sge = (struct ibv_sge){(uintptr_t)(s.rbuf + HALO), LEN, s.rmr->lkey};
	rwr.wr_id = 7;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	if (ibv_post_recv(s.qp, &rwr, &bad_r))
		die("post_recv");
	go = 1;
	xfer(wr_fd, &go, 1, 1);
	wc = wait_wc(&s);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.byte_len == LEN,
	      "B: the SEND arrived: %u bytes (status %d)", wc.byte_len, wc.status);
	xfer(rd, &go, 1, 0);                /* A is done */
	for (bad = 0, i = 0; i < LEN; i++)
		bad += s.buf[HALO + i] != pat(1, HALO + i);
	CHECK(bad == 0, "B: RDMA_WRITE put %d bytes into malloc'ed memory (%zu differ)", LEN,
	      bad);
	for (bad = 0, i = 0; i < HALO; i++)
		bad += s.buf[i] != pat(2, i) || s.buf[HALO + LEN + i] != pat(2, HALO + LEN + i);
	CHECK(bad == 0, "B: the %d bytes around the WRITE's target are untouched (%zu "
	      "differ)", 2 * HALO, bad);
	for (bad = 0, i = 0; i < LEN; i++)
		bad += s.rbuf[HALO + i] != pat(1, i);
	CHECK(bad == 0, "B: SEND put %d bytes into malloc'ed memory (%zu differ)", LEN, bad);
	for (bad = 0, i = 0; i < HALO; i++)
		bad += s.rbuf[i] != pat(3, i) || s.rbuf[HALO + LEN + i] != pat(3, HALO + LEN + i);
	CHECK(bad == 0, "B: the %d bytes around the receive buffer are untouched (%zu differ)",
	      2 * HALO, bad);
}

static int transfer(void)
{
	int a2b[2], b2a[2], status;
	pid_t pid;

	if (pipe(a2b) || pipe(b2a))
		die("pipe");
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		side_b(a2b[0], b2a[1]);
		fflush(stdout);
		_exit(failures ? 1 : 0);
	}
	side_a(b2a[0], a2b[1]);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
		failures++;
	return failures ? 1 : 0;
}

/* ibv_post_recv(3) and ibv_post_srq_recv(3): a chain whose second WR has two SGEs, on a
 * QP (in INIT, where it takes receives) and an SRQ made for one, fails EINVAL with
 * bad_wr at that WR; the first WR is posted. */
static void recv_past_max_sge(struct side *s)
{
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 4, .max_sge = 1}};
	struct ibv_qp_attr init = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	struct ibv_sge sge[2] = {{0}};
	struct ibv_recv_wr two = {.wr_id = 2, .sg_list = sge, .num_sge = 2};
	struct ibv_recv_wr one = {.wr_id = 1, .sg_list = sge, .num_sge = 1, .next = &two};
	struct ibv_recv_wr *bad = NULL;
	struct ibv_srq *srq;
	int rc;

	if (ibv_modify_qp(s->qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		die("INIT");
	rc = ibv_post_recv(s->qp, &one, &bad);
	CHECK(rc == EINVAL && bad == &two, "ibv_post_recv of 2 SGEs on a QP of max_recv_sge 1 "
	      "fails: %s, bad_wr at wr_id %d", strerror(rc), bad ? (int)bad->wr_id : -1);
	srq = ibv_create_srq(s->pd, &sa);
	if (!srq)
		die("ibv_create_srq");
	bad = NULL;
	rc = ibv_post_srq_recv(srq, &one, &bad);
	CHECK(rc == EINVAL && bad == &two, "ibv_post_srq_recv of 2 SGEs on an SRQ of max_sge 1 "
	      "fails: %s, bad_wr at wr_id %d", strerror(rc), bad ? (int)bad->wr_id : -1);
	ibv_destroy_srq(srq);
}

static int refuse(void)
{
	struct side s = {0};
	uint8_t on_stack[4096];
	struct ibv_mr *mr;
	uint8_t *ro, *gone;

	open_side(&s);
	memset(on_stack, 1, sizeof(on_stack));
	errno = 0;
	mr = ibv_reg_mr(s.pd, on_stack, sizeof(on_stack), IBV_ACCESS_LOCAL_WRITE);
	CHECK(!mr && errno == EINVAL, "ibv_reg_mr of a stack buffer fails: %s (errno %d)",
	      mr ? "registered" : strerror(errno), errno);
	CHECK(on_stack[0] == 1 && on_stack[4095] == 1, "the stack buffer is intact");

	ro = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ro == MAP_FAILED)
		die("mmap");
	errno = 0;
	mr = ibv_reg_mr(s.pd, ro, 8192, 0);
	CHECK(!mr && errno == EINVAL, "ibv_reg_mr of read-only memory fails: %s (errno %d)",
	      mr ? "registered" : strerror(errno), errno);

	gone = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (gone == MAP_FAILED || munmap(gone, 8192))
		die("mmap");
	errno = 0;
	mr = ibv_reg_mr(s.pd, gone, 8192, IBV_ACCESS_LOCAL_WRITE);
	CHECK(!mr && errno == EFAULT, "ibv_reg_mr of unmapped addresses fails: %s (errno %d)",
	      mr ? "registered" : strerror(errno), errno);
	recv_past_max_sge(&s);
	return failures ? 1 : 0;
}

static int forged(void)
{
	struct side s = {0};
	struct peer_info self;
	uint8_t *buf, *far;
	struct ibv_mr *mr;
	struct ibv_wc wc;
	size_t i, bad;
	int rc;

	open_side(&s);
	buf = unaligned(8192, 4);
	far = unaligned(8192, 5);           /* registered nowhere */
	mr = ibv_reg_mr(s.pd, buf, 4096, ACCESS);
	if (!mr)
		die("ibv_reg_mr");
	self = (struct peer_info){s.qp->qp_num, mr->rkey, (uintptr_t)buf, s.gid};
	connect_qp(&s, &self);              /* the QP is its own peer */
	/* A local SGE past the registration's end */
	rc = post(&s, IBV_WR_RDMA_WRITE, buf + 4000, 200, mr->lkey, (uintptr_t)buf, mr->rkey);
	if (!rc) {
		wc = wait_wc(&s);
		CHECK(wc.status == IBV_WC_LOC_PROT_ERR, "an SGE leaving its MR completes with "
		      "%s", ibv_wc_status_str(wc.status));
	} else {
		CHECK(rc == EINVAL, "an SGE leaving its MR is refused by ibv_post_send: %s",
		      strerror(rc));
	}
	for (bad = 0, i = 0; i < 8192; i++)
		bad += buf[i] != pat(4, i) || far[i] != pat(5, i);
	CHECK(bad == 0, "no byte moved (%zu differ)", bad);
	return failures ? 1 : 0;
}

static int forged_remote(void)
{
	struct side a = {0}, b = {0};
	struct peer_info ia, ib;
	uint8_t *src, *dst;
	struct ibv_mr *smr, *dmr;
	struct ibv_wc wc;
	size_t i, bad;
	int rc;

	open_side(&a);
	open_side(&b);
	src = unaligned(8192, 6);
	dst = unaligned(8192, 7);
	smr = ibv_reg_mr(a.pd, src, 4096, ACCESS);
	dmr = ibv_reg_mr(b.pd, dst, 4096, ACCESS);
	if (!smr || !dmr)
		die("ibv_reg_mr");
	ia = (struct peer_info){a.qp->qp_num, smr->rkey, (uintptr_t)src, a.gid};
	ib = (struct peer_info){b.qp->qp_num, dmr->rkey, (uintptr_t)dst, b.gid};
	connect_qp(&a, &ib);
	connect_qp(&b, &ia);
	/* The remote range runs past the peer's registration: the responder refuses it */
	rc = post(&a, IBV_WR_RDMA_WRITE, src, 200, smr->lkey, (uintptr_t)dst + 4000, dmr->rkey);
	CHECK(rc == 0, "the post itself is accepted (the remote range is the peer's to judge)");
	wc = wait_wc(&a);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "an RDMA WRITE past the peer's MR completes "
	      "with %s", ibv_wc_status_str(wc.status));
	for (bad = 0, i = 0; i < 8192; i++)
		bad += src[i] != pat(6, i) || dst[i] != pat(7, i);
	CHECK(bad == 0, "no byte moved (%zu differ)", bad);
	return failures ? 1 : 0;
}

static int events(void)
{
	struct side s = {0};
	struct peer_info self;
	struct ibv_async_event ev;
	struct ibv_qp_init_attr qa = {0};
	struct ibv_cq *small;
	uint8_t *buf;
	struct ibv_mr *mr;
	int i, rc;

	open_side(&s);
	/* a second QP whose send CQ holds 2 entries: its 4 signaled WRs overrun it */
	small = ibv_create_cq(s.ctx, 2, NULL, NULL, 0);
	if (!small)
		die("ibv_create_cq");
	qa.send_cq = small;
	qa.recv_cq = s.cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 16;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	ibv_destroy_qp(s.qp);
	s.qp = ibv_create_qp(s.pd, &qa);
	if (!s.qp)
		die("ibv_create_qp");
	buf = unaligned(8192, 8);
	mr = ibv_reg_mr(s.pd, buf, 8192, ACCESS);
	if (!mr)
		die("ibv_reg_mr");
	self = (struct peer_info){s.qp->qp_num, mr->rkey, (uintptr_t)buf, s.gid};
	connect_qp(&s, &self);
	for (i = 0; i < 4; i++) {
		rc = post(&s, IBV_WR_RDMA_WRITE, buf, 64, mr->lkey, (uintptr_t)buf + 4096,
			  mr->rkey);
		if (rc)
			break;
	}
	CHECK(i >= 3, "%d RDMA WRITEs posted to a QP whose send CQ holds 2", i);
	rc = ibv_get_async_event(s.ctx, &ev);
	CHECK(rc == 0 && ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == small,
	      "ibv_get_async_event: %s on the overrun CQ", rc ? strerror(errno) :
	      ibv_event_type_str(ev.event_type));
	if (!rc)
		ibv_ack_async_event(&ev);
	return failures ? 1 : 0;
}

static int hold(void)
{
	struct side s = {0};
	size_t n = 64u << 20;
	uint8_t *buf = malloc(n);
	struct ibv_mr *mr;

	open_side(&s);
	if (!buf)
		die("malloc");
	memset(buf, 0x5a, n);
	mr = ibv_reg_mr(s.pd, buf, n, ACCESS);
	if (!mr)
		die("ibv_reg_mr");
	printf("memcheck: ready pid %d\n", (int)getpid());
	fflush(stdout);
	pause();
	return 0;
}

static int fatal(void)
{
	struct side s = {0};
	struct ibv_async_event ev;
	struct ibv_send_wr wr = {0}, *bad = NULL;
	struct ibv_pd *pd;
	int rc;

	open_side(&s);
	printf("memcheck: ready pid %d\n", (int)getpid());
	fflush(stdout);
	rc = ibv_get_async_event(s.ctx, &ev);
	CHECK(rc == 0, "ibv_get_async_event returns when the daemon dies (%d)", rc);
	if (rc)
		return 1;
	CHECK(ev.event_type == IBV_EVENT_DEVICE_FATAL, "the event is %s",
	      ibv_event_type_str(ev.event_type));
	ibv_ack_async_event(&ev);
	wr.opcode = IBV_WR_SEND;
	rc = ibv_post_send(s.qp, &wr, &bad);
	CHECK(rc == EIO, "ibv_post_send after it fails with %s", strerror(rc));
	errno = 0;
	pd = ibv_alloc_pd(s.ctx);
	CHECK(!pd && errno == EIO, "ibv_alloc_pd after it fails with %s", strerror(errno));
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "transfer";

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(mode, "transfer"))
		return transfer();
	if (!strcmp(mode, "refuse"))
		return refuse();
	if (!strcmp(mode, "forged"))
		return forged() | forged_remote();
	if (!strcmp(mode, "events"))
		return events();
	if (!strcmp(mode, "hold"))
		return hold();
	if (!strcmp(mode, "fatal"))
		return fatal();
	fprintf(stderr, "usage: memcheck transfer|refuse|forged|events|hold|fatal\n");
	return 2;
}
