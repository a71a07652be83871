/* The libraries' own pages (palloc.h): blocks of power-of-two sizes carved from 1 MiB
 * mappings and kept on free lists by size, and larger blocks mapped one by one. Every
 * mapping is a region the registration check knows. Chunks are never returned: what
 * the libraries hold at most is what they keep. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "palloc.h"

#define CHUNK ((size_t)1 << 20)
#define MIN_SHIFT 5             /* the smallest block: 32 bytes, header included */
#define NCLASS 13               /* ... the largest: 128 KiB */
#define BIG 0xffffffffu
#define MAGIC 0x5ca1ab1eu

/* Before each block; 16 bytes, so that what follows is aligned as malloc's is. */
struct hdr {
	uint32_t cls;           /* size class, or BIG: a mapping of its own */
	uint32_t magic;
	size_t size;            /* a BIG block's mapping length */
};

/* A mapping of the library's; the nodes are 32-byte blocks of class 0. */
struct region {
	uintptr_t start, end;
	struct region *next;
	uintptr_t pad;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *freelist[NCLASS];
static uint8_t *bump, *bump_end;
static struct region *regions;

static size_t class_size(unsigned c)
{
	return (size_t)1 << (c + MIN_SHIFT);
}

static void *carve(unsigned c);

/* Called with lock held. */
static int add_region(uintptr_t start, uintptr_t end)
{
	struct region *r = carve(0);

	if (!r)
		return -1;
	r->start = start;
	r->end = end;
	r->next = regions;
	regions = r;
	return 0;
}

/* A block of class c, from its free list or a chunk. Called with lock held. */
static void *carve(unsigned c)
{
	size_t size = class_size(c);
	void *p = freelist[c];

	if (p) {
		freelist[c] = *(void **)p;
		return p;
	}
	if (!bump || (size_t)(bump_end - bump) < size) {
		/* what is left of the old chunk stays unused: at most one block's worth */
		void *m = mmap(NULL, CHUNK, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (m == MAP_FAILED)
			return NULL;
		bump = m;
		bump_end = bump + CHUNK;
		if (add_region((uintptr_t)m, (uintptr_t)m + CHUNK)) {
			munmap(m, CHUNK);
			bump = bump_end = NULL;
			return NULL;
		}
	}
	p = bump;
	bump += size;
	return p;
}

void *shca_alloc(size_t n)
{
	size_t need = n + sizeof(struct hdr);
	struct hdr *h;
	unsigned c;

	if (need < n) {
		errno = ENOMEM;
		return NULL;
	}
	if (need > class_size(NCLASS - 1)) {
		size_t ps = (size_t)sysconf(_SC_PAGESIZE);
		size_t len = (need + ps - 1) & ~(ps - 1);
		void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			       -1, 0);
		int rc;

		if (m == MAP_FAILED) {
			errno = ENOMEM;
			return NULL;
		}
		pthread_mutex_lock(&lock);
		rc = add_region((uintptr_t)m, (uintptr_t)m + len);
		pthread_mutex_unlock(&lock);
		if (rc) {
			munmap(m, len);
			errno = ENOMEM;
			return NULL;
		}
		h = m;
		h->cls = BIG;
		h->size = len;
		h->magic = MAGIC;
		return h + 1;       /* fresh pages are zero */
	}
	for (c = 0; class_size(c) < need; c++)
		;
	pthread_mutex_lock(&lock);
	h = carve(c);
	pthread_mutex_unlock(&lock);
	if (!h) {
		errno = ENOMEM;
		return NULL;
	}
	h->cls = c;
	h->magic = MAGIC;
	h->size = 0;
	memset(h + 1, 0, class_size(c) - sizeof(*h));
	return h + 1;
}

static size_t usable(const struct hdr *h)
{
	return (h->cls == BIG ? h->size : class_size(h->cls)) - sizeof(*h);
}

void shca_free(void *p)
{
	struct hdr *h;

	if (!p)
		return;
	h = (struct hdr *)p - 1;
	if (h->magic != MAGIC)
		abort();            /* not a block of ours: a bug, never papered over */
	h->magic = 0;
	if (h->cls == BIG) {
		size_t len = h->size;

		shca_pages_remove((uintptr_t)h);
		munmap(h, len);
		return;
	}
	pthread_mutex_lock(&lock);
	*(void **)h = freelist[h->cls];
	freelist[h->cls] = h;
	pthread_mutex_unlock(&lock);
}

void *shca_realloc(void *p, size_t n)
{
	struct hdr *h;
	void *q;

	if (!p)
		return shca_alloc(n);
	h = (struct hdr *)p - 1;
	if (n <= usable(h))
		return p;
	q = shca_alloc(n);
	if (!q)
		return NULL;
	memcpy(q, p, usable(h));
	shca_free(p);
	return q;
}

int shca_pages_add(uintptr_t start, uintptr_t end)
{
	int rc;

	pthread_mutex_lock(&lock);
	rc = add_region(start, end);
	pthread_mutex_unlock(&lock);
	return rc;
}

void shca_pages_remove(uintptr_t start)
{
	struct region **pp, *r;

	pthread_mutex_lock(&lock);
	for (pp = &regions; (r = *pp); pp = &r->next) {
		if (r->start == start) {
			*pp = r->next;
			*(void **)r = freelist[0];
			freelist[0] = r;
			break;
		}
	}
	pthread_mutex_unlock(&lock);
}

int shca_pages_overlap(uintptr_t start, uintptr_t end, uintptr_t *lo, uintptr_t *hi)
{
	struct region *r;
	int found = 0;

	pthread_mutex_lock(&lock);
	for (r = regions; r && !found; r = r->next) {
		if (r->start < end && start < r->end) {
			*lo = r->start;
			*hi = r->end;
			found = 1;
		}
	}
	pthread_mutex_unlock(&lock);
	return found;
}

/* A fork while another thread holds the lock would leave it held in the child. */
static void fork_prepare(void)
{
	pthread_mutex_lock(&lock);
}

static void fork_done(void)
{
	pthread_mutex_unlock(&lock);
}

static __attribute__((constructor)) void palloc_init(void)
{
	pthread_atfork(fork_prepare, fork_done, fork_done);
}
