/* CQs' completion rings shared with the daemon, as rxe's CQs are mmapped queues the
 * kernel writes: the CQ's completions live in a memfd this process makes and maps and
 * hands to the daemon at ibv_create_cq (conn.c's memfd handoff, as ibv_reg_mr's pages
 * go). The daemon writes each work completion into an entry, then publishes it by
 * storing the producer index; ibv_poll_cq reads entries up to it and stores the
 * consumer index, which is the daemon's measure of the room: no frame, no system call,
 * no sleep. The layout is protocol/cq_ring.py's (wire.h's SHCA_RING_*); docs/native.md,
 * "Completion rings". A CQ whose ring cannot be made (SOFTHCA_CQ_RING=0, a daemon that
 * takes none) takes the daemon's pushed "wc" frames instead (verbs.c, conn.c). */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "softhca.h"

#define RING_MEMFD_NAME "softhca-cq"
/* How long an empty poll sleeps at most, woken as soon as the daemon publishes. */
#define RING_WAIT_NS 200000L

static inline volatile uint64_t *ring_index(struct shca_cq_ring *r, size_t offset)
{
	return (volatile uint64_t *)(void *)(r->base + offset);
}

/* Whether CQs of ctx get rings: the daemon takes them and SOFTHCA_CQ_RING is not "0". */
static int ring_wanted(struct shca_context *ctx)
{
	const char *v = getenv("SOFTHCA_CQ_RING");

	if (v && !strcmp(v, "0"))
		return 0;
	return ctx->cq_ring && ctx->memfd_key[0];
}

int shca_ring_memfd(const char *name, size_t bytes, void **base, size_t *mapped)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	int fd, e;
	void *p;

	bytes = (bytes + page - 1) / page * page;
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -1;
	if (ftruncate(fd, (off_t)bytes) ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
		goto fail;
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		goto fail;
	*base = p;
	*mapped = bytes;
	return fd;
fail:
	e = errno;
	close(fd);
	errno = e;
	return -1;
}

/* A fresh ring of slots entries, mapped: its memfd's fd, or -1 with errno set. */
static int ring_map(struct shca_cq_ring *r, uint32_t slots)
{
	void *p;
	int fd = shca_ring_memfd(RING_MEMFD_NAME, SHCA_RING_HEADER_SIZE +
				 (size_t)slots * SHCA_RING_ENTRY_SIZE, &p, &r->bytes);

	if (fd < 0)
		return -1;
	r->base = p;
	r->slots = slots;
	r->cons = 0;
	return fd;
}

void shca_cq_ring_unmap(struct shca_cq_ring *r)
{
	if (r->base)
		munmap(r->base, r->bytes);
	r->base = NULL;
}

int shca_ring_hand_over(struct shca_context *ctx, int fd, uint32_t *seq)
{
	int rc;

	pthread_mutex_lock(&ctx->mem_lock);
	*seq = ctx->handoff_seq++;
	pthread_mutex_unlock(&ctx->mem_lock);
	rc = shca_hand_over(ctx, &fd, 1, *seq);
	close(fd);
	return rc;
}

/* A completion channel's write end handed over for a ring CQ bound to it (a dup: the
 * provider keeps its own for a CQ whose events come as frames). */
int shca_cq_channel_hand_over(struct shca_context *ctx, int wfd, uint32_t *seq)
{
	int fd = fcntl(wfd, F_DUPFD_CLOEXEC, 0);

	if (fd < 0)
		return errno;
	return shca_ring_hand_over(ctx, fd, seq);
}

int shca_cq_ring_make(struct shca_context *ctx, struct shca_cq_ring *r, uint32_t slots,
		      uint32_t *seq)
{
	int fd, rc;

	pthread_mutex_init(&r->lock, NULL);
	r->base = NULL;
	if (!ring_wanted(ctx)) {
		shca_debug("ibv_create_cq: completions come as frames (%s)", ctx->cq_ring ?
			   "SOFTHCA_CQ_RING=0" : "the daemon offers no completion rings");
		return EOPNOTSUPP;
	}
	fd = ring_map(r, slots);
	if (fd < 0) {
		rc = errno;
		shca_debug("ibv_create_cq: no completion ring (memfd: %s): completions come "
			   "as frames", strerror(rc));
		return rc;
	}
	rc = shca_ring_hand_over(ctx, fd, seq);
	if (rc)
		shca_cq_ring_unmap(r);
	else
		shca_debug("ibv_create_cq: %u entries in a completion ring shared with the daemon",
			   slots);
	return rc;
}

/* One entry as struct ibv_wc (the ring is little-endian, as protocol/cq_ring.py packs
 * it; imm_data is stored big-endian, as libibverbs hands it out). */
static void ring_wc(const uint8_t *e, struct ibv_wc *wc)
{
	uint64_t wr_id;
	uint32_t f[9];
	static const size_t at[9] = {
		SHCA_RING_WC_STATUS, SHCA_RING_WC_OPCODE, SHCA_RING_WC_BYTE_LEN,
		SHCA_RING_WC_IMM_DATA, SHCA_RING_WC_QP_NUM, SHCA_RING_WC_WC_FLAGS,
		SHCA_RING_WC_VENDOR_ERR, SHCA_RING_WC_INVALIDATED_RKEY, SHCA_RING_WC_SRC_QP,
	};
	int i;

	memcpy(&wr_id, e + SHCA_RING_WC_WR_ID, sizeof(wr_id));
	for (i = 0; i < 9; i++) {
		memcpy(&f[i], e + at[i], sizeof(f[i]));
		f[i] = le32toh(f[i]);
	}
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = le64toh(wr_id);
	wc->status = (enum ibv_wc_status)f[0];
	wc->opcode = (enum ibv_wc_opcode)f[1];
	wc->byte_len = f[2];
	wc->qp_num = f[4];
	wc->wc_flags = f[5];
	wc->vendor_err = f[6];
	wc->src_qp = f[8];
	if (wc->wc_flags & IBV_WC_WITH_INV)
		wc->invalidated_rkey = f[7];
	else
		wc->imm_data = htobe32(f[3]);
}

/* Up to num entries of the ring into wc; *prod is the producer index seen. */
static int ring_take(struct shca_cq_ring *r, int num, struct ibv_wc *wc, uint64_t *prod)
{
	uint64_t avail;
	int n = 0;

	pthread_mutex_lock(&r->lock);
	/* Acquire: the entries the daemon wrote before it stored this index are seen. */
	*prod = __atomic_load_n(ring_index(r, SHCA_RING_PRODUCER_OFFSET), __ATOMIC_ACQUIRE);
	avail = *prod - r->cons;
	/* More than the ring holds is no index the daemon stores (this process's pages
	 * written by another hand): nothing is read past what the ring can hold. */
	if (avail > r->slots)
		avail = 0;
	while ((uint64_t)n < avail && n < num) {
		ring_wc(r->base + SHCA_RING_HEADER_SIZE +
			(size_t)((r->cons + (uint64_t)n) % r->slots) * SHCA_RING_ENTRY_SIZE,
			&wc[n]);
		n++;
	}
	if (n) {
		r->cons += (uint64_t)n;
		/* Release: the entries are read before the daemon sees their room free. */
		__atomic_store_n(ring_index(r, SHCA_RING_CONSUMER_OFFSET), r->cons,
				 __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&r->lock);
	return n;
}

/* An empty poll sleeps until the daemon publishes past prod, RING_WAIT_NS at most. The
 * device is a process on the same CPUs: a program spinning on an empty ring takes the
 * time the daemon needs to make the completion (docs/performance.md measures it). The
 * thread counts itself in the ring's waiters first (a locked add: a full barrier), so
 * the daemon, reading them after it publishes into any ring of the context (a program
 * polls its send and receive CQs in turn), wakes it (server/cq_ring.py); the
 * kernel compares the index with prod before it sleeps, so an entry published since
 * is never slept through. */
static void ring_wait(struct shca_cq_ring *r, uint64_t prod)
{
	uint32_t *waiters = (uint32_t *)(void *)(r->base + SHCA_RING_WAITERS_OFFSET);
	struct timespec t = {0, RING_WAIT_NS};

	__atomic_fetch_add(waiters, 1, __ATOMIC_SEQ_CST);
	/* the index's low 32 bits: the futex word (little-endian) */
	syscall(SYS_futex, r->base + SHCA_RING_PRODUCER_OFFSET, FUTEX_WAIT,
		(uint32_t)prod, &t, NULL, 0);
	__atomic_fetch_sub(waiters, 1, __ATOMIC_SEQ_CST);
}

int shca_cq_ring_poll(struct shca_cq *cq, int num, struct ibv_wc *wc)
{
	uint64_t prod;
	int n = ring_take(&cq->shared, num, wc, &prod);

	if (n)
		return n;
	ring_wait(&cq->shared, prod);
	return ring_take(&cq->shared, num, wc, &prod);
}

/* ibv_req_notify_cq: the daemon arms the CQ and pushes a "cq_event" frame at its next
 * entry (at once when one is unpolled); the reader thread (conn.c) writes the channel.
 * A message with no reply, as cq_credit is. */
int shca_cq_ring_notify(struct shca_context *ctx, struct shca_cq *cq, int solicited_only)
{
	struct mp_buf b;

	shca_wire_begin(&b, SHCA_V_REQ_NOTIFY_CQ, 0, SHCA_NFIELDS_REQ_NOTIFY_CQ);
	mp_kv_uint(&b, SHCA_K_CQ, cq->handle);
	mp_str(&b, SHCA_K_SOLICITED_ONLY);
	mp_bool(&b, solicited_only != 0);
	return shca_send_oneway(ctx->conn, &b);
}

/* ibv_resize_cq of a ring CQ: a new ring, handed over; the daemon moves the unpolled
 * entries to its start. No poll runs meanwhile (the ring's lock), so the consumer
 * index the daemon reads in the old ring is the last. */
int shca_cq_ring_resize(struct shca_context *ctx, struct shca_cq *cq, int cqe)
{
	struct shca_cq_ring fresh = {0};
	struct mp_buf b;
	struct shca_frame r;
	uint32_t seq = 0;
	int fd, rc;

	pthread_mutex_lock(&cq->shared.lock);
	fd = ring_map(&fresh, (uint32_t)cqe);
	rc = fd < 0 ? errno : shca_ring_hand_over(ctx, fd, &seq);
	if (!rc) {
		shca_begin(ctx->conn, &b, SHCA_V_RESIZE_CQ, SHCA_NFIELDS_RESIZE_CQ);
		mp_kv_uint(&b, SHCA_K_CQ, cq->handle);
		mp_kv_uint(&b, SHCA_K_CQE, (uint32_t)cqe);
		mp_kv_uint(&b, SHCA_K_RING, seq);
		rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	}
	if (rc) {
		shca_cq_ring_unmap(&fresh);
	} else {
		shca_frame_free(&r);
		shca_cq_ring_unmap(&cq->shared);
		cq->shared.base = fresh.base;
		cq->shared.bytes = fresh.bytes;
		cq->shared.slots = fresh.slots;
		cq->shared.cons = 0;
		cq->cq.cqe = cqe;
	}
	pthread_mutex_unlock(&cq->shared.lock);
	return rc;
}
