/* QPs' send and receive queues shared with the daemon, as a device's queues live in
 * host memory: a QP's WQEs live in a memfd this process makes and maps and hands to the
 * daemon at ibv_create_qp (as a CQ's completion ring goes, cq.c). ibv_post_send and
 * ibv_post_recv check each WR against what the provider knows (the QP's state from its
 * own ibv_modify_qp calls, its caps, the queue's room), write it into the next slot,
 * store the producer index (release) and ring the doorbell: one frame with no reply per
 * post call. The daemon reads the WQEs into its engine and stores the consumer index as
 * the WRs retire, which is the room. The layout is protocol/wq_ring.py's (wire.h's
 * SHCA_WQ_*); docs/native.md, "Send and receive rings". A QP whose ring cannot be made
 * (SOFTHCA_WQ_RING=0, a daemon that takes none, an SRQ's receives, the sends of a QP
 * with mlx5dv's MKEY builders, whose configure WRs are requests) posts with requests
 * (qp.c, wr.c). An ibv_wr_* batch is written into the ring as its builders close each
 * WR and published whole at ibv_wr_complete (shca_wq_stage, shca_wq_commit). */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "softhca.h"

#define WQ_MEMFD_NAME "softhca-wq"

/* Whether QPs of ctx get rings: the daemon takes them and SOFTHCA_WQ_RING is not "0". */
static int wq_wanted(struct shca_context *ctx)
{
	const char *v = getenv("SOFTHCA_WQ_RING");

	if (v && !strcmp(v, "0"))
		return 0;
	return ctx->wq_ring && ctx->memfd_key[0];
}

static size_t queue_bytes(uint32_t slots, uint32_t stride)
{
	return SHCA_WQ_HEADER_SIZE + (size_t)slots * stride;
}

int shca_wq_make(struct shca_context *ctx, struct shca_qp *qp, int queues, uint32_t sq_slots,
		 uint32_t rq_slots, uint32_t *seq)
{
	size_t bytes = 0;
	uint8_t *base;
	int fd, rc;

	memset(&qp->sq, 0, sizeof(qp->sq));
	memset(&qp->rq, 0, sizeof(qp->rq));
	qp->wq_map = NULL;
	if (!queues || !wq_wanted(ctx)) {
		if (queues)
			shca_debug("ibv_create_qp: work requests go as requests (%s)",
				   ctx->wq_ring ? "SOFTHCA_WQ_RING=0" :
				   "the daemon offers no send and receive rings");
		return EOPNOTSUPP;
	}
	if (queues & SHCA_WQ_QUEUE_SEND) {
		qp->sq.slots = sq_slots;
		qp->sq.stride = SHCA_WQ_SEND_STRIDE(qp->max_send_sge, qp->max_inline);
		bytes += queue_bytes(sq_slots, qp->sq.stride);
	}
	if (queues & SHCA_WQ_QUEUE_RECV) {
		qp->rq.slots = rq_slots;
		qp->rq.stride = SHCA_WQ_RECV_STRIDE(qp->max_recv_sge);
		qp->rq.at = bytes;
		bytes += queue_bytes(rq_slots, qp->rq.stride);
	}
	fd = shca_ring_memfd(WQ_MEMFD_NAME, bytes, (void **)&base, &qp->wq_bytes);
	if (fd < 0) {
		rc = errno;
		shca_debug("ibv_create_qp: no send and receive rings (memfd: %s): work requests "
			   "go as requests", strerror(rc));
		return rc;
	}
	rc = shca_ring_hand_over(ctx, fd, seq);
	if (rc) {
		munmap(base, qp->wq_bytes);
		return rc;
	}
	qp->wq_map = base;
	if (queues & SHCA_WQ_QUEUE_SEND)
		qp->sq.base = base;
	if (queues & SHCA_WQ_QUEUE_RECV)
		qp->rq.base = base + qp->rq.at;
	return 0;
}

/* The daemon took only these queues of the ring (its reply's ring_queues). */
void shca_wq_keep(struct shca_qp *qp, int queues)
{
	if (!(queues & SHCA_WQ_QUEUE_SEND))
		qp->sq.base = NULL;
	if (!(queues & SHCA_WQ_QUEUE_RECV))
		qp->rq.base = NULL;
	if (qp->sq.base || qp->rq.base)
		shca_debug("ibv_create_qp: QP %#x: %s%s%s in a ring shared with the daemon",
			   qp->vqp.qp.qp_num, qp->sq.base ? "send queue" : "",
			   qp->sq.base && qp->rq.base ? " and " : "",
			   qp->rq.base ? "receive queue" : "");
}

void shca_wq_unmap(struct shca_qp *qp)
{
	if (qp->wq_map)
		munmap(qp->wq_map, qp->wq_bytes);
	qp->wq_map = NULL;
	qp->sq.base = qp->rq.base = NULL;
}

/* ibv_modify_qp to RESET empties the queues (the daemon's consumer index is 0 again
 * when its reply comes): the producer starts over too, as mlx5 resets its indices. */
void shca_wq_reset(struct shca_qp *qp)
{
	struct shca_wq *qs[2] = {&qp->sq, &qp->rq};
	int i;

	for (i = 0; i < 2; i++) {
		if (!qs[i]->base)
			continue;
		qs[i]->prod = 0;
		__atomic_store_n((uint64_t *)(void *)(qs[i]->base + SHCA_WQ_PRODUCER_OFFSET), 0,
				 __ATOMIC_RELEASE);
	}
}

static const char *state_name(enum ibv_qp_state st)
{
	static const char *const names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE",
					    "ERR"};

	return (unsigned)st < sizeof(names) / sizeof(names[0]) ? names[st] : "an unknown state";
}

static inline void put32(uint8_t *s, size_t off, uint32_t v)
{
	v = htole32(v);
	memcpy(s + off, &v, sizeof(v));
}

static inline void put64(uint8_t *s, size_t off, uint64_t v)
{
	v = htole64(v);
	memcpy(s + off, &v, sizeof(v));
}

/* Whether the queue has room for one more WQE after the ahead written and not yet
 * published: depth - (producer + ahead - consumer), the consumer loaded with acquire
 * order, so the daemon has read the slot it frees. */
static int room(struct shca_wq *q, uint32_t ahead)
{
	uint64_t cons = __atomic_load_n((uint64_t *)(void *)(q->base + SHCA_WQ_CONSUMER_OFFSET),
					__ATOMIC_ACQUIRE);

	return q->prod + ahead - cons < q->slots;
}

static uint8_t *slot_at(struct shca_wq *q, uint64_t i)
{
	return q->base + SHCA_WQ_HEADER_SIZE + (size_t)(i % q->slots) * q->stride;
}

static uint8_t *slot(struct shca_wq *q)
{
	return slot_at(q, q->prod);
}

/* The new WQEs published (release: the slots are written before the daemon can see
 * the index), then the doorbell: a frame with no reply. */
static int ring_doorbell(struct shca_context *ctx, struct shca_qp *qp, struct shca_wq *q,
			 int rq)
{
	struct mp_buf b;

	__atomic_store_n((uint64_t *)(void *)(q->base + SHCA_WQ_PRODUCER_OFFSET), q->prod,
			 __ATOMIC_RELEASE);
	shca_wire_begin(&b, SHCA_V_DOORBELL, 0, SHCA_NFIELDS_DOORBELL);
	mp_kv_uint(&b, SHCA_K_QP, qp->handle);
	mp_str(&b, SHCA_K_RQ);
	mp_bool(&b, rq != 0);
	return shca_send_oneway(ctx->conn, &b);
}

/* What ibv_post_send(3) refuses of a WR before it reaches the queue, from what the
 * provider knows; *inl: IBV_SEND_INLINE's byte count, or -1 when the WR carries SGEs. */
/* What every send WR must be, on a ring or in a request, before anything reads its
 * SGEs: num_sge within the QP's max_send_sge, an sg_list when it has SGEs, an opcode
 * that is an enum ibv_wr_opcode (a device refuses one it does not know at that WR). */
int shca_send_wr_shape(const struct shca_qp *qp, const struct ibv_send_wr *wr)
{
	unsigned op = (unsigned)wr->opcode;

	if (wr->num_sge < 0 || wr->num_sge > SHCA_MAX_SGE ||
	    (uint32_t)wr->num_sge > qp->max_send_sge) {
		shca_log("ibv_post_send: EINVAL: num_sge %d exceeds the QP's max_send_sge %u",
			 wr->num_sge, qp->max_send_sge);
		return EINVAL;
	}
	if (wr->num_sge && !wr->sg_list) {
		shca_log("ibv_post_send: EINVAL: wr_id %llu has num_sge %d and no sg_list",
			 (unsigned long long)wr->wr_id, wr->num_sge);
		return EINVAL;
	}
	if (op > IBV_WR_DRIVER1 && op != IBV_WR_ATOMIC_WRITE) {
		shca_log("ibv_post_send: EINVAL: wr_id %llu has opcode %u, not an enum "
			 "ibv_wr_opcode", (unsigned long long)wr->wr_id, op);
		return EINVAL;
	}
	return 0;
}

static int send_check(struct shca_qp *qp, const struct ibv_send_wr *wr, long *inl)
{
	unsigned op = (unsigned)wr->opcode;
	uint64_t ops;
	size_t total = 0;
	int i, rc;

	*inl = -1;
	rc = shca_send_wr_shape(qp, wr);
	if (rc)
		return rc;
	switch (qp->vqp.qp.qp_type) {
	case IBV_QPT_UC:
		ops = SHCA_WQ_OPCODES_UC;
		break;
	case IBV_QPT_UD:
		ops = SHCA_WQ_OPCODES_UD;
		break;
	default:
		ops = SHCA_WQ_OPCODES_RC;
	}
	if (!(ops >> op & 1)) {
		/* rxe refuses an opcode its QP type has no use for (EINVAL); an RC opcode
		 * softhca does not model (TSO, a driver's) is EOPNOTSUPP, as the daemon says */
		int rc = qp->vqp.qp.qp_type == IBV_QPT_RC ? EOPNOTSUPP : EINVAL;

		shca_log("ibv_post_send: %s: opcode %u is not %s this QP type", rc == EINVAL ?
			 "EINVAL" : "EOPNOTSUPP", op, rc == EINVAL ? "one of" : "modelled on");
		return rc;
	}
	if (qp->vqp.qp.qp_type == IBV_QPT_UD && !wr->wr.ud.ah) {
		shca_log("ibv_post_send: EINVAL: a UD WR needs wr.ud.ah");
		return EINVAL;
	}
	if (op == IBV_WR_BIND_MW && (!wr->bind_mw.mw || wr->num_sge)) {
		/* rxe's validate_send_wr: a bind names its window and carries no SGE */
		shca_log("ibv_post_send: EINVAL: IBV_WR_BIND_MW needs bind_mw.mw and carries no "
			 "SGE");
		return EINVAL;
	}
	if ((op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) &&
	    (wr->num_sge != 1 || wr->sg_list[0].length != 8)) {
		/* IBTA atomics operate on one 64-bit value, which comes back into one 8-byte
		 * buffer (rxe refuses a shorter one at post) */
		shca_log("ibv_post_send: EINVAL: wr_id %llu: an atomic needs exactly one SGE of 8 "
			 "bytes", (unsigned long long)wr->wr_id);
		return EINVAL;
	}
	if (op == IBV_WR_ATOMIC_WRITE &&
	    (wr->num_sge > 1 || (wr->num_sge && wr->sg_list[0].length != 8) ||
	     (wr->num_sge ? wr->wr.rdma.remote_addr : wr->wr.atomic.remote_addr) % 8)) {
		/* ibv_wr_atomic_write(3): 8 bytes to an 8-byte aligned remote address */
		shca_log("ibv_post_send: EINVAL: wr_id %llu: IBV_WR_ATOMIC_WRITE writes 8 bytes "
			 "(no SGE or one of 8) to an 8-byte aligned remote_addr",
			 (unsigned long long)wr->wr_id);
		return EINVAL;
	}
	if (!(wr->send_flags & IBV_SEND_INLINE) || op == IBV_WR_LOCAL_INV)
		return 0;
	if (qp->vqp.qp.qp_type == IBV_QPT_RC && !(SHCA_WQ_OPCODES_INLINE >> op & 1)) {
		shca_log("ibv_post_send: EINVAL: IBV_SEND_INLINE is valid only for SEND and "
			 "RDMA_WRITE, not opcode %u", op);
		return EINVAL;
	}
	for (i = 0; i < wr->num_sge; i++)
		total += wr->sg_list[i].length;
	if (total > qp->max_inline) {
		shca_log("ibv_post_send: EINVAL: %zu bytes of inline data exceed max_inline_data "
			 "%u", total, qp->max_inline);
		return EINVAL;
	}
	*inl = (long)total;
	return 0;
}

static void send_wqe(struct shca_qp *qp, uint8_t *s, const struct ibv_send_wr *wr, long inl)
{
	unsigned op = (unsigned)wr->opcode;
	int atomic = op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD ||
		     (op == IBV_WR_ATOMIC_WRITE && wr->num_sge == 0);
	uint8_t *data = s + SHCA_WQ_SEND_HEADER_SIZE;
	int i;

	memset(s, 0, SHCA_WQ_SEND_HEADER_SIZE);
	put64(s, SHCA_WQ_SEND_WR_ID, wr->wr_id);
	put32(s, SHCA_WQ_SEND_OPCODE, op);
	put32(s, SHCA_WQ_SEND_SEND_FLAGS, wr->send_flags);
	/* imm_data and invalidate_rkey share their storage (a union): each by its opcode */
	if (op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM)
		put32(s, SHCA_WQ_SEND_IMM_DATA, ntohl(wr->imm_data));
	if (op == IBV_WR_SEND_WITH_INV || op == IBV_WR_LOCAL_INV)
		put32(s, SHCA_WQ_SEND_INVALIDATE_RKEY, wr->invalidate_rkey);
	/* wr.rdma, wr.atomic and wr.ud share their storage too */
	if (qp->vqp.qp.qp_type == IBV_QPT_UD) {
		put32(s, SHCA_WQ_SEND_AH, to_sah(wr->wr.ud.ah)->handle);
		put32(s, SHCA_WQ_SEND_REMOTE_QPN, wr->wr.ud.remote_qpn & 0xFFFFFF);
		put32(s, SHCA_WQ_SEND_REMOTE_QKEY, wr->wr.ud.remote_qkey);
	} else if (atomic) {
		put32(s, SHCA_WQ_SEND_RKEY, wr->wr.atomic.rkey);
		put64(s, SHCA_WQ_SEND_REMOTE_ADDR, wr->wr.atomic.remote_addr);
		put64(s, SHCA_WQ_SEND_COMPARE_ADD, wr->wr.atomic.compare_add);
		put64(s, SHCA_WQ_SEND_SWAP, wr->wr.atomic.swap);
	} else if (op == IBV_WR_BIND_MW) {
		const struct ibv_mw_bind_info *bi = &wr->bind_mw.bind_info;

		put32(s, SHCA_WQ_SEND_RKEY, wr->bind_mw.rkey);
		put32(s, SHCA_WQ_SEND_BIND_MW, to_smw(wr->bind_mw.mw)->handle);
		put32(s, SHCA_WQ_SEND_BIND_LKEY, bi->mr ? bi->mr->lkey : 0);
		put64(s, SHCA_WQ_SEND_BIND_ADDR, bi->addr);
		put64(s, SHCA_WQ_SEND_BIND_LENGTH, bi->length);
		put32(s, SHCA_WQ_SEND_BIND_ACCESS, bi->mw_access_flags);
	} else {
		put32(s, SHCA_WQ_SEND_RKEY, wr->wr.rdma.rkey);
		put64(s, SHCA_WQ_SEND_REMOTE_ADDR, wr->wr.rdma.remote_addr);
	}
	if (inl >= 0) {
		/* the bytes themselves, into the slot: the buffer is the caller's again
		 * as soon as the post returns (ibv_post_send(3)) */
		put32(s, SHCA_WQ_SEND_INLINE_LEN, (uint32_t)inl);
		for (i = 0; i < wr->num_sge; i++) {
			memcpy(data, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
			data += wr->sg_list[i].length;
		}
		return;
	}
	put32(s, SHCA_WQ_SEND_NUM_SGE, (uint32_t)wr->num_sge);
	for (i = 0; i < wr->num_sge; i++, data += SHCA_WQ_SGE_SIZE) {
		put64(data, 0, wr->sg_list[i].addr);
		put32(data, 8, wr->sg_list[i].length);
		put32(data, 12, wr->sg_list[i].lkey);
	}
}

/* ibv_post_send(3) of a ring QP: the WRs up to the first refused go into the ring and
 * *bad is that one (the state, a cap, an opcode, a full queue: ENOMEM, as mlx5). */
int shca_wq_post_send(struct shca_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct shca_context *ctx = to_sctx(qp->vqp.qp.context);
	enum ibv_qp_state st = qp->vqp.qp.state;
	struct ibv_send_wr *head = wr;
	uint64_t first;
	long inl;
	int rc = 0, db;

	/* ibv_post_send(3): RTS and SQD take WRs, ERR flushes them (the daemon may move
	 * the QP there by itself); any other state refuses them */
	if (st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_ERR) {
		shca_log("ibv_post_send: EINVAL: ibv_post_send needs the QP in RTS/SQD (ERR "
			 "flushes), it is in %s", state_name(st));
		*bad = wr;
		return EINVAL;
	}
	if (ctx->conn->core.dead) {
		*bad = wr;
		return EIO;
	}
	pthread_mutex_lock(&qp->post_lock);
	first = qp->sq.prod;
	for (; wr; wr = wr->next) {
		rc = send_check(qp, wr, &inl);
		if (!rc && !room(&qp->sq, 0)) {
			shca_debug("ibv_post_send: ENOMEM: the send queue holds %u WRs", qp->sq.slots);
			rc = ENOMEM;
		}
		if (rc)
			break;
		send_wqe(qp, slot(&qp->sq), wr, inl);
		qp->sq.prod++;
	}
	db = qp->sq.prod != first ? ring_doorbell(ctx, qp, &qp->sq, 0) : 0;
	pthread_mutex_unlock(&qp->post_lock);
	/* a doorbell that cannot go (the daemon is gone): nothing can be said posted */
	if (rc || db)
		*bad = rc ? wr : head;
	return rc ? rc : db;
}

/* ibv_wr_complete's WRs on a ring: each WR the builders close is checked and written
 * into the slot after those of the batch before it, nothing published; the batch is
 * published whole at ibv_wr_complete (ibv_wr_post(3): nothing reaches the queue
 * unless it succeeds), or forgotten at ibv_wr_abort. */
int shca_wq_stage(struct shca_qp *qp, const struct ibv_send_wr *wr)
{
	long inl;
	int rc = send_check(qp, wr, &inl);

	if (rc)
		return rc;
	if (!room(&qp->sq, qp->sq_staged)) {
		shca_log("ibv_wr_complete: ENOMEM: the send queue holds %u WRs", qp->sq.slots);
		return ENOMEM;
	}
	send_wqe(qp, slot_at(&qp->sq, qp->sq.prod + qp->sq_staged), wr, inl);
	qp->sq_staged++;
	return 0;
}

int shca_wq_commit(struct shca_qp *qp)
{
	struct shca_context *ctx = to_sctx(qp->vqp.qp.context);
	enum ibv_qp_state st = qp->vqp.qp.state;
	uint32_t n = qp->sq_staged;

	qp->sq_staged = 0;
	if (!n)
		return 0;
	if (st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_ERR) {
		shca_log("ibv_wr_complete: EINVAL: ibv_post_send needs the QP in RTS/SQD (ERR "
			 "flushes), it is in %s", state_name(st));
		return EINVAL;
	}
	qp->sq.prod += n;
	return ring_doorbell(ctx, qp, &qp->sq, 0);
}

/* ibv_post_recv(3) of a ring QP, as shca_wq_post_send. */
int shca_wq_post_recv(struct shca_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct shca_context *ctx = to_sctx(qp->vqp.qp.context);
	struct ibv_recv_wr *head = wr;
	uint64_t first;
	uint8_t *s;
	int rc = 0, db, i;

	/* ibv_post_recv(3): every state but RESET takes receives (ERR flushes them) */
	if (qp->vqp.qp.state == IBV_QPS_RESET) {
		shca_log("ibv_post_recv: EINVAL: ibv_post_recv needs the QP in INIT/RTR/RTS/SQD "
			 "(ERR flushes), it is in RESET");
		*bad = wr;
		return EINVAL;
	}
	if (ctx->conn->core.dead) {
		*bad = wr;
		return EIO;
	}
	pthread_mutex_lock(&qp->recv_lock);
	first = qp->rq.prod;
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_recv_sge) {
			shca_log("ibv_post_recv: EINVAL: num_sge %d exceeds the QP's max_recv_sge %u",
				 wr->num_sge, qp->max_recv_sge);
			rc = EINVAL;
		} else if (wr->num_sge && !wr->sg_list) {
			shca_log("ibv_post_recv: EINVAL: wr_id %llu has num_sge %d and no sg_list",
				 (unsigned long long)wr->wr_id, wr->num_sge);
			rc = EINVAL;
		} else if (!room(&qp->rq, 0)) {
			shca_debug("ibv_post_recv: ENOMEM: the receive queue holds %u WRs",
				   qp->rq.slots);
			rc = ENOMEM;
		}
		if (rc)
			break;
		s = slot(&qp->rq);
		put64(s, SHCA_WQ_RECV_WR_ID, wr->wr_id);
		put32(s, SHCA_WQ_RECV_NUM_SGE, (uint32_t)wr->num_sge);
		for (i = 0; i < wr->num_sge; i++) {
			uint8_t *g = s + SHCA_WQ_RECV_HEADER_SIZE + (size_t)i * SHCA_WQ_SGE_SIZE;

			put64(g, 0, wr->sg_list[i].addr);
			put32(g, 8, wr->sg_list[i].length);
			put32(g, 12, wr->sg_list[i].lkey);
		}
		qp->rq.prod++;
	}
	db = qp->rq.prod != first ? ring_doorbell(ctx, qp, &qp->rq, 1) : 0;
	pthread_mutex_unlock(&qp->recv_lock);
	if (rc || db)
		*bad = rc ? wr : head;
	return rc ? rc : db;
}
