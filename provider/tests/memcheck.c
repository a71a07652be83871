/* memcheck: what a peer's verbs do to a program's malloc'ed memory, byte by byte, and
 * the registrations softhca must refuse.
 *
 *   memcheck transfer   two processes (fork), each with its own device context, QP and
 *                       malloc'ed buffers at unaligned addresses: A RDMA_WRITEs into B's
 *                       buffer, SENDs into B's receive buffer, RDMA_READs from B's
 *                       buffer; each side checks every byte, and that the bytes around
 *                       the targets are untouched.
 *   memcheck refuse     ibv_reg_mr of a stack buffer and of read-only memory must fail
 *                       with EINVAL, of an unmapped range with EFAULT.
 *   memcheck forged     a post whose SGE leaves its registration, and an RDMA WRITE
 *                       whose remote range leaves the peer's, must not move a byte.
 *   memcheck events     a CQ that overruns gives its context IBV_EVENT_CQ_ERR naming it
 *                       (ibv_get_async_event), and its QP's WRs stop.
 *   memcheck hold       registers 64 MiB and posts, prints "ready", then waits to be
 *                       killed (the daemon must clean up after it).
 *   memcheck windows    ibv_rereg_mr of access, an RDMA atomic write, ibv_resize_cq,
 *                       a type 1 window bound
 *                       with ibv_bind_mw and a type 2 one with IBV_WR_BIND_MW, written
 *                       through by the peer, the type 2 invalidated and refused after.
 *   memcheck builders   the same through ibv_qp_ex: ibv_wr_atomic_write, ibv_wr_bind_mw,
 *                       ibv_wr_local_inv.
 *
 * Expected values are computed here from the patterns, never read back from softhca.
 * Exit 0 when every check holds; each check prints one line. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEN 10000          /* not a multiple of anything */
#define HALO 512           /* bytes around each target that must stay as they were */
#define BUF (LEN + 2 * HALO)
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
		IBV_ACCESS_REMOTE_ATOMIC)

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint8_t *buf, *rbuf;       /* malloc'ed, deliberately unaligned */
	struct ibv_mr *mr, *rmr;
	union ibv_gid gid;
};

struct peer_info {
	uint32_t qpn;
	uint32_t rkey;
	uint64_t addr;
	union ibv_gid gid;
};

static int failures;

#define CHECK(cond, ...) do { \
	if (cond) { printf("memcheck: ok: " __VA_ARGS__); printf("\n"); } \
	else { printf("memcheck: FAIL: " __VA_ARGS__); printf("\n"); failures++; } \
} while (0)

static uint8_t pat(int which, size_t i)
{
	return (uint8_t)(i * (2 * which + 5) + 17 * which + (i >> 8));
}

static void die(const char *what)
{
	printf("memcheck: FAIL: %s: %s\n", what, strerror(errno));
	exit(2);
}

static void open_side(struct side *s)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_qp_init_attr qa = {0};

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
	qa.send_cq = qa.recv_cq = s->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 16;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	s->qp = ibv_create_qp(s->pd, &qa);
	if (!s->qp)
		die("ibv_create_qp");
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid");
}

static void connect_qp(struct side *s, const struct peer_info *p)
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

static struct ibv_wc wait_wc(struct side *s)
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

static void xfer(int fd, void *p, size_t n, int out)
{
	ssize_t r = out ? write(fd, p, n) : read(fd, p, n);

	if (r != (ssize_t)n)
		die("pipe");
}

/* A malloc'ed buffer whose start is not page aligned, filled with a pattern. */
static uint8_t *unaligned(size_t n, int which)
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

static int post(struct side *s, enum ibv_wr_opcode op, void *local, uint32_t len,
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

static int write_through(struct side *a, uint8_t *src, uint32_t len, struct ibv_mr *smr,
			 uint8_t *dst, uint32_t rkey)
{
	if (post(a, IBV_WR_RDMA_WRITE, src, len, smr->lkey, (uintptr_t)dst, rkey))
		die("post");
	return wait_wc(a).status;
}

static size_t differ(const uint8_t *p, size_t n, int which, size_t from)
{
	size_t i, bad = 0;

	for (i = 0; i < n; i++)
		bad += p[i] != pat(which, from + i);
	return bad;
}

static int windows(void)
{
	struct side a = {0}, b = {0};
	struct peer_info ia, ib;
	uint8_t *src = unaligned(4096, 8), *dst = unaligned(4096, 9), *w = unaligned(4096, 10);
	struct ibv_mr *smr, *dmr, *wmr;
	struct ibv_mw *mw1, *mw2;
	struct ibv_mw_bind bind = {0};
	struct ibv_send_wr wr = {0}, *bad;
	struct ibv_wc wc;
	uint32_t old, key;
	size_t off;

	open_side(&a);
	open_side(&b);
	smr = ibv_reg_mr(a.pd, src, 4096, ACCESS);
	dmr = ibv_reg_mr(b.pd, dst, 4096, IBV_ACCESS_LOCAL_WRITE);
	wmr = ibv_reg_mr(b.pd, w, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!smr || !dmr || !wmr)
		die("ibv_reg_mr");
	ia = (struct peer_info){a.qp->qp_num, smr->rkey, (uintptr_t)src, a.gid};
	ib = (struct peer_info){b.qp->qp_num, dmr->rkey, (uintptr_t)dst, b.gid};
	connect_qp(&a, &ib);
	connect_qp(&b, &ia);
	CHECK(ibv_rereg_mr(dmr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, ACCESS) == 0,
	      "ibv_rereg_mr gives an MR remote write");
	CHECK(write_through(&a, src, 256, smr, dst, dmr->rkey) == IBV_WC_SUCCESS &&
	      differ(dst, 256, 8, 0) == 0, "the peer's WRITE then lands");
	/* RDMA atomic write: one 8-byte SGE stored at an 8-byte aligned address (dst is
	 * deliberately unaligned: the first aligned byte from 512 on) */
	off = 512 + (8 - ((uintptr_t)dst + 512) % 8) % 8;
	CHECK(post(&a, IBV_WR_ATOMIC_WRITE, src + 16, 8, smr->lkey, (uintptr_t)dst + off + 1,
		   dmr->rkey) == EINVAL, "IBV_WR_ATOMIC_WRITE to an unaligned address is EINVAL");
	CHECK(post(&a, IBV_WR_ATOMIC_WRITE, src + 16, 8, smr->lkey, (uintptr_t)dst + off,
		   dmr->rkey) == 0 && wait_wc(&a).status == IBV_WC_SUCCESS &&
	      differ(dst + off, 8, 8, 16) == 0 && differ(dst + off + 8, 8, 9, off + 8) == 0 &&
	      differ(dst + 256, off - 256, 9, 256) == 0,
	      "IBV_WR_ATOMIC_WRITE stores the 8 bytes and nothing else");
	CHECK(ibv_resize_cq(a.cq, 128) == 0 && a.cq->cqe == 128, "ibv_resize_cq to 128");
	CHECK(ibv_resize_cq(a.cq, 0) == EINVAL, "ibv_resize_cq to 0 is EINVAL");
	mw1 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_1);
	mw2 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
	if (!mw1 || !mw2)
		die("ibv_alloc_mw");
	old = mw1->rkey;
	bind.wr_id = 11;
	bind.send_flags = IBV_SEND_SIGNALED;
	bind.bind_info = (struct ibv_mw_bind_info){wmr, (uintptr_t)w + 100, 200,
						   IBV_ACCESS_REMOTE_WRITE};
	CHECK(ibv_bind_mw(b.qp, mw1, &bind) == 0 && mw1->rkey == ibv_inc_rkey(old),
	      "ibv_bind_mw of a type 1 window gives it ibv_inc_rkey of its rkey");
	wc = wait_wc(&b);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW, "the bind completes");
	CHECK(write_through(&a, src, 200, smr, w + 100, mw1->rkey) == IBV_WC_SUCCESS &&
	      differ(w + 100, 200, 8, 0) == 0 && differ(w, 100, 10, 0) == 0,
	      "the peer writes through the type 1 window, nothing around it");
	key = (mw2->rkey & ~0xFFu) | 0x42;
	wr.wr_id = 12;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = mw2;
	wr.bind_mw.rkey = key;
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){wmr, (uintptr_t)w + 1024, 64,
							 IBV_ACCESS_REMOTE_WRITE};
	CHECK(ibv_post_send(b.qp, &wr, &bad) == 0 && wait_wc(&b).status == IBV_WC_SUCCESS,
	      "IBV_WR_BIND_MW binds a type 2 window");
	CHECK(write_through(&a, src + 8, 64, smr, w + 1024, key) == IBV_WC_SUCCESS &&
	      differ(w + 1024, 64, 8, 8) == 0, "the peer writes through the type 2 window");
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.invalidate_rkey = key;
	CHECK(ibv_post_send(b.qp, &wr, &bad) == 0 && wait_wc(&b).status == IBV_WC_SUCCESS,
	      "IBV_WR_LOCAL_INV invalidates it");
	memset(w + 1024, 0xEE, 64);
	wc.status = write_through(&a, src, 64, smr, w + 1024, key);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "a WRITE through it after completes with %s",
	      ibv_wc_status_str(wc.status));
	CHECK(w[1024] == 0xEE && w[1087] == 0xEE, "and moves no byte");
	CHECK(ibv_dealloc_mw(mw1) == 0 && ibv_dealloc_mw(mw2) == 0, "ibv_dealloc_mw");
	return failures ? 1 : 0;
}

/* open_side with an extended QP (ibv_create_qp_ex with the builders asked for). */
static void open_side_ex(struct side *s)
{
	struct ibv_qp_init_attr_ex qa = {0};

	open_side(s);
	ibv_destroy_qp(s->qp);
	qa.send_cq = qa.recv_cq = s->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 16;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.pd = s->pd;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_ATOMIC_WRITE |
			    IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
	s->qp = ibv_create_qp_ex(s->ctx, &qa);
	if (!s->qp)
		die("ibv_create_qp_ex");
}

static int builders(void)
{
	struct side c = {0}, d = {0};
	struct peer_info ic, id;
	uint8_t *src = unaligned(4096, 11), *dst;
	const uint8_t value[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	struct ibv_mr *smr, *dmr;
	struct ibv_qp_ex *cx, *dx;
	struct ibv_mw *mw;
	struct ibv_mw_bind_info info;
	struct ibv_wc wc;
	uint32_t key;

	open_side_ex(&c);
	open_side_ex(&d);
	if (posix_memalign((void **)&dst, 4096, 4096))
		die("posix_memalign");
	memset(dst, 0xAB, 4096);
	smr = ibv_reg_mr(c.pd, src, 4096, ACCESS);
	dmr = ibv_reg_mr(d.pd, dst, 4096, ACCESS | IBV_ACCESS_MW_BIND);
	mw = ibv_alloc_mw(d.pd, IBV_MW_TYPE_2);
	if (!smr || !dmr || !mw)
		die("ibv_reg_mr / ibv_alloc_mw");
	ic = (struct peer_info){c.qp->qp_num, smr->rkey, (uintptr_t)src, c.gid};
	id = (struct peer_info){d.qp->qp_num, dmr->rkey, (uintptr_t)dst, d.gid};
	connect_qp(&c, &id);
	connect_qp(&d, &ic);
	cx = ibv_qp_to_qp_ex(c.qp);
	dx = ibv_qp_to_qp_ex(d.qp);
	ibv_wr_start(cx);
	cx->wr_id = 21;
	cx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(cx, dmr->rkey, (uintptr_t)dst + 8, value);
	CHECK(ibv_wr_complete(cx) == 0 && wait_wc(&c).status == IBV_WC_SUCCESS &&
	      !memcmp(dst + 8, value, 8) && dst[7] == 0xAB && dst[16] == 0xAB,
	      "ibv_wr_atomic_write stores its 8 bytes");
	key = (mw->rkey & ~0xFFu) | 0x99;
	info = (struct ibv_mw_bind_info){dmr, (uintptr_t)dst + 2048, 128,
					 IBV_ACCESS_REMOTE_WRITE};
	ibv_wr_start(dx);
	dx->wr_id = 22;
	dx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(dx, mw, key, &info);
	wc.status = IBV_WC_GENERAL_ERR;
	CHECK(ibv_wr_complete(dx) == 0 && (wc = wait_wc(&d)).status == IBV_WC_SUCCESS &&
	      wc.opcode == IBV_WC_BIND_MW, "ibv_wr_bind_mw binds a type 2 window");
	CHECK(write_through(&c, src, 128, smr, dst + 2048, key) == IBV_WC_SUCCESS &&
	      differ(dst + 2048, 128, 11, 0) == 0, "the peer writes through it");
	ibv_wr_start(dx);
	dx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(dx, key);
	CHECK(ibv_wr_complete(dx) == 0 && wait_wc(&d).status == IBV_WC_SUCCESS,
	      "ibv_wr_local_inv invalidates it");
	CHECK(write_through(&c, src, 128, smr, dst + 2048, key) == IBV_WC_REM_ACCESS_ERR,
	      "a WRITE through it after is a remote access error");
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
	if (!strcmp(mode, "windows"))
		return windows();
	if (!strcmp(mode, "builders"))
		return builders();
	fprintf(stderr, "usage: memcheck transfer|refuse|forged|events|hold|windows|builders\n");
	return 2;
}
