/* regcheck: what ibv_reg_mr's move of a range onto a memfd, and fork, do to the
 * provider's own state and to the daemon's view of a program's memory.
 *
 *   regcheck lost      one thread, a QP connected to itself: 512 signaled RDMA WRITEs
 *                      in rounds of 32, and after each round's post, while their
 *                      completions arrive, ibv_reg_mr (then ibv_dereg_mr) of a 64 MiB
 *                      range of malloc's heap that starts before the device was opened:
 *                      every completion must be polled, none lost. Also says where the
 *                      provider put the CQ (inside malloc's heap or not), and that a
 *                      registration of the CQ's own pages is refused, not moved.
 *   regcheck fork      registers memory, forks; the child's ibv_post_send, ibv_poll_cq,
 *                      ibv_post_recv and ibv_reg_mr on the parent's objects fail EIO at
 *                      once (each timed, the child killed by an alarm if one hangs), and
 *                      it closes its copy of the context; the parent's QP still
 *                      completes a WRITE after, and its next ibv_reg_mr goes over the
 *                      same connections to the daemon it had before the fork.
 *   regcheck handoff HELPER...  registers a page of a known pattern, forks, and the
 *                      child execs HELPER... with the control socket kept open (its
 *                      close-on-exec cleared) and the numbers of the parent's memfds as
 *                      arguments: "HELPER... PARENT_PID SOCKET_FD MEMFD...". The parent
 *                      stops itself (SIGSTOP) so that the child alone reads the session;
 *                      the child continues it when done. Exit status: the helper's.
 *   regcheck speed N [MAPS]  times ibv_reg_mr and ibv_dereg_mr: N buffers of each of
 *                      4 KiB, 64 KiB and 1 MiB (each its own mmap), all registered, then
 *                      all deregistered; prints the median and the mean time of a call
 *                      (microseconds). MAPS:
 *                      first make the program hold that many more mappings (one page
 *                      each, alternately writable and read-only, so none merge, below
 *                      the buffers), as a program with many libraries and arenas does.
 *                      Then counts its connections to the daemon: the control one and
 *                      one kept for the handoffs, none after ibv_close_device.
 *
 * Expected values are computed here, never read back from softhca. Exit 0 when every
 * check holds; each check prints one line. */
#define PROG "regcheck"
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "side.h"

#define TOTAL 512
#define ROUND 32
#define RANGE (64u << 20)
#define WLEN (128u << 10)       /* each WRITE's bytes: the round's completions take a
				 * while to arrive, so they arrive during the move */

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* The mapping of /proc/self/maps holding p: its name ("" when anonymous). */
static void mapping_of(const void *p, char *name, size_t n)
{
	char perms[8];

	if (mapping_of_addr(p, perms, name, n))
		snprintf(name, n, "(unmapped)");
}

/* A QP of depth ROUND connected to itself, on s->cq made deep enough for all. */
static void loop_side(struct side *s, uint8_t *buf, size_t len)
{
	struct ibv_qp_init_attr qa = {0};
	struct peer_info self;

	open_ctx(s);
	ibv_destroy_cq(s->cq);
	s->cq = ibv_create_cq(s->ctx, 2 * TOTAL, NULL, NULL, 0);
	if (!s->cq)
		die("ibv_create_cq");
	qa.send_cq = qa.recv_cq = s->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = ROUND;
	qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	s->qp = ibv_create_qp(s->pd, &qa);
	if (!s->qp)
		die("ibv_create_qp");
	s->buf = buf;
	s->mr = ibv_reg_mr(s->pd, buf, len, ACCESS);
	if (!s->mr)
		die("ibv_reg_mr");
	self = (struct peer_info){s->qp->qp_num, s->mr->rkey, (uintptr_t)buf, s->gid};
	connect_qp(s, &self);
}

/* One ibv_post_send of a chain of ROUND signaled WRITEs of WLEN bytes, buf's first
 * half to its second. */
static int post_round(struct side *s, uint8_t *buf)
{
	struct ibv_sge sge[ROUND];
	struct ibv_send_wr wr[ROUND], *bad;
	int i;

	memset(wr, 0, sizeof(wr));
	for (i = 0; i < ROUND; i++) {
		sge[i] = (struct ibv_sge){(uintptr_t)buf, WLEN, s->mr->lkey};
		wr[i].wr_id = (uint64_t)i;
		wr[i].opcode = IBV_WR_RDMA_WRITE;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = 1;
		wr[i].send_flags = IBV_SEND_SIGNALED;
		wr[i].wr.rdma.remote_addr = (uintptr_t)buf + WLEN;
		wr[i].wr.rdma.rkey = s->mr->rkey;
		wr[i].next = i + 1 < ROUND ? &wr[i + 1] : NULL;
	}
	return ibv_post_send(s->qp, wr, &bad);
}

static int lost(void)
{
	struct side s = {0};
	struct ibv_wc wc[64];
	uint8_t *marker, *buf, *big;
	uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE), lo, hi;
	char where[256], heap[256];
	int posted = 0, polled = 0, errors = 0, regs = 0, refused = 0, i, n;
	double last;

	/* malloc serves everything below from the brk heap, in allocation order: the
	 * marker first, then whatever ibv_open_device and the verbs allocate, then big. */
	mallopt(M_MMAP_THRESHOLD, 256 << 20);
	mallopt(M_TOP_PAD, 0);
	marker = malloc(64);
	buf = malloc(2 * WLEN);
	if (!marker || !buf)
		die("malloc");
	memset(buf, 7, 2 * WLEN);
	loop_side(&s, buf, 2 * WLEN);
	big = malloc(RANGE);
	if (!big)
		die("malloc");
	memset(big, 1, RANGE);
	mapping_of(marker, heap, sizeof(heap));
	mapping_of(s.cq, where, sizeof(where));
	lo = (uintptr_t)marker & ~(ps - 1);
	hi = ((uintptr_t)big + RANGE) & ~(ps - 1);
	printf(PROG ": the CQ object is at %p in mapping '%s'; malloc's heap is '%s'; the "
	       "range registered is [%#lx, %#lx), %lu MiB\n", (void *)s.cq, where, heap,
	       (unsigned long)lo, (unsigned long)hi, (unsigned long)((hi - lo) >> 20));
	CHECK(!((uintptr_t)s.cq >= lo && (uintptr_t)s.cq < hi),
	      "the provider's CQ object is not inside the range of malloc's heap a program "
	      "registers");
	last = now();
	while (polled < TOTAL && now() - last < 5) {
		if (posted < TOTAL && posted - polled <= 0) {
			if (post_round(&s, buf))
				die("ibv_post_send");
			posted += ROUND;
			/* the completions are on their way while the range moves */
			struct ibv_mr *mr = ibv_reg_mr(s.pd, (void *)lo, hi - lo,
						       IBV_ACCESS_LOCAL_WRITE);
			if (mr) {
				regs++;
				if (ibv_dereg_mr(mr))
					die("ibv_dereg_mr");
			} else {
				refused++;
			}
		}
		n = ibv_poll_cq(s.cq, 64, wc);
		if (n < 0)
			die("ibv_poll_cq");
		for (i = 0; i < n; i++)
			errors += wc[i].status != IBV_WC_SUCCESS;
		if (n)
			last = now();
		polled += n;
	}
	CHECK(regs == TOTAL / ROUND, "ibv_reg_mr of the %lu MiB range succeeded %d times "
	      "of %d (%d refused)", (unsigned long)((hi - lo) >> 20), regs, TOTAL / ROUND,
	      refused);
	CHECK(polled == TOTAL && errors == 0, "%d completions polled of %d posted (%d lost, "
	      "%d in error)", polled, posted, posted - polled, errors);
	/* The CQ's own pages: the provider's, not the program's to move. */
	{
		uintptr_t cp = (uintptr_t)s.cq & ~(ps - 1);
		struct ibv_mr *mr;

		errno = 0;
		mr = ibv_reg_mr(s.pd, (void *)cp, ps, IBV_ACCESS_LOCAL_WRITE);
		if (mr) {
			ibv_dereg_mr(mr);
			CHECK(strcmp(where, "[heap]") != 0, "ibv_reg_mr of the CQ's own page "
			      "(%s) succeeded", where);
		} else {
			CHECK(errno == EINVAL, "ibv_reg_mr of the CQ's own page is refused: %s",
			      strerror(errno));
		}
	}
	/* and the QP still works */
	if (post(&s, IBV_WR_RDMA_WRITE, buf, 64, s.mr->lkey, (uintptr_t)buf + 4096, s.mr->rkey))
		die("ibv_post_send");
	n = 0;
	last = now();
	while (n == 0 && now() - last < 5)
		n = ibv_poll_cq(s.cq, 1, wc);
	CHECK(n == 1 && wc[0].status == IBV_WC_SUCCESS, "a WRITE after completes");
	return failures ? 1 : 0;
}

/* The inode numbers of this process's connections to the daemon's socket at path, in
 * the order of their fds: at most max; how many there are. */
static int daemon_sockets(const char *path, unsigned long *inos, int max)
{
	struct sockaddr_un sa;
	struct stat st;
	socklen_t len;
	int fd, n = 0;

	for (fd = 0; fd < 1024; fd++) {
		len = sizeof(sa);
		memset(&sa, 0, sizeof(sa));
		if (getpeername(fd, (struct sockaddr *)&sa, &len) || sa.sun_family != AF_UNIX ||
		    strcmp(sa.sun_path, path) || fstat(fd, &st))
			continue;
		if (n < max)
			inos[n] = (unsigned long)st.st_ino;
		n++;
	}
	return n;
}

static int same_sockets(const unsigned long *a, int na, const unsigned long *b, int nb)
{
	return na == nb && !memcmp(a, b, sizeof(*a) * (size_t)(na < 8 ? na : 8));
}

/* fork: the child's calls on the parent's objects. */
static void timed(const char *what, int rc, int want, double t0)
{
	double dt = now() - t0;

	CHECK(rc == want && dt < 1.0, "child: %s returns %d (%s) in %.3f s", what, rc,
	      rc > 0 ? strerror(rc) : rc < 0 ? strerror(-rc) : "0", dt);
}

static int forked(void)
{
	struct side s = {0};
	struct peer_info self;
	uint8_t *buf = malloc(8192), *more = malloc(8192);
	const char *path = getenv("SOFTHCA_SOCKET");
	unsigned long before[8], after[8];
	int nbefore, nafter;
	struct ibv_mr *again;
	struct ibv_wc wc;
	int status, rc;
	pid_t pid;
	double t0;

	if (!buf || !more)
		die("malloc");
	memset(buf, 3, 8192);
	open_side(&s);
	s.buf = buf;
	s.mr = ibv_reg_mr(s.pd, buf, 8192, ACCESS);
	if (!s.mr)
		die("ibv_reg_mr");
	self = (struct peer_info){s.qp->qp_num, s.mr->rkey, (uintptr_t)buf, s.gid};
	connect_qp(&s, &self);
	/* the control connection and the kept memfd one */
	nbefore = daemon_sockets(path ? path : "", before, 8);
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		struct ibv_recv_wr rwr = {0}, *rbad;
		struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 64, .lkey = s.mr->lkey};
		struct ibv_mr *mr;

		alarm(10);      /* a call that hangs ends the child: the parent says so */
		t0 = now();
		rc = post(&s, IBV_WR_RDMA_WRITE, buf, 64, s.mr->lkey, (uintptr_t)buf + 4096,
			  s.mr->rkey);
		timed("ibv_post_send", rc, EIO, t0);
		t0 = now();
		rc = ibv_poll_cq(s.cq, 1, &wc);
		timed("ibv_poll_cq", rc < 0 ? -EIO : rc, -EIO, t0);
		rwr.sg_list = &sge;
		rwr.num_sge = 1;
		t0 = now();
		rc = ibv_post_recv(s.qp, &rwr, &rbad);
		timed("ibv_post_recv", rc, EIO, t0);
		t0 = now();
		errno = 0;
		mr = ibv_reg_mr(s.pd, more, 8192, IBV_ACCESS_LOCAL_WRITE);
		timed("ibv_reg_mr", mr ? 0 : errno, EIO, t0);
		/* its copies of the parent's connections are closed, not shut down */
		t0 = now();
		rc = ibv_close_device(s.ctx);
		timed("ibv_close_device", rc, 0, t0);
		fflush(stdout);
		_exit(failures ? 1 : 0);
	}
	if (waitpid(pid, &status, 0) != pid)
		die("waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's calls all failed "
	      "promptly (%s %d)", WIFSIGNALED(status) ? "killed by signal" : "exit status",
	      WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
	rc = post(&s, IBV_WR_RDMA_WRITE, buf, 64, s.mr->lkey, (uintptr_t)buf + 4096, s.mr->rkey);
	if (rc) {
		CHECK(0, "parent: ibv_post_send after the child: %s", strerror(rc));
	} else {
		t0 = now();
		rc = 0;
		while (rc == 0 && now() - t0 < 5)
			rc = ibv_poll_cq(s.cq, 1, &wc);
		CHECK(rc == 1 && wc.status == IBV_WC_SUCCESS, "parent: its QP still completes a "
		      "WRITE after the child's calls");
	}
	again = ibv_reg_mr(s.pd, more, 8192, IBV_ACCESS_LOCAL_WRITE);
	nafter = daemon_sockets(path ? path : "", after, 8);
	CHECK(again && nbefore == 2 && same_sockets(before, nbefore, after, nafter),
	      "parent: ibv_reg_mr after the child closed its copy of the context succeeds on "
	      "the same %d connections to the daemon (%d after)", nbefore, nafter);
	if (again)
		ibv_dereg_mr(again);
	return failures ? 1 : 0;
}

/* handoff: the child execs the helper with the parent's control socket and memfds'
 * numbers. */
static int is_daemon_socket(int fd, const char *path)
{
	struct sockaddr_un sa;
	socklen_t len = sizeof(sa);

	memset(&sa, 0, sizeof(sa));
	return getpeername(fd, (struct sockaddr *)&sa, &len) == 0 && sa.sun_family == AF_UNIX &&
	       !strcmp(sa.sun_path, path);
}

static int handoff(int argc, char **argv)
{
	struct side s = {0};
	const char *path = getenv("SOFTHCA_SOCKET");
	char *args[64], numbers[40][16], link[PATH_MAX], fdpath[64];
	uint8_t *buf;
	int nargs = 0, nnum = 0, sockfd = -1, fd, status;
	pid_t parent = getpid(), pid;
	size_t i;

	if (!path || argc < 3) {
		fprintf(stderr, "usage: SOFTHCA_SOCKET=... regcheck handoff HELPER...\n");
		return 2;
	}
	open_ctx(&s);
	buf = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		die("mmap");
	for (i = 0; i < 4096; i++)
		buf[i] = pat(6, i);
	s.mr = ibv_reg_mr(s.pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (!s.mr)
		die("ibv_reg_mr");
	for (i = 2; i < (size_t)argc && nargs < 40; i++)
		args[nargs++] = argv[i];
	/* numbers: the parent's pid, the socket's number, then the memfds' */
	snprintf(numbers[0], sizeof(numbers[0]), "%d", (int)parent);
	nnum = 2;
	for (fd = 0; fd < 1024; fd++) {
		ssize_t n;

		if (sockfd < 0 && is_daemon_socket(fd, path)) {
			sockfd = fd;
			continue;
		}
		snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", fd);
		n = readlink(fdpath, link, sizeof(link) - 1);
		if (n > 0 && nnum < 38) {
			link[n] = 0;
			if (!strncmp(link, "/memfd:softhca-mr", 17))
				snprintf(numbers[nnum++], sizeof(numbers[0]), "%d", fd);
		}
	}
	if (sockfd < 0)
		die("no connection to the daemon among the fds");
	snprintf(numbers[1], sizeof(numbers[0]), "%d", sockfd);
	for (i = 0; i < (size_t)nnum; i++)
		args[nargs++] = numbers[i];
	args[nargs] = NULL;
	printf(PROG ": parent %d registered a page of pattern 6 (lkey %#x); %d memfd(s) of "
	       "it; the control socket is fd %d\n", (int)parent, s.mr->lkey, nnum - 2, sockfd);
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		int fl = fcntl(sockfd, F_GETFD);

		fcntl(sockfd, F_SETFD, fl & ~FD_CLOEXEC);
		execvp(args[0], args);
		_exit(127);
	}
	/* The child reads the session's replies: this process, its reader thread with
	 * it, waits stopped until the child continues it. */
	kill(getpid(), SIGSTOP);
	if (waitpid(pid, &status, 0) != pid)
		die("waitpid");
	for (i = 0; i < 4096 && buf[i] == pat(6, i); i++)
		;
	CHECK(i == 4096, "the parent's page is intact");
	return WIFEXITED(status) ? WEXITSTATUS(status) | (failures ? 1 : 0) : 3;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The median and the mean of n times, in microseconds ("MEDIAN us (mean MEAN)"); t is
 * sorted. */
static void said_times(char *out, size_t size, double *t, int n)
{
	double sum = 0;
	int i;

	for (i = 0; i < n; i++)
		sum += t[i];
	qsort(t, (size_t)n, sizeof(*t), by_value);
	snprintf(out, size, "%.0f us (mean %.0f)", t[n / 2] * 1e6, sum / n * 1e6);
}

/* speed: the cost of ibv_reg_mr and ibv_dereg_mr by size, each call timed. */
static int speed(int argc, char **argv)
{
	static const size_t sizes[] = {4096, 64u << 10, 1u << 20};
	struct side s = {0};
	const char *path = getenv("SOFTHCA_SOCKET");
	int n = argc > 2 ? atoi(argv[2]) : 100;
	long maps = argc > 3 ? atol(argv[3]) : 0;
	char reg[64], dereg[64];
	double *treg, *tdereg;
	struct ibv_mr **mrs;
	uint8_t **bufs;
	size_t k;
	long i;
	int j;

	if (n <= 0)
		return 2;
	for (i = 0; i < maps; i++) {
		int prot = i % 2 ? PROT_READ : PROT_READ | PROT_WRITE;

		/* low, below the buffers: /proc/self/maps lists them before */
		if (mmap((void *)(0x100000000ul + (uintptr_t)i * 4096), 4096, prot,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) == MAP_FAILED)
			die("mmap of the extra mappings");
	}
	open_ctx(&s);
	mrs = calloc((size_t)n, sizeof(*mrs));
	bufs = calloc((size_t)n, sizeof(*bufs));
	treg = calloc((size_t)n, sizeof(*treg));
	tdereg = calloc((size_t)n, sizeof(*tdereg));
	if (!mrs || !bufs || !treg || !tdereg)
		die("calloc");
	for (k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		double t0;
		int ok = 0;

		for (j = 0; j < n; j++) {
			bufs[j] = mmap(NULL, sizes[k], PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (bufs[j] == MAP_FAILED)
				die("mmap");
			memset(bufs[j], j, sizes[k]);
		}
		for (j = 0; j < n; j++) {
			t0 = now();
			mrs[j] = ibv_reg_mr(s.pd, bufs[j], sizes[k], IBV_ACCESS_LOCAL_WRITE);
			treg[j] = now() - t0;
			ok += !!mrs[j];
		}
		for (j = 0; j < n; j++) {
			t0 = now();
			if (mrs[j] && ibv_dereg_mr(mrs[j]))
				ok--;
			tdereg[j] = now() - t0;
		}
		for (j = 0; j < n; j++)
			munmap(bufs[j], sizes[k]);
		said_times(reg, sizeof(reg), treg, n);
		said_times(dereg, sizeof(dereg), tdereg, n);
		CHECK(ok == n, "%zu KiB x %d (%ld extra mappings): ibv_reg_mr %s, ibv_dereg_mr %s",
		      sizes[k] >> 10, n, maps, reg, dereg);
	}
	if (path) {
		unsigned long inos[8];

		j = daemon_sockets(path, inos, 8);
		CHECK(j == 2, "after %d registrations the process has %d connections to the "
		      "daemon (the control one and one kept for handing over memfds)", 3 * n, j);
	}
	ibv_dealloc_pd(s.pd);
	ibv_destroy_cq(s.cq);
	ibv_close_device(s.ctx);
	if (path) {
		unsigned long inos[8];

		j = daemon_sockets(path, inos, 8);
		CHECK(j == 0, "after ibv_close_device it has %d", j);
	}
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "lost";

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(mode, "lost"))
		return lost();
	if (!strcmp(mode, "fork"))
		return forked();
	if (!strcmp(mode, "handoff"))
		return handoff(argc, argv);
	if (!strcmp(mode, "speed"))
		return speed(argc, argv);
	fprintf(stderr, "usage: regcheck lost|fork|handoff HELPER...|speed N [MAPS]\n");
	return 2;
}
