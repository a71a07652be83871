/* Registered memory shared with the daemon. The device must reach the bytes of the
 * program's buffer, and here the device is another process: the pages that hold the
 * registration are moved onto a memfd at the same virtual addresses (their contents
 * copied, then mmap(MAP_FIXED | MAP_SHARED) over them), and the daemon maps the same
 * memfd. The program keeps its pointer and its data; what a peer's RDMA WRITE puts in
 * the daemon's mapping is in the program's buffer, with no copy.
 *
 * What cannot be shared this way is refused with a line on stderr saying why: the
 * stack (its pages cannot be replaced under a running frame, and a grown stack would
 * not be shared), memory that is not the program's own writable private memory
 * (read-only, file-backed shared, device mappings), and unmapped addresses (EFAULT).
 * The memfd is sealed against shrinking, so the daemon never maps a file that can be
 * cut under it. The memfds themselves are handed to the daemon (SCM_RIGHTS, conn.c's
 * shca_hand_over): it maps what this process sent, never a file it opens by number. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "softhca.h"

#define MEMFD_NAME "softhca-mr"

struct shca_mem {
	uintptr_t start, end;
	int fd;
	int refs;
	struct shca_mem *next;
};

static uintptr_t page_size(void)
{
	return (uintptr_t)sysconf(_SC_PAGESIZE);
}

/* 0 when [start, end) lies in the program's own writable private memory; EINVAL or
 * EFAULT, said on stderr, otherwise. */
static int check_maps(uintptr_t start, uintptr_t end, void *addr, size_t length)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	uintptr_t covered = start;
	int rc = EFAULT;

	if (!f) {
		shca_log("ibv_reg_mr: cannot read /proc/self/maps: %s", strerror(errno));
		return EFAULT;
	}
	while (covered < end && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char perms[8] = "", name[256] = "";

		if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %255[^\n]", &lo, &hi, perms, name) < 3)
			continue;
		if (hi <= covered || lo > covered)
			continue;
		if (!strcmp(name, "[stack]") || !strncmp(name, "[stack:", 7)) {
			shca_log("ibv_reg_mr(%p, %zu): EINVAL: the buffer is on the stack, which "
				 "softhca cannot share with its daemon; register heap or mmap'ed "
				 "memory", addr, length);
			rc = EINVAL;
			goto out;
		}
		/* pages an earlier, since deregistered, registration moved are the
		 * program's own too */
		if (perms[0] != 'r' || perms[1] != 'w' ||
		    (perms[3] != 'p' && strncmp(name, "/memfd:" MEMFD_NAME " ",
						 strlen(MEMFD_NAME) + 8))) {
			shca_log("ibv_reg_mr(%p, %zu): EINVAL: the pages are mapped %s (%s), "
				 "not the program's own writable private memory, which is what "
				 "softhca can share with its daemon", addr, length, perms,
				 *name ? name : "anonymous");
			rc = EINVAL;
			goto out;
		}
		covered = hi;
	}
	if (covered >= end) {
		rc = 0;
	} else {
		shca_log("ibv_reg_mr(%p, %zu): EFAULT: address %#lx is not mapped", addr, length,
			 (unsigned long)covered);
	}
out:
	fclose(f);
	return rc;
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
	int rc = 0;

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
			stop = next < end ? next : end;
			rc = check_maps(p, stop, addr, length);
			if (rc)
				break;
			rc = check_own(p, stop, addr, length);
			if (rc)
				break;
			/* No write of the reader thread's (a completion, a reply) falls
			 * between the copy and the mapping that replaces the pages. */
			pthread_mutex_lock(&ctx->conn->dispatch);
			m = remap(p, stop);
			pthread_mutex_unlock(&ctx->conn->dispatch);
			if (!m) {
				rc = EFAULT;
				break;
			}
			m->next = ctx->mems;
			ctx->mems = m;
		}
		stop = m->end < end ? m->end : end;
		fds[ref->n] = m->fd;
		mp_arr(&items, 3);
		mp_uint(&items, (uint64_t)ref->n);      /* its place in the handoff */
		ref->seg[ref->n++] = m;
		mp_uint(&items, p - m->start);
		mp_uint(&items, stop - p);
		p = stop;
	}
	if (!rc)
		*seq = ctx->handoff_seq++;
	pthread_mutex_unlock(&ctx->mem_lock);
	/* the references taken keep the fds open while they are handed over */
	if (!rc)
		rc = shca_hand_over(ctx, fds, ref->n, *seq);
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
		close(m->fd);
		free(m);
	}
	ctx->mems = NULL;
	pthread_mutex_unlock(&ctx->mem_lock);
}
