/* shmcheck: ibv_reg_mr of memory that is already shared, as middleware allocates it
 * (UCX's default allocator gives SysV shared memory): such memory is handed to the
 * daemon as it is, never moved, so every other mapping of it sees what the device wrote.
 *
 * One QP connected to itself. For each kind, a 64 KiB region registered at an unaligned
 * start; a peer's RDMA WRITE into it must land in the program's pointer AND in a second
 * mapping of the same object (a second shmat of the segment, a second mmap of the file):
 * the device wrote the very pages, no copy. An RDMA READ of bytes the program put through
 * the second mapping must return them. The mapping's name in /proc/self/maps must stay
 * what it was (not softhca's memfd).
 *
 *   SysV segment (shmget/shmat, removed with IPC_RMID as UCX does)
 *   MAP_SHARED | MAP_ANONYMOUS
 *   a memfd of the program's, created with MFD_ALLOW_SEALING, still open or closed
 *     (softhca seals it against shrinking: F_SEAL_SHRINK is then set)
 * and the kinds refused EINVAL (a file its owner can shrink under the daemon):
 *   a memfd without MFD_ALLOW_SEALING, a /dev/shm file (shm_open).
 *
 * Expected values are computed here, never read back from softhca. Exit 0 when every
 * check holds; each check prints one line. */
#define _GNU_SOURCE
#define PROG "shmcheck"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

#include "side.h"

#define SIZE (64u << 10)
#define AT 100u                 /* the registration starts here in the region */
#define LEN (SIZE - 2 * AT)

static struct side s;
static uint8_t *src, *dst;      /* private, registered: WRITE's source, READ's sink */
static struct ibv_mr *src_mr, *dst_mr;

static void mapping_of(const void *p, char *name, size_t n)
{
	char perms[8], nm[256];

	if (mapping_of_addr(p, perms, nm, sizeof(nm)))
		snprintf(name, n, "(unmapped)");
	else
		snprintf(name, n, "%s %s", perms, *nm ? nm : "(anonymous)");
}

static int run_wr(enum ibv_wr_opcode op, void *local, uint32_t lkey, uint64_t raddr,
		  uint32_t rkey)
{
	struct ibv_wc wc;

	if (post(&s, op, local, LEN, lkey, raddr, rkey))
		return -1;
	wc = wait_wc(&s);
	return wc.status == IBV_WC_SUCCESS ? 0 : (int)wc.status;
}

/* Registers p + AT, checks a WRITE lands in p and in alias, a READ returns what the
 * program put through alias, and the mapping kept its name. */
static void share(const char *kind, uint8_t *p, uint8_t *alias)
{
	char before[300], after[300];
	struct ibv_mr *mr;
	size_t i, bad_p = 0, bad_alias = 0, bad_read = 0;
	int rc;

	mapping_of(p, before, sizeof(before));
	memset(p, 0, SIZE);
	mr = ibv_reg_mr(s.pd, p + AT, LEN, ACCESS);
	CHECK(mr != NULL, "%s: ibv_reg_mr succeeds%s%s", kind, mr ? "" : ": ",
	      mr ? "" : strerror(errno));
	if (!mr)
		return;
	mapping_of(p, after, sizeof(after));
	CHECK(!strcmp(before, after), "%s: the mapping is not moved (%s, after: %s)", kind,
	      before, after);
	for (i = 0; i < LEN; i++)
		src[i] = pat(1, i);
	rc = run_wr(IBV_WR_RDMA_WRITE, src, src_mr->lkey, (uintptr_t)(p + AT), mr->rkey);
	CHECK(rc == 0, "%s: an RDMA WRITE into it completes (status %d)", kind, rc);
	for (i = 0; i < SIZE; i++) {
		uint8_t want = i >= AT && i < AT + LEN ? pat(1, i - AT) : 0;

		bad_p += p[i] != want;
		bad_alias += alias[i] != want;
	}
	CHECK(bad_p == 0, "%s: the WRITE's bytes are in the program's mapping (%zu differ)",
	      kind, bad_p);
	CHECK(bad_alias == 0, "%s: and in another mapping of the same memory, no copy (%zu "
	      "differ)", kind, bad_alias);
	for (i = 0; i < LEN; i++)
		alias[AT + i] = pat(2, i);
	memset(dst, 0, LEN);
	rc = run_wr(IBV_WR_RDMA_READ, dst, dst_mr->lkey, (uintptr_t)(p + AT), mr->rkey);
	CHECK(rc == 0, "%s: an RDMA READ of it completes (status %d)", kind, rc);
	for (i = 0; i < LEN; i++)
		bad_read += dst[i] != pat(2, i);
	CHECK(bad_read == 0, "%s: the READ returns what the program wrote through the other "
	      "mapping (%zu differ)", kind, bad_read);
	CHECK(ibv_dereg_mr(mr) == 0, "%s: ibv_dereg_mr succeeds", kind);
}

static void refuse(const char *kind, uint8_t *p)
{
	struct ibv_mr *mr;

	errno = 0;
	mr = ibv_reg_mr(s.pd, p + AT, LEN, ACCESS);
	CHECK(!mr && errno == EINVAL, "%s: ibv_reg_mr fails: %s", kind,
	      mr ? "it succeeded" : strerror(errno));
	if (mr)
		ibv_dereg_mr(mr);
}

static uint8_t *map_fd(int fd)
{
	void *p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	if (p == MAP_FAILED)
		die("mmap");
	return p;
}

int main(int argc, char **argv)
{
	struct peer_info self;
	const char *only = argc > 1 ? argv[1] : "all";
	uint8_t *a, *b;
	int id, fd;

	open_side(&s);
	src = malloc(LEN);
	dst = malloc(LEN);
	src_mr = ibv_reg_mr(s.pd, src, LEN, ACCESS);
	dst_mr = ibv_reg_mr(s.pd, dst, LEN, ACCESS);
	if (!src_mr || !dst_mr)
		die("ibv_reg_mr of malloc'ed memory");
	self = (struct peer_info){s.qp->qp_num, 0, 0, s.gid};
	connect_qp(&s, &self);

	if (!strcmp(only, "all") || !strcmp(only, "sysv")) {
		id = shmget(IPC_PRIVATE, SIZE, IPC_CREAT | 0600);
		if (id < 0)
			die("shmget");
		a = shmat(id, NULL, 0);
		b = shmat(id, NULL, 0);
		if (a == (void *)-1 || b == (void *)-1)
			die("shmat");
		shmctl(id, IPC_RMID, NULL);     /* as UCX does: gone with its last detach */
		share("SysV segment", a, b);
		shmdt(a);
		shmdt(b);
	}
	if (!strcmp(only, "all") || !strcmp(only, "anon")) {
		/* a forked child would share these pages; here the alias is the mapping itself */
		a = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (a == MAP_FAILED)
			die("mmap");
		share("MAP_SHARED|MAP_ANONYMOUS", a, a);
		munmap(a, SIZE);
	}
	if (!strcmp(only, "all") || !strcmp(only, "memfd")) {
		fd = memfd_create("program-pool", MFD_ALLOW_SEALING | MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, SIZE))
			die("memfd_create");
		a = map_fd(fd);
		b = map_fd(fd);
		share("a memfd of the program's", a, b);
		CHECK(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK, "a memfd of the program's: it is "
		      "now sealed against shrinking (seals %#x)", fcntl(fd, F_GET_SEALS));
		munmap(b, SIZE);
		b = map_fd(fd);
		close(fd);              /* mapped, no fd of it left open */
		share("a memfd of the program's, its fd closed", a, b);
		munmap(a, SIZE);
		munmap(b, SIZE);

		fd = memfd_create("unsealable", MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, SIZE))
			die("memfd_create");
		a = map_fd(fd);
		refuse("a memfd without MFD_ALLOW_SEALING", a);
		munmap(a, SIZE);
		close(fd);
	}
	if (!strcmp(only, "all") || !strcmp(only, "file")) {
		char name[64];

		snprintf(name, sizeof(name), "/shmcheck-%d", (int)getpid());
		fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
		if (fd < 0 || ftruncate(fd, SIZE))
			die("shm_open");
		shm_unlink(name);
		a = map_fd(fd);
		refuse("a /dev/shm file", a);
		munmap(a, SIZE);
		close(fd);
	}
	return failures ? 1 : 0;
}
