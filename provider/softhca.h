/* The softhca provider: libibverbs calls become softhca control requests
 * (docs/protocol.md) on a UNIX socket to a local daemon, which keeps every QP, its
 * state and its transport. The program's registered memory is shared with the daemon
 * (mem.c); completions are written by the daemon into per-CQ rings in memory shared
 * with it (cq.c), or, where there is none, pushed as frames into rings the reader
 * thread fills (conn.c); poll_cq reads either without a round trip. */
#ifndef SOFTHCA_PROVIDER_H
#define SOFTHCA_PROVIDER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "abi.h"
#include "chan_bridge.h"
#include "core.h"
#include "dv_bridge.h"
#include "frame.h"
#include "mp.h"
#include "palloc.h"
#include "wire_enc.h"

#define SHCA_MAX_DEVICES 16
#define SHCA_NAME_MAX 64

/* The connection and everything its reader thread writes are in palloc's pages. */
struct shca_conn {
	/* the socket, the request in flight, the reader's loop (core.h); core.lock guards
	 * the reply and every CQ ring, and the lists of the context's objects */
	struct shca_core core;
	pthread_t reader;
	int reader_started;
	/* Held by the reader thread from a frame's first byte until the frame is dealt
	 * with, and by ibv_reg_mr while it moves pages onto a memfd: no write of the
	 * reader's can fall inside a move. */
	pthread_mutex_t dispatch;
	uintptr_t stack;            /* the reader's stack, as palloc knows it, or 0 */
	pthread_cond_t wc_cond;     /* completions arrived (CLOCK_MONOTONIC), under core.lock */
	uint32_t async_id;          /* the get_async_event waiting on the daemon, or 0 */
	uint32_t own_ids;           /* ids of the reader thread's own requests */
	int closing;                /* ibv_close_device ends it: not the device dying */
	struct shca_context *ctx;
};

struct shca_mem;

/* The memfd segments one registration's pages lie on (mem.c). */
#define SHCA_MAX_PIECES 16
struct shca_memref {
	int n;
	struct shca_mem *seg[SHCA_MAX_PIECES];
};

struct shca_context {
	struct verbs_context vctx; /* libibverbs' part first... */
	/* ...which libibverbs allocates with malloc: the connection, which the reader
	 * thread writes, is not in it (palloc.h) */
	struct shca_conn *conn;
	pid_t pid;                 /* the process that opened the context... */
	unsigned generation;       /* ...and its fork generation (shca_forked) */
	char path[108];            /* the daemon's UNIX socket */
	char memfd_key[65];        /* what a handoff of memfds proves (the welcome's) */
	int sysv_attach;           /* the daemon attaches a SysV segment by its shmid */
	int cq_ring;               /* the daemon takes CQs' completion rings (cq.c) */
	int wq_ring;               /* ...and QPs' send and receive rings (wq.c) */
	uint32_t handoff_seq;      /* the number of the next handoff, under mem_lock */
	int handoff_fd;            /* the kept memfd connection, or -1 (conn.c)... */
	pthread_mutex_t handoff_lock; /* ...one handoff on it at a time */
	uint32_t handle;           /* the daemon's ctx handle */
	char devices[SHCA_MAX_DEVICES][SHCA_NAME_MAX];
	int ndevices;
	char address[128];         /* the daemon's wire address, HOST:PORT */
	struct ibv_device_attr attr;
	/* ibv_query_device_ex's device_cap_flags_ex, as the daemon answers it */
	uint64_t device_cap_flags_ex;
	/* ibv_query_device_ex's odp_caps: the on-demand paging the daemon models
	 * (engine/odp.py), as it answers it */
	struct ibv_odp_caps odp_caps;
	uint64_t max_msg_sz;
	struct shca_cq *cqs;       /* under conn.lock */
	struct shca_qp *qps;       /* under conn.lock */
	struct shca_srq *srqs;     /* under conn.lock */
	struct shca_mem *mems;     /* under mem_lock */
	pthread_mutex_t mem_lock;
	int async_pipe[2];
};

struct shca_pd {
	struct ibv_pd pd;
	uint32_t handle;
};

/* ibv_create_ah (ah.c): the daemon's AH by its session handle. */
struct shca_ah {
	struct ibv_ah ah;
	uint32_t handle;
};

struct shca_mr {
	struct verbs_mr vmr;
	uint32_t handle;
	struct shca_memref mem;
};

/* ibv_alloc_mw's window: the session's handle of it (provider/mw.c). */
struct shca_mw {
	struct ibv_mw mw;
	uint32_t handle;
};

/* An SRQ (srq.c): the daemon's handle, what post_srq_recv checks. */
struct shca_srq {
	struct ibv_srq srq;
	uint32_t handle;
	uint32_t max_sge;
	struct shca_srq *next;
};

/* A CQ's completion ring shared with the daemon (cq.c, protocol/cq_ring.py): the
 * mapping of the memfd, its entries, and the consumer count this process has reached
 * (the copy of it in the ring is what the daemon reads). */
struct shca_cq_ring {
	uint8_t *base;      /* the mapping, or NULL: the CQ takes pushed "wc" frames */
	size_t bytes;
	uint32_t slots;     /* the CQ's cqe */
	uint64_t cons;
	pthread_mutex_t lock;   /* one poll (or a resize) of the ring at a time */
};

struct shca_cq {
	struct ibv_cq cq;
	uint32_t handle;
	/* the frame path: the completions the reader thread took from "wc" frames */
	struct ibv_wc *ring;
	uint32_t cap, head, count;
	int armed;
	int chan_wfd;       /* write end of the completion channel's pipe, or -1 */
	struct shca_cq_ring shared;
	struct shca_cq *next;
};

/* A run of an ibv_wr_* batch: consecutive send WRs, posted as one post_send request, or
 * MKEY configure calls, posted as one mkey_configure request. */
enum { SHCA_RUN_SEND = 1, SHCA_RUN_CONFIGURE = 2 };
struct shca_run {
	int kind;
	struct mp_buf buf;       /* the encoded WRs or calls */
	uint32_t n;
};

/* A QP's send or receive queue in a ring shared with the daemon (wq.c,
 * protocol/wq_ring.py): where it lies in the QP's mapping, its depth and slot size, and
 * the WQEs this process has written (the copy in the ring is what the daemon reads). */
struct shca_wq {
	uint8_t *base;      /* the queue's header, or NULL: its WRs go as requests */
	size_t at;          /* its offset in the mapping */
	uint32_t slots, stride;
	uint64_t prod;
};
struct shca_qp {
	struct verbs_qp vqp;
	uint32_t handle;
	uint32_t max_inline;
	uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge;
	int sq_sig_all;
	pthread_mutex_t post_lock;   /* the bounce pages: ibv_post_send, ibv_wr_start..complete */
	/* the ibv_wr_* API (qp_ex.c): what was built since ibv_wr_start, as runs of one
	 * kind each (send WRs or MKEY configure calls); the open run is wrs/nwrs */
	struct mp_buf wrs;
	uint32_t nwrs;
	int run_kind;            /* SHCA_RUN_SEND or SHCA_RUN_CONFIGURE, 0 before any */
	struct shca_run *runs;   /* the closed runs, in order */
	uint32_t nruns, cap_runs;
	uint32_t batch_sends;    /* send WRs in the whole batch (the bounce pages' bound) */
	int wr_error;
	int wr_open;        /* a builder started a WR that is not in the batch yet */
	int cur_bounced;    /* its SGE is inline data already in the bounce pages */
	struct ibv_send_wr cur;
	struct ibv_sge cur_sge[32];
	/* mlx5dv (dv.c): what mlx5dv_qp_ex_from_ibv_qp_ex hands out, the mlx5dv
	 * send_ops_flags the QP was made with, and the open mlx5dv_wr_mkey_configure's
	 * count of setters announced and called */
	struct mlx5dv_qp_ex dv;
	uint64_t dv_send_ops;
	int cfg_open;
	unsigned cfg_need, cfg_got;
	struct shca_qp *next;    /* the context's QPs */
	struct shca_mr *bounce;  /* registered bytes inline data is copied into */
	uint8_t *bounce_buf;
	size_t bounce_used;
	/* the send and receive rings (wq.c): one mapping holds both */
	struct shca_wq sq, rq;
	uint32_t sq_staged;      /* WQEs of an open ibv_wr_* batch written, not published */
	uint8_t *wq_map;
	size_t wq_bytes;
	pthread_mutex_t recv_lock;   /* one ibv_post_recv of a ring at a time */
};

/* A verbs object's softhca object, as rdma-core's providers reach theirs (rxe's to_rqp,
 * to_rcq): each softhca object embeds its verbs object, and container_of gives the
 * container from the member whatever its place. */
#define shca_container_of(p, type, member) ((type *)((char *)(p) - offsetof(type, member)))

/* struct ibv_context is the last member of struct verbs_context (verbs.h): the
 * extension fields grow before it. */
static inline struct shca_context *to_sctx(struct ibv_context *c)
{
	return shca_container_of(c, struct shca_context, vctx.context);
}

static inline struct shca_pd *to_spd(struct ibv_pd *pd)
{
	return shca_container_of(pd, struct shca_pd, pd);
}

static inline struct shca_ah *to_sah(struct ibv_ah *ah)
{
	return shca_container_of(ah, struct shca_ah, ah);
}

static inline struct shca_mr *to_smr(struct ibv_mr *mr)
{
	return shca_container_of(mr, struct shca_mr, vmr.ibv_mr);
}

static inline struct shca_mw *to_smw(struct ibv_mw *mw)
{
	return shca_container_of(mw, struct shca_mw, mw);
}

static inline struct shca_srq *to_ssrq(struct ibv_srq *srq)
{
	return shca_container_of(srq, struct shca_srq, srq);
}

static inline struct shca_cq *to_scq(struct ibv_cq *cq)
{
	return shca_container_of(cq, struct shca_cq, cq);
}

/* struct verbs_qp holds the QP as struct ibv_qp and, over the same bytes, as struct
 * ibv_qp_ex (a union): the QP of ibv_create_qp and of ibv_create_qp_ex. */
static inline struct shca_qp *to_sqp(struct ibv_qp *qp)
{
	return shca_container_of(qp, struct shca_qp, vqp.qp);
}

static inline struct shca_qp *to_sqp_ex(struct ibv_qp_ex *qpx)
{
	return shca_container_of(qpx, struct shca_qp, vqp.qp_ex);
}

/* conn.c */
int shca_connect(struct shca_conn *c, const char *path, struct shca_context *ctx,
		 struct mp_buf *welcome_out);
void shca_disconnect(struct shca_conn *c);
/* Starts a request: a map of nfields + 2 entries whose "t" and "id" are written. */
void shca_begin(struct shca_conn *c, struct mp_buf *b, const char *verb, uint32_t nfields);
/* Sends it and waits for its reply. 0 with *r filled (free with shca_frame_free) on
 * "ok"; a positive errno on "err" (its message logged) or a lost daemon. */
int shca_call(struct shca_conn *c, struct mp_buf *b, const void *payload, size_t plen,
	      struct shca_frame *r);
/* shca_call of a destroy verb: an EBUSY refusal's message only under SOFTHCA_DEBUG. */
int shca_call_destroy(struct shca_conn *c, struct mp_buf *b, struct shca_frame *r);
/* A post's request (post_send, post_recv, post_srq_recv), its reply freed: on "err",
 * *taken is how many of its WRs the daemon took before the one it refused (0 when the
 * reply names none: the request was refused whole, or the daemon is gone). */
int shca_call_post(struct shca_conn *c, struct mp_buf *b, uint32_t *taken);
int shca_send_oneway(struct shca_conn *c, struct mp_buf *b);
/* Asks the daemon for the context's next asynchronous event (answered when one comes). */
int shca_async_arm(struct shca_conn *c);
/* The n memfds of one registration handed to the daemon under seq (SCM_RIGHTS). */
int shca_hand_over(struct shca_context *ctx, const int *fds, int n, uint32_t seq);
/* The context's kept handoff connection closed (ibv_close_device). */
void shca_hand_over_close(struct shca_context *ctx);
/* The fork generation of this process (0 in the one that loaded the provider). */
unsigned shca_generation(void);
/* EIO, said once per process on stderr naming `verb` and fork, when ctx was opened by
 * this process's parent (a child of fork(2)); 0 otherwise. */
int shca_forked(struct shca_context *ctx, const char *verb);

/* mem.c */
/* The pages of [addr, +length) on memfds, those handed to the daemon under *seq;
 * pieces is the reg_mr_shared request's list of them. */
int shca_mem_share(struct shca_context *ctx, void *addr, size_t length,
		   struct shca_memref *ref, struct mp_buf *pieces, uint64_t *offset,
		   uint32_t *seq);
void shca_mem_release(struct shca_context *ctx, struct shca_memref *ref);
void shca_mem_release_all(struct shca_context *ctx);

/* cq.c: CQs' completion rings shared with the daemon */
/* A ring of slots entries made and handed to the daemon under *seq (0), or an errno
 * when this CQ takes the frame path instead (SOFTHCA_CQ_RING=0, an older daemon, no
 * memfd: said under SOFTHCA_DEBUG). */
int shca_cq_ring_make(struct shca_context *ctx, struct shca_cq_ring *r, uint32_t slots,
		      uint32_t *seq);
void shca_cq_ring_unmap(struct shca_cq_ring *r);
int shca_cq_ring_poll(struct shca_cq *cq, int num, struct ibv_wc *wc);
int shca_cq_channel_hand_over(struct shca_context *ctx, int wfd, uint32_t *seq);
int shca_cq_ring_notify(struct shca_context *ctx, struct shca_cq *cq, int solicited_only);
int shca_cq_ring_resize(struct shca_context *ctx, struct shca_cq *cq, int cqe);
/* A memfd of bytes (rounded up to pages), sealed against shrinking and growing, mapped
 * at *base (*mapped bytes): its fd, or -1 with errno set. */
int shca_ring_memfd(const char *name, size_t bytes, void **base, size_t *mapped);
/* A ring's memfd handed to the daemon under *seq; fd is closed (the mapping stays). */
int shca_ring_hand_over(struct shca_context *ctx, int fd, uint32_t *seq);
/* wq.c: QPs' send and receive rings shared with the daemon */
/* The ring of the queues named (SHCA_WQ_QUEUE_SEND, _RECV) made and handed over under
 * *seq (0), or an errno when the QP's WRs go as requests (said under SOFTHCA_DEBUG). */
int shca_wq_make(struct shca_context *ctx, struct shca_qp *qp, int queues, uint32_t sq_slots,
		 uint32_t rq_slots, uint32_t *seq);
void shca_wq_keep(struct shca_qp *qp, int queues);
void shca_wq_unmap(struct shca_qp *qp);
void shca_wq_reset(struct shca_qp *qp);
int shca_send_wr_shape(const struct shca_qp *qp, const struct ibv_send_wr *wr);
int shca_wq_post_send(struct shca_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int shca_wq_post_recv(struct shca_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
/* ibv_wr_* on a ring: a closed WR written after the batch's (an errno if refused), the
 * batch published at ibv_wr_complete (its errno, EINVAL outside RTS/SQD/ERR). */
int shca_wq_stage(struct shca_qp *qp, const struct ibv_send_wr *wr);
int shca_wq_commit(struct shca_qp *qp);

/* qp_ex.c */
void shca_qp_ex_init(struct shca_qp *qp, uint64_t send_ops_flags);

/* dv.c, dv_keys.c: mlx5dv. The objects the application sees as mlx5dv.h's (an MKEY's
 * lkey and rkey; DEKs and login objects only as pointers, declared incomplete there). */

struct shca_mkey {
	struct mlx5dv_mkey dv;   /* what the application sees: lkey, rkey */
	struct shca_context *ctx;
	uint32_t handle;
};

struct mlx5dv_dek {
	struct shca_context *ctx;
	uint32_t handle;
};

struct mlx5dv_crypto_login_obj {
	struct shca_context *ctx;
	uint32_t handle;
};

static inline struct shca_mkey *shca_to_mkey(struct mlx5dv_mkey *m)
{
	return shca_container_of(m, struct shca_mkey, dv);
}

/* dv.c */
void shca_dv_qp_init(struct shca_qp *qp);
extern const struct softhca_mlx5dv_ops softhca_mlx5dv_ops;

/* dv_keys.c: the calls of softhca_mlx5dv_ops on MKEYs, caps, crypto login and DEKs */
struct mlx5dv_mkey *shca_dv_create_mkey(struct mlx5dv_mkey_init_attr *attr);
int shca_dv_destroy_mkey(struct mlx5dv_mkey *mkey);
int shca_dv_mkey_check(struct mlx5dv_mkey *mkey, struct mlx5dv_mkey_err *err_info,
		       size_t err_info_size);
int shca_dv_query_device(struct ibv_context *context, struct mlx5dv_context *attrs);
int shca_dv_crypto_login(struct ibv_context *context, struct mlx5dv_crypto_login_attr *a);
int shca_dv_crypto_login_query_state(struct ibv_context *context,
				     enum mlx5dv_crypto_login_state *state);
int shca_dv_crypto_logout(struct ibv_context *context);
struct mlx5dv_crypto_login_obj *shca_dv_crypto_login_create(
	struct ibv_context *context, struct mlx5dv_crypto_login_attr_ex *a);
int shca_dv_crypto_login_query(struct mlx5dv_crypto_login_obj *o,
			       struct mlx5dv_crypto_login_query_attr *q);
int shca_dv_crypto_login_destroy(struct mlx5dv_crypto_login_obj *o);
struct mlx5dv_dek *shca_dv_dek_create(struct ibv_context *context,
				      struct mlx5dv_dek_init_attr *a);
int shca_dv_dek_query(struct mlx5dv_dek *dek, struct mlx5dv_dek_attr *attr);
int shca_dv_dek_destroy(struct mlx5dv_dek *dek);

/* qp.c */
struct ibv_qp *shca_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
/* mlx5dv_create_qp: ibv_create_qp_ex with mlx5dv's send_ops_flags and create_flags. */
struct ibv_qp *shca_dv_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *qp_attr,
				 struct mlx5dv_qp_init_attr *dv);
struct ibv_qp *shca_create_qp_ex(struct ibv_context *ibctx, struct ibv_qp_init_attr_ex *ax);
int shca_destroy_qp(struct ibv_qp *ibqp);
int shca_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask);
int shca_av_dest(struct shca_context *ctx, const struct ibv_ah_attr *ah, char *host,
		 size_t hlen, unsigned *port, const char **dev, const char *verb);
int shca_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask,
		  struct ibv_qp_init_attr *init);
int shca_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int shca_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
/* ah.c */
struct ibv_ah *shca_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr);
int shca_destroy_ah(struct ibv_ah *ah);

/* verbs.c */
bool shca_owns_device(struct ibv_device *device);
bool shca_owns(struct ibv_context *context);
int shca_get_u32(struct shca_frame *r, const char *key, uint32_t *out);
struct ibv_srq *shca_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr);
int shca_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask);
int shca_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr);
int shca_destroy_srq(struct ibv_srq *srq);
int shca_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int shca_call_simple(struct shca_context *ctx, const char *verb, const char *key,
		     uint32_t handle);

/* ibv_destroy_qp, _srq and _cq's common part: the daemon destroys obj (verb, its handle
 * under key), then obj comes off the context's list *head (linked through ->next, under
 * conn.lock). Evaluates to 0 or the daemon's errno; on 0 the caller frees obj. A macro,
 * not a function: each list is of its own type. */
#define SHCA_DESTROY_LISTED(ctx, verb, key, head, obj) __extension__ ({		\
	int rc_ = shca_call_simple((ctx), (verb), (key), (obj)->handle);		\
	__typeof__(obj) *pp_;								\
											\
	if (!rc_) {									\
		pthread_mutex_lock(&(ctx)->conn->core.lock);					\
		for (pp_ = (head); *pp_; pp_ = &(*pp_)->next) {			\
			if (*pp_ == (obj)) {						\
				*pp_ = (obj)->next;					\
				break;							\
			}								\
		}									\
		pthread_mutex_unlock(&(ctx)->conn->core.lock);				\
	}										\
	rc_;										\
})
struct ibv_mw *shca_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int shca_dealloc_mw(struct ibv_mw *mw);
int shca_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind);
int shca_rereg_mr(struct verbs_mr *vmr, int flags, struct ibv_pd *pd, void *addr,
		  size_t length, int access);
int shca_resize_cq(struct ibv_cq *cq, int cqe);
struct ibv_mr *shca_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
			   int access);
int shca_dereg(struct shca_mr *mr);

#define shca_log(fmt, ...) fprintf(stderr, "softhca: " fmt "\n", ##__VA_ARGS__)

/* A line only SOFTHCA_DEBUG (set, not "0") asks for: what a kernel device keeps to its
 * debug log (mlx5's mlx5_ib_dbg, rxe's rxe_dbg), such as a cap beyond the device's that
 * programs probe for by trial (libfabric's verbs provider finds max_inline_data by
 * creating QPs with ever larger values until one fails). */
static inline int shca_debugging(void)
{
	const char *v = getenv("SOFTHCA_DEBUG");

	return v && *v && strcmp(v, "0") != 0;
}
#define shca_debug(fmt, ...)						\
	do {								\
		if (shca_debugging())					\
			shca_log(fmt, ##__VA_ARGS__);			\
	} while (0)

#endif
