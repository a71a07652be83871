/* Registered memory shared with the daemon. The device must reach the bytes of the
 * program's buffer, and here the device is another process: the pages that hold the
 * registration are moved onto a memfd at the same virtual addresses (their contents
 * copied, then mmap(MAP_FIXED | MAP_SHARED) over them), and the daemon maps the same
 * memfd. The program keeps its pointer and its data; what a peer's RDMA WRITE puts in
 * the daemon's mapping is in the program's buffer, with no copy.
 *
 * Memory that is already shared (MAP_SHARED) is not moved: moving it would cut it off
 * from its other mappings (another shmat of a SysV segment, a forked child, another
 * mmap of a memfd). Its backing object itself is handed over, at the mapping's offset:
 * a SysV segment or MAP_SHARED | MAP_ANONYMOUS memory (kernel-internal shmem files,
 * opened through /proc/self/map_files), or a memfd of the program's, which is sealed
 * against shrinking here first (F_SEAL_SHRINK) if it is not already. A SysV segment
 * no fd of which can be had (map_files needs a privilege) is named instead: its shmid
 * (the inode number /proc/self/maps shows) and where this process maps it; the daemon,
 * in the same IPC namespace, checks this process maps it there and attaches it
 * itself (shmat). A file that its
 * owner can shrink under the daemon's mapping (a /dev/shm or hugetlbfs file, a memfd
 * that cannot be sealed) is refused: the daemon would fault on the cut pages.
 *
 * What cannot be shared is refused with a line on stderr saying why: the stack (its
 * pages cannot be replaced under a running frame, and a grown stack would not be
 * shared), read-only memory and device mappings, and unmapped addresses (EFAULT).
 * The fds are handed to the daemon (SCM_RIGHTS, conn.c's shca_hand_over): it maps what
 * this process sent, never a file it opens by number. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "softhca.h"

#define MEMFD_NAME "softhca-mr"

struct shca_mem {
	uintptr_t start, end;
	uint64_t off;           /* the file offset of start (0 for a moved range) */
	int shared;             /* memory already shared, handed over as it is */
	int fd;                 /* -1 for a segment named by its shmid */
	int shmid;              /* a SysV segment the daemon attaches itself, or -1 */
	int refs;
	struct shca_mem *next;
};

static uintptr_t page_size(void)
{
	return (uintptr_t)sysconf(_SC_PAGESIZE);
}

/* A MAP_SHARED mapping of /proc/self/maps. */
struct shared_vma {
	uintptr_t lo, hi;
	uint64_t off;
	dev_t dev;
	unsigned long ino;
	char name[256];
};

/* softhca's own memfds: pages an earlier, since deregistered, registration moved are
 * the program's own private memory still. */
static int is_moved(const char *name)
{
	return !strncmp(name, "/memfd:" MEMFD_NAME " ", strlen(MEMFD_NAME) + 8);
}

/* The mapping that holds an address, found by the kernel with the PROCMAP_QUERY ioctl
 * of /proc/self/maps (Linux 6.11; uapi linux/fs.h, declared here for older headers): a
 * lookup in the process's tree of mappings. Reading the file instead costs in
 * proportion to the mappings below the address (20,000 of them: about 40 ms per
 * ibv_reg_mr), so it is the way only on a kernel without the ioctl. */
#define SHCA_PROCMAP_QUERY _IOWR('f', 17, struct shca_procmap_query)
enum {
	SHCA_VMA_READABLE = 0x1,
	SHCA_VMA_WRITABLE = 0x2,
	SHCA_VMA_EXECUTABLE = 0x4,
	SHCA_VMA_SHARED = 0x8,
};
struct shca_procmap_query {
	uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags,
		 vma_page_size, vma_offset, inode;
	uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
	uint64_t vma_name_addr, build_id_addr;
};

/* One mapping as /proc/self/maps says it. */
struct maps_vma {
	unsigned long lo, hi, ino;
	unsigned long long off;
	unsigned int major, minor;
	char perms[8];
	char name[256];
};

/* The walk of /proc/self/maps in address order: the ioctl while the kernel has it (once
 * it says it has not, never asked again), else the file's lines. */
struct maps_walk {
	int fd;
	FILE *f;
};

static int no_procmap_query;

/* 1 and *v when a mapping holds addr (addr never below the last one asked), 0 when none
 * does, -1 with errno when the file cannot be read. */
static int vma_at(struct maps_walk *w, uintptr_t addr, struct maps_vma *v)
{
	char line[512];

	if (!w->f && !no_procmap_query) {
		char name[4096];
		struct shca_procmap_query q = {
			.size = sizeof(q), .query_addr = addr,
			.vma_name_size = sizeof(name), .vma_name_addr = (uintptr_t)name,
		};

		if (!ioctl(w->fd, SHCA_PROCMAP_QUERY, &q)) {
			v->lo = (unsigned long)q.vma_start;
			v->hi = (unsigned long)q.vma_end;
			v->off = q.vma_offset;
			v->major = q.dev_major;
			v->minor = q.dev_minor;
			v->ino = (unsigned long)q.inode;
			snprintf(v->perms, sizeof(v->perms), "%c%c%c%c",
				 q.vma_flags & SHCA_VMA_READABLE ? 'r' : '-',
				 q.vma_flags & SHCA_VMA_WRITABLE ? 'w' : '-',
				 q.vma_flags & SHCA_VMA_EXECUTABLE ? 'x' : '-',
				 q.vma_flags & SHCA_VMA_SHARED ? 's' : 'p');
			snprintf(v->name, sizeof(v->name), "%.255s", q.vma_name_size ? name : "");
			return 1;
		}
		if (errno == ENOENT)
			return 0;
		if (errno != ENOTTY && errno != EINVAL)
			return -1;
		no_procmap_query = 1;
	}
	if (!w->f) {
		w->f = fdopen(w->fd, "r");
		if (!w->f)
			return -1;
		w->fd = -1;     /* the FILE's now */
	}
	while (fgets(line, sizeof(line), w->f)) {
		char *p;
		unsigned long lo = strtoul(line, &p, 16), hi;

		if (*p != '-')
			continue;
		if (lo > addr)
			return 0;       /* the lines are in address order: a hole */
		hi = strtoul(p + 1, NULL, 16);
		if (hi <= addr)
			continue;       /* only the line that holds addr is parsed whole */
		v->name[0] = 0;
		if (sscanf(line, "%lx-%lx %7s %llx %x:%x %lu %255[^\n]", &v->lo, &v->hi,
			   v->perms, &v->off, &v->major, &v->minor, &v->ino, v->name) >= 7)
			return 1;
	}
	return ferror(w->f) ? -1 : 0;
}

/* 0 when [start, *upto) lies in the program's own writable private memory, *upto being
 * end or the start of a MAP_SHARED mapping met on the way; 0 with v->hi set when start
 * itself is in a writable MAP_SHARED mapping (v says which); EINVAL or EFAULT, said on
 * stderr, otherwise. */
static int check_maps(uintptr_t start, uintptr_t end, void *addr, size_t length,
		      uintptr_t *upto, struct shared_vma *v)
{
	struct maps_walk w = {.fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC)};
	uintptr_t covered = start;
	int rc = EFAULT, met_shared = 0, got = 0;
	struct maps_vma m;

	v->hi = 0;
	if (w.fd < 0) {
		shca_log("ibv_reg_mr: cannot read /proc/self/maps: %s", strerror(errno));
		return EFAULT;
	}
	while (covered < end && (got = vma_at(&w, covered, &m)) > 0) {
		const char *perms = m.perms, *name = m.name;

		if (!strcmp(name, "[stack]") || !strncmp(name, "[stack:", 7)) {
			shca_log("ibv_reg_mr(%p, %zu): EINVAL: the buffer is on the stack, which "
				 "softhca cannot share with its daemon; register heap or mmap'ed "
				 "memory", addr, length);
			rc = EINVAL;
			goto out;
		}
		if (perms[0] == 'r' && perms[1] == 'w' && perms[3] == 's' && !is_moved(name)) {
			if (covered == start) {
				*v = (struct shared_vma){m.lo, m.hi, m.off, makedev(m.major, m.minor),
							 m.ino, ""};
				snprintf(v->name, sizeof(v->name), "%s", name);
				covered = m.hi < end ? m.hi : end;
			}
			met_shared = 1;
			break;  /* the private part, if any, ends here */
		}
		if (perms[0] != 'r' || perms[1] != 'w' || (perms[3] != 'p' && !is_moved(name))) {
			shca_log("ibv_reg_mr(%p, %zu): EINVAL: the pages are mapped %s (%s), "
				 "which softhca cannot share with its daemon (it needs them "
				 "writable)", addr, length, perms, *name ? name : "anonymous");
			rc = EINVAL;
			goto out;
		}
		covered = m.hi;
	}
	if (got < 0) {
		shca_log("ibv_reg_mr: cannot read /proc/self/maps: %s", strerror(errno));
	} else if (covered >= end || met_shared) {
		*upto = covered < end ? covered : end;
		rc = 0;
	} else {
		shca_log("ibv_reg_mr(%p, %zu): EFAULT: address %#lx is not mapped", addr, length,
			 (unsigned long)covered);
	}
out:
	if (w.f)
		fclose(w.f);
	else
		close(w.fd);
	return rc;
}

static int same_file(int fd, const struct shared_vma *v)
{
	struct stat st;

	return !fstat(fd, &st) && st.st_dev == v->dev && st.st_ino == v->ino;
}

/* A read-write fd of the object v maps, or -1: through /proc/self/map_files (which the
 * kernel opens for CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE only), else by the file's
 * name when it still has one, else by an fd of it the program holds. */
static int open_backing(const struct shared_vma *v)
{
	char path[300];
	struct dirent *e;
	DIR *d;
	int fd;

	snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", (unsigned long)v->lo,
		 (unsigned long)v->hi);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd >= 0 && same_file(fd, v))
		return fd;
	if (fd >= 0)
		close(fd);
	if (v->name[0] == '/' && !strstr(v->name, " (deleted)")) {
		fd = open(v->name, O_RDWR | O_CLOEXEC);
		if (fd >= 0 && same_file(fd, v))
			return fd;
		if (fd >= 0)
			close(fd);
	}
	d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	fd = -1;
	while (fd < 0 && (e = readdir(d))) {
		struct stat st;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		if (stat(path, &st) || st.st_dev != v->dev || st.st_ino != v->ino)
			continue;
		/* a new open file of it, read-write, whatever mode the program's fd has */
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd >= 0 && !same_file(fd, v)) {
			close(fd);
			fd = -1;
		}
	}
	closedir(d);
	return fd;
}

#define TMPFS_MAGIC_ 0x01021994

/* The MAP_SHARED mapping v as a segment handing its object over from p to stop, or
 * NULL with *rc EINVAL and a line saying why. Which objects the daemon can map safely:
 * docs/native.md, "Memory already shared". */
static struct shca_mem *share_vma(struct shca_context *ctx, const struct shared_vma *v,
				  uintptr_t p, uintptr_t stop, void *addr, size_t length, int *rc)
{
	int memfd = !strncmp(v->name, "/memfd:", 7);
	int shmem = !strcmp(v->name, "/dev/zero (deleted)") ||
		    (!strncmp(v->name, "/SYSV", 5) && strlen(v->name) == 23 &&
		     !strcmp(v->name + 13, " (deleted)"));
	struct shca_mem *m;
	struct statfs sf;
	int fd, seals;

	*rc = EINVAL;
	if (!memfd && !shmem) {
		shca_log("ibv_reg_mr(%p, %zu): EINVAL: the pages are a MAP_SHARED mapping of "
			 "%s, a file its owner can shrink under the daemon, which softhca "
			 "cannot guard against; register private memory, a SysV segment or a "
			 "memfd (MFD_ALLOW_SEALING)", addr, length, v->name);
		return NULL;
	}
	fd = open_backing(v);
	if (fd < 0 && shmem && v->name[1] == 'S' && ctx->sysv_attach && v->ino <= INT32_MAX) {
		/* no fd of the segment: the daemon attaches it by its shmid, the inode
		 * number of its file (checks, SHM_HUGETLB included: server/shared_mr.py) */
		m = calloc(1, sizeof(*m));
		if (!m) {
			*rc = ENOMEM;
			return NULL;
		}
		*m = (struct shca_mem){.start = p, .end = stop, .off = v->off + (p - v->lo),
				       .shared = 1, .fd = -1, .shmid = (int)v->ino, .refs = 1};
		*rc = 0;
		return m;
	}
	if (fd < 0) {
		shca_log("ibv_reg_mr(%p, %zu): EINVAL: the pages are a MAP_SHARED mapping of "
			 "%s, which softhca cannot open to hand to its daemon (no fd of it is "
			 "open, and /proc/self/map_files needs CAP_SYS_ADMIN or "
			 "CAP_CHECKPOINT_RESTORE)", addr, length, v->name);
		return NULL;
	}
	if (shmem && (fstatfs(fd, &sf) || sf.f_type != TMPFS_MAGIC_)) {
		/* a SysV segment of huge pages (SHM_HUGETLB) lives on hugetlbfs */
		shca_log("ibv_reg_mr(%p, %zu): EINVAL: the pages are a SysV segment of huge "
			 "pages (SHM_HUGETLB), which softhca does not share with its daemon; "
			 "allocate it without SHM_HUGETLB", addr, length);
		goto fail;
	}
	seals = memfd ? fcntl(fd, F_GET_SEALS) : 0;
	if (memfd && !(seals >= 0 && (seals & F_SEAL_SHRINK)) &&
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK)) {
		shca_log("ibv_reg_mr(%p, %zu): EINVAL: the memfd %s cannot be sealed against "
			 "shrinking (F_ADD_SEALS: %s; create it with MFD_ALLOW_SEALING), so its "
			 "owner could cut it under the daemon", addr, length, v->name,
			 strerror(errno));
		goto fail;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		*rc = ENOMEM;
		goto fail;
	}
	m->start = p;
	m->end = stop;
	m->off = v->off + (p - v->lo);
	m->fd = fd;
	m->shmid = -1;
	m->refs = 1;
	m->shared = 1;
	*rc = 0;
	return m;
fail:
	close(fd);
	return NULL;
}

/* EINVAL, said on stderr, when [start, end) reaches the provider's own pages (its
 * CQ rings, objects, frames, its reader thread's stack: palloc.h): they are written by
 * the provider's threads at any moment, and are not the program's to register. */
static int check_own(uintptr_t start, uintptr_t end, void *addr, size_t length)
{
	uintptr_t lo, hi;

	if (!shca_pages_overlap(start, end, &lo, &hi))
		return 0;
	shca_log("ibv_reg_mr(%p, %zu): EINVAL: the range reaches [%#lx, %#lx), softhca's "
		 "own memory (its CQ rings and objects), which a program cannot register",
		 addr, length, (unsigned long)lo, (unsigned long)hi);
	return EINVAL;
}

static struct shca_mem *remap(uintptr_t start, uintptr_t end)
{
	size_t size = end - start;
	struct shca_mem *m = calloc(1, sizeof(*m));
	void *p;
	int fd;

	if (!m)
		return NULL;
	fd = memfd_create(MEMFD_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		goto fail;
	if (ftruncate(fd, (off_t)size) ||
	    pwrite(fd, (void *)start, size, 0) != (ssize_t)size ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
		goto fail_fd;
	/* From here the pages are the memfd's; their bytes were copied just before. */
	p = mmap((void *)start, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
	if (p == MAP_FAILED)
		goto fail_fd;
	m->start = start;
	m->end = end;
	m->fd = fd;
	m->shmid = -1;
	m->refs = 1;
	return m;
fail_fd:
	shca_log("ibv_reg_mr: sharing [%#lx, %#lx) failed: %s", (unsigned long)start,
		 (unsigned long)end, strerror(errno));
	close(fd);
fail:
	free(m);
	return NULL;
}

/* The segment holding page address p, or NULL; *next is the start of the first
 * segment above p (or UINTPTR_MAX). Called with mem_lock held. */
static struct shca_mem *segment_at(struct shca_context *ctx, uintptr_t p, uintptr_t *next)
{
	struct shca_mem *m;

	*next = UINTPTR_MAX;
	for (m = ctx->mems; m; m = m->next) {
		if (m->shared)  /* each registration of it takes its own */
			continue;
		if (m->start <= p && p < m->end)
			return m;
		if (m->start > p && m->start < *next)
			*next = m->start;
	}
	return NULL;
}

static void unref(struct shca_context *ctx, struct shca_mem *mem)
{
	struct shca_mem **pp;

	if (--mem->refs)
		return;
	for (pp = &ctx->mems; *pp; pp = &(*pp)->next) {
		if (*pp == mem) {
			*pp = mem->next;
			break;
		}
	}
	if (mem->fd >= 0)
		close(mem->fd);
	free(mem);
}

/* The registration's pages as pieces of memfds, in address order: pages an earlier
 * registration already moved are shared through its memfd (two buffers from malloc
 * may share a page), the others move onto a new one. The daemon maps the pieces
 * side by side, so the registration is one range there as here. */
int shca_mem_share(struct shca_context *ctx, void *addr, size_t length,
		   struct shca_memref *ref, struct mp_buf *pieces, uint64_t *offset,
		   uint32_t *seq)
{
	int fds[SHCA_MAX_PIECES];
	uintptr_t ps = page_size();
	uintptr_t a = (uintptr_t)addr;
	uintptr_t start = a & ~(ps - 1);
	uintptr_t end, p, next;
	struct shca_mem *m;
	struct mp_buf items;
	int rc = 0, nfds = 0;

	memset(ref, 0, sizeof(*ref));
	if (!length || a + length < a) {
		shca_log("ibv_reg_mr(%p, %zu): EINVAL: length must be positive and the range "
			 "must not wrap", addr, length);
		return EINVAL;
	}
	end = (a + length + ps - 1) & ~(ps - 1);
	mp_init(&items);
	pthread_mutex_lock(&ctx->mem_lock);
	for (p = start; p < end && !rc;) {
		uintptr_t stop;

		if (ref->n == SHCA_MAX_PIECES) {
			shca_log("ibv_reg_mr(%p, %zu): EINVAL: the pages are spread over more than "
				 "%d earlier registrations", addr, length, SHCA_MAX_PIECES);
			rc = EINVAL;
			break;
		}
		m = segment_at(ctx, p, &next);
		if (m) {
			m->refs++;
		} else {
			struct shared_vma v;

			stop = next < end ? next : end;
			rc = check_maps(p, stop, addr, length, &stop, &v);
			if (rc)
				break;
			rc = check_own(p, stop, addr, length);
			if (rc)
				break;
			if (v.hi) {
				/* already shared: its object goes over as it is */
				m = share_vma(ctx, &v, p, stop, addr, length, &rc);
				if (!m)
					break;
			} else {
				/* No write of the reader thread's (a completion, a
				 * reply) falls between the copy and the mapping that
				 * replaces the pages. */
				pthread_mutex_lock(&ctx->conn->dispatch);
				m = remap(p, stop);
				pthread_mutex_unlock(&ctx->conn->dispatch);
				if (!m) {
					rc = EFAULT;
					break;
				}
			}
			m->next = ctx->mems;
			ctx->mems = m;
		}
		stop = m->end < end ? m->end : end;
		if (m->fd >= 0) {
			fds[nfds] = m->fd;
			mp_arr(&items, 3);
			mp_uint(&items, (uint64_t)nfds++);      /* its place in the handoff */
		} else {
			/* a segment the daemon attaches: its shmid, and where this
			 * process maps the piece (what the daemon checks) */
			mp_arr(&items, 5);
			mp_str(&items, SHCA_PIECE_SYSV);
			mp_uint(&items, (uint64_t)m->shmid);
		}
		ref->seg[ref->n++] = m;
		mp_uint(&items, m->off + (p - m->start));
		mp_uint(&items, stop - p);
		if (m->fd < 0)
			mp_uint(&items, p);
		p = stop;
	}
	if (!rc)
		*seq = ctx->handoff_seq++;
	pthread_mutex_unlock(&ctx->mem_lock);
	/* the references taken keep the fds open while they are handed over */
	if (!rc && nfds)
		rc = shca_hand_over(ctx, fds, nfds, *seq);
	if (rc) {
		pthread_mutex_lock(&ctx->mem_lock);
		while (ref->n)
			unref(ctx, ref->seg[--ref->n]);
		pthread_mutex_unlock(&ctx->mem_lock);
	}
	if (!rc) {
		mp_arr(pieces, (uint32_t)ref->n);
		mp_raw(pieces, items.p, items.len);
		*offset = a - start;
	}
	mp_free(&items);
	return rc;
}

/* The registration went: each memfd no registration uses any more is closed. The
 * pages stay mapped from it (they are the program's memory, with its data), and a
 * later registration of them moves them anew. */
void shca_mem_release(struct shca_context *ctx, struct shca_memref *ref)
{
	pthread_mutex_lock(&ctx->mem_lock);
	while (ref->n)
		unref(ctx, ref->seg[--ref->n]);
	pthread_mutex_unlock(&ctx->mem_lock);
}

void shca_mem_release_all(struct shca_context *ctx)
{
	struct shca_mem *m, *n;

	pthread_mutex_lock(&ctx->mem_lock);
	for (m = ctx->mems; m; m = n) {
		n = m->next;
		if (m->fd >= 0)
			close(m->fd);
		free(m);
	}
	ctx->mems = NULL;
	pthread_mutex_unlock(&ctx->mem_lock);
}
