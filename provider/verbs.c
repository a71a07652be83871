/* The provider's verbs: each libibverbs op is one control request to the local
 * daemon (docs/protocol.md), except poll_cq, which reads the CQ's ring of pushed
 * completions. The device, its port and GID come from the sysfs tree `softhca run`
 * prepares; libibverbs reads them itself. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "softhca.h"

#define DEFAULT_SOCKET "/run/softhca/softhca.sock"
/* What a QP offers for IBV_SEND_INLINE when asked for less (ibv_create_qp(3): the
 * provider may return more than requested); ConnectX's own figure for RC. */
#define DEFAULT_INLINE 236
#define MAX_INLINE 1024
#define MAX_WRS_PER_POST 256
#define MAX_SGE 32
/* How long an empty poll_cq waits for a completion to arrive before returning 0. */
#define EMPTY_POLL_WAIT_NS 200000L

/* -- small helpers ----------------------------------------------------------------- */

static int get_u32(struct shca_reply *r, const char *key, uint32_t *out)
{
	uint64_t v;

	if (!mp_find_uint(r->hdr, key, &v) || v > UINT32_MAX)
		return EPROTO;
	*out = (uint32_t)v;
	return 0;
}

/* A request whose reply carries nothing the caller needs. */
static int call_simple(struct shca_context *ctx, const char *verb, const char *key,
		       uint32_t handle)
{
	struct mp_buf b;
	struct shca_reply r;
	int rc;

	shca_begin(&ctx->conn, &b, verb, 1);
	mp_kv_uint(&b, key, handle);
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (!rc)
		shca_reply_free(&r);
	return rc;
}

/* -- device and context ---------------------------------------------------------- */

static void parse_welcome(struct shca_context *ctx, struct mp_buf *w)
{
	struct mp_val hdr = {w->p, w->p + w->len}, v, e;
	const char *s;
	uint32_t n, i, len;

	if (mp_find(hdr, "devices", &v) && mp_get_arr(v, &n, &e)) {
		for (i = 0; i < n && i < SHCA_MAX_DEVICES; i++) {
			if (mp_get_str(e, &s, &len) && len < SHCA_NAME_MAX) {
				memcpy(ctx->devices[i], s, len);
				ctx->devices[i][len] = 0;
				ctx->ndevices = (int)i + 1;
			}
			if (!mp_next(&e))
				break;
		}
	}
	if (mp_find(hdr, "address", &v) && mp_get_str(v, &s, &len) &&
	    len < sizeof(ctx->address)) {
		memcpy(ctx->address, s, len);
		ctx->address[len] = 0;
	}
}

static void attr_from_reply(struct shca_context *ctx, struct mp_val a)
{
	struct ibv_device_attr *d = &ctx->attr;
	struct mp_val v;
	uint64_t x;
	const char *s;
	uint32_t n;

	memset(d, 0, sizeof(*d));
	if (mp_find(a, "fw_ver", &v) && mp_get_str(v, &s, &n) && n < sizeof(d->fw_ver))
		memcpy(d->fw_ver, s, n);
#define U(field, key) if (mp_find_uint(a, key, &x)) d->field = x
	U(vendor_id, "vendor_id");
	U(vendor_part_id, "vendor_part_id");
	U(max_qp, "max_qp");
	U(max_qp_wr, "max_qp_wr");
	U(max_sge, "max_sge");
	U(max_cqe, "max_cqe");
	U(max_mr_size, "max_mr_size");
	U(max_pd, "max_pd");
	U(max_qp_rd_atom, "max_qp_rd_atom");
	U(phys_port_cnt, "phys_port_cnt");
#undef U
	if (mp_find_uint(a, "node_guid", &x)) {
		d->node_guid = htobe64(x);
		d->sys_image_guid = htobe64(x);
	}
	if (mp_find_uint(a, "max_msg_sz", &x))
		ctx->max_msg_sz = x;
	d->max_sge_rd = d->max_sge;
	d->max_cq = 1 << 16;
	d->max_mr = 1 << 16;
	d->max_qp_init_rd_atom = d->max_qp_rd_atom;
	d->max_res_rd_atom = d->max_qp_rd_atom * d->max_qp;
	d->page_size_cap = 0xfffff000;
	d->atomic_cap = IBV_ATOMIC_HCA;
	d->max_pkeys = 1;
	d->local_ca_ack_delay = 16;
	d->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT |
			      IBV_DEVICE_SYS_IMAGE_GUID;
}

static int open_device(struct shca_context *ctx, const char *name)
{
	struct mp_buf b;
	struct shca_reply r;
	struct mp_val a;
	int rc;

	shca_begin(&ctx->conn, &b, "open_device", 1);
	mp_str(&b, "name");
	mp_str(&b, name);
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	rc = get_u32(&r, "ctx", &ctx->handle);
	shca_reply_free(&r);
	if (rc)
		return rc;
	shca_begin(&ctx->conn, &b, "query_device", 1);
	mp_kv_uint(&b, "ctx", ctx->handle);
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	if (mp_find(r.hdr, "attr", &a))
		attr_from_reply(ctx, a);
	shca_reply_free(&r);
	return 0;
}

static const struct verbs_context_ops shca_ops;

static struct verbs_context *shca_alloc_context(struct ibv_device *ibdev, int cmd_fd,
						void *private_data)
{
	struct shca_context *ctx;
	const char *path = getenv("SOFTHCA_SOCKET");
	struct mp_buf welcome;
	int rc, sv[2];

	(void)private_data;
	ctx = _verbs_init_and_alloc_context(ibdev, cmd_fd, sizeof(*ctx),
					    (struct verbs_context *)offsetof(struct shca_context,
									     vctx), 0);
	if (!ctx)
		return NULL;
	pthread_mutex_init(&ctx->mem_lock, NULL);
	ctx->async_pipe[0] = ctx->async_pipe[1] = -1;
	rc = shca_connect(&ctx->conn, path && *path ? path : DEFAULT_SOCKET, ctx, &welcome);
	if (rc)
		goto fail;
	parse_welcome(ctx, &welcome);
	mp_free(&welcome);
	rc = open_device(ctx, ibdev->name);
	if (rc) {
		shca_disconnect(&ctx->conn);
		goto fail;
	}
	/* libibverbs asks the kernel for an async event fd unless the provider set one;
	 * there is no kernel here, so the provider's own socket pair is it. */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0) {
		fcntl(sv[1], F_SETFL, O_NONBLOCK);
		ctx->async_pipe[0] = sv[0];
		ctx->async_pipe[1] = sv[1];
		ctx->vctx.context.async_fd = sv[0];
		/* The daemon answers this wait with the context's next event. */
		shca_async_arm(&ctx->conn);
	}
	verbs_set_ops(&ctx->vctx, &shca_ops);
	return &ctx->vctx;
fail:
	errno = rc;
	verbs_uninit_context(&ctx->vctx);
	free(ctx);
	return NULL;
}

static void shca_free_context(struct ibv_context *ibctx)
{
	struct shca_context *ctx = to_sctx(ibctx);
	struct shca_cq *cq;

	call_simple(ctx, "close_device", "ctx", ctx->handle);
	shca_disconnect(&ctx->conn);
	shca_mem_release_all(ctx);
	for (cq = ctx->cqs; cq; cq = cq->next)
		if (cq->chan_wfd >= 0)
			cq->chan_wfd = -1;
	if (ctx->async_pipe[1] >= 0)
		close(ctx->async_pipe[1]);
	/* async_pipe[0] is the context's async_fd; libibverbs closes it */
	verbs_uninit_context(&ctx->vctx);
	free(ctx);
}

static int shca_query_device_ex(struct ibv_context *ibctx,
				const struct ibv_query_device_ex_input *input,
				struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct shca_context *ctx = to_sctx(ibctx);
	size_t n = attr_size < sizeof(ctx->attr) ? attr_size : sizeof(ctx->attr);

	(void)input;
	memset(attr, 0, attr_size);
	memcpy(&attr->orig_attr, &ctx->attr, n);
	return 0;
}

static int shca_query_port(struct ibv_context *ibctx, uint8_t port,
			   struct ibv_port_attr *pa)
{
	struct shca_context *ctx = to_sctx(ibctx);

	if (port != 1)
		return EINVAL;
	memset(pa, 0, sizeof(*pa));
	pa->state = IBV_PORT_ACTIVE;
	pa->max_mtu = IBV_MTU_4096;
	pa->active_mtu = IBV_MTU_4096;
	pa->gid_tbl_len = 1;
	pa->port_cap_flags = 0;
	pa->max_msg_sz = ctx->max_msg_sz ? (uint32_t)ctx->max_msg_sz : 1u << 30;
	pa->pkey_tbl_len = 1;
	pa->active_width = 2;   /* 4X */
	pa->active_speed = 32;  /* EDR */
	pa->phys_state = 5;     /* LinkUp */
	pa->link_layer = IBV_LINK_LAYER_ETHERNET;
	return 0;
}

static void shca_async_event(struct ibv_context *ibctx, struct ibv_async_event *event)
{
	(void)ibctx;
	(void)event;
}

/* -- PD and MR -------------------------------------------------------------------- */

static struct ibv_pd *shca_alloc_pd(struct ibv_context *ibctx)
{
	struct shca_context *ctx = to_sctx(ibctx);
	struct shca_pd *pd = calloc(1, sizeof(*pd));
	struct mp_buf b;
	struct shca_reply r;
	int rc;

	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	shca_begin(&ctx->conn, &b, "alloc_pd", 1);
	mp_kv_uint(&b, "ctx", ctx->handle);
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = get_u32(&r, "pd", &pd->handle);
		shca_reply_free(&r);
	}
	if (rc) {
		free(pd);
		errno = rc;
		return NULL;
	}
	pd->pd.context = ibctx;
	pd->pd.handle = pd->handle;
	return &pd->pd;
}

static int shca_dealloc_pd(struct ibv_pd *ibpd)
{
	struct shca_pd *pd = (struct shca_pd *)ibpd;
	int rc = call_simple(to_sctx(ibpd->context), "dealloc_pd", "pd", pd->handle);

	if (!rc)
		free(pd);
	return rc;
}

struct ibv_mr *shca_reg_mr(struct ibv_pd *ibpd, void *addr, size_t length, uint64_t iova,
			   int access)
{
	struct shca_context *ctx = to_sctx(ibpd->context);
	struct shca_pd *pd = (struct shca_pd *)ibpd;
	struct shca_mr *mr = calloc(1, sizeof(*mr));
	struct mp_buf b;
	struct shca_reply r;
	struct mp_buf pieces;
	uint64_t offset;
	int rc;

	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	mp_init(&pieces);
	rc = shca_mem_share(ctx, addr, length, &mr->mem, &pieces, &offset);
	if (rc) {
		mp_free(&pieces);
		free(mr);
		errno = rc;
		return NULL;
	}
	shca_begin(&ctx->conn, &b, "reg_mr_shared", 6);
	mp_kv_uint(&b, "pd", pd->handle);
	mp_kv_uint(&b, "addr", iova);
	mp_kv_uint(&b, "length", length);
	mp_kv_uint(&b, "access", (uint32_t)access);
	mp_kv_uint(&b, "offset", offset);
	mp_str(&b, "pieces");
	mp_raw(&b, pieces.p, pieces.len);
	b.failed |= pieces.failed;
	mp_free(&pieces);
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = get_u32(&r, "mr", &mr->handle);
		if (!rc)
			rc = get_u32(&r, "lkey", &mr->vmr.ibv_mr.lkey);
		if (!rc)
			rc = get_u32(&r, "rkey", &mr->vmr.ibv_mr.rkey);
		shca_reply_free(&r);
	}
	if (rc) {
		shca_mem_release(ctx, &mr->mem);
		free(mr);
		errno = rc;
		return NULL;
	}
	mr->vmr.ibv_mr.context = ibpd->context;
	mr->vmr.ibv_mr.pd = ibpd;
	mr->vmr.ibv_mr.addr = addr;
	mr->vmr.ibv_mr.length = length;
	mr->vmr.ibv_mr.handle = mr->handle;
	mr->vmr.mr_type = VERBS_MR_TYPE_MR;
	mr->vmr.access = access;
	return &mr->vmr.ibv_mr;
}

int shca_dereg(struct shca_mr *mr)
{
	struct shca_context *ctx = to_sctx(mr->vmr.ibv_mr.context);
	int rc = call_simple(ctx, "dereg_mr", "mr", mr->handle);

	if (rc)
		return rc;
	shca_mem_release(ctx, &mr->mem);
	free(mr);
	return 0;
}

static int shca_dereg_mr(struct verbs_mr *vmr)
{
	return shca_dereg((struct shca_mr *)vmr);
}

/* -- CQ --------------------------------------------------------------------------- */

/* The channel's fd: libibverbs' ibv_create_comp_channel asks the kernel for it and,
 * with no kernel, is left with a number that is not a channel. The first CQ bound to
 * the channel gives it a socket pair; ibv_get_cq_event reads CQ pointers from it and
 * ibv_destroy_comp_channel closes it. */
struct chan {
	struct ibv_comp_channel *ch;
	int wfd;
	struct chan *next;
};
static struct chan *chans;
static pthread_mutex_t chans_lock = PTHREAD_MUTEX_INITIALIZER;

static int channel_wfd(struct ibv_comp_channel *ch)
{
	struct chan *c;
	int sv[2], wfd = -1;

	pthread_mutex_lock(&chans_lock);
	for (c = chans; c; c = c->next)
		if (c->ch == ch)
			break;
	if (c) {
		wfd = c->wfd;
	} else if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0) {
		c = calloc(1, sizeof(*c));
		if (c) {
			fcntl(sv[1], F_SETFL, O_NONBLOCK);
			c->ch = ch;
			c->wfd = wfd = sv[1];
			c->next = chans;
			chans = c;
			ch->fd = sv[0];
		} else {
			close(sv[0]);
			close(sv[1]);
		}
	}
	pthread_mutex_unlock(&chans_lock);
	return wfd;
}

static struct ibv_cq *shca_create_cq(struct ibv_context *ibctx, int cqe,
				     struct ibv_comp_channel *channel, int comp_vector)
{
	struct shca_context *ctx = to_sctx(ibctx);
	struct shca_cq *cq = calloc(1, sizeof(*cq));
	struct mp_buf b;
	struct shca_reply r;
	int rc;

	(void)comp_vector;
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	if (cqe <= 0 || (uint32_t)cqe > (uint32_t)ctx->attr.max_cqe) {
		shca_log("ibv_create_cq: EINVAL: cqe %d is outside [1, max_cqe %d]", cqe,
			 ctx->attr.max_cqe);
		free(cq);
		errno = EINVAL;
		return NULL;
	}
	cq->chan_wfd = -1;
	cq->cap = (uint32_t)cqe;
	cq->ring = calloc(cq->cap, sizeof(*cq->ring));
	if (!cq->ring) {
		free(cq);
		errno = ENOMEM;
		return NULL;
	}
	shca_begin(&ctx->conn, &b, "create_cq", 3);
	mp_kv_uint(&b, "ctx", ctx->handle);
	mp_kv_uint(&b, "cqe", (uint32_t)cqe);
	mp_str(&b, "push");
	mp_bool(&b, true);
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = get_u32(&r, "cq", &cq->handle);
		shca_reply_free(&r);
	}
	if (!rc && channel) {
		cq->chan_wfd = channel_wfd(channel);
		if (cq->chan_wfd < 0) {
			call_simple(ctx, "destroy_cq", "cq", cq->handle);
			rc = EMFILE;
		}
	}
	if (rc) {
		free(cq->ring);
		free(cq);
		errno = rc;
		return NULL;
	}
	cq->cq.context = ibctx;
	cq->cq.cqe = cqe;
	cq->cq.handle = cq->handle;
	pthread_mutex_lock(&ctx->conn.lock);
	cq->next = ctx->cqs;
	ctx->cqs = cq;
	pthread_mutex_unlock(&ctx->conn.lock);
	return &cq->cq;
}

static int shca_destroy_cq(struct ibv_cq *ibcq)
{
	struct shca_context *ctx = to_sctx(ibcq->context);
	struct shca_cq *cq = (struct shca_cq *)ibcq, **pp;
	int rc = call_simple(ctx, "destroy_cq", "cq", cq->handle);

	if (rc)
		return rc;
	pthread_mutex_lock(&ctx->conn.lock);
	for (pp = &ctx->cqs; *pp; pp = &(*pp)->next) {
		if (*pp == cq) {
			*pp = cq->next;
			break;
		}
	}
	pthread_mutex_unlock(&ctx->conn.lock);
	free(cq->ring);
	free(cq);
	return 0;
}

static int shca_poll_cq(struct ibv_cq *ibcq, int num, struct ibv_wc *wc)
{
	struct shca_context *ctx = to_sctx(ibcq->context);
	struct shca_cq *cq = (struct shca_cq *)ibcq;
	struct mp_buf b;
	int n = 0;

	if (num <= 0)
		return 0;
	pthread_mutex_lock(&ctx->conn.lock);
	if (!cq->count) {
		/* The device is a process on the same CPUs: a program that spins on an
		 * empty CQ takes the time the daemon needs to complete its work. An empty
		 * poll waits a moment for the reader thread's next completion instead. */
		struct timespec until;

		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += EMPTY_POLL_WAIT_NS;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&ctx->conn.wc_cond, &ctx->conn.lock, &until);
	}
	while (n < num && cq->count) {
		wc[n++] = cq->ring[cq->head];
		cq->head = (cq->head + 1) % cq->cap;
		cq->count--;
	}
	pthread_mutex_unlock(&ctx->conn.lock);
	if (n) {
		/* The room goes back at once: the daemon counts every entry it pushed and
		 * the program has not polled against cqe, as the CQ's overrun rule says. */
		mp_init(&b);
		mp_map(&b, 3);
		mp_str(&b, "t");
		mp_str(&b, "cq_credit");
		mp_kv_uint(&b, "id", 0);
		mp_str(&b, "credits");
		mp_arr(&b, 1);
		mp_arr(&b, 2);
		mp_uint(&b, cq->handle);
		mp_uint(&b, (uint64_t)n);
		shca_send_oneway(&ctx->conn, &b);
	}
	return n;
}

static int shca_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct shca_context *ctx = to_sctx(ibcq->context);
	struct shca_cq *cq = (struct shca_cq *)ibcq;

	/* Solicited-only arming notifies on any completion: more events than asked
	 * for, which ibv_req_notify_cq(3) allows a consumer to see (it polls anyway). */
	(void)solicited_only;
	pthread_mutex_lock(&ctx->conn.lock);
	cq->armed = 1;
	pthread_mutex_unlock(&ctx->conn.lock);
	return 0;
}

static void shca_cq_event(struct ibv_cq *cq)
{
	(void)cq;
}

/* -- QP --------------------------------------------------------------------------- */

static struct ibv_qp *create_qp(struct ibv_context *ibctx, struct ibv_pd *ibpd,
				struct ibv_qp_init_attr *attr, uint64_t send_ops_flags,
				int extended)
{
	struct shca_context *ctx = to_sctx(ibctx);
	struct shca_qp *qp;
	struct mp_buf b;
	struct shca_reply r;
	uint32_t inl = attr->cap.max_inline_data, qpn = 0;
	int rc;

	if (attr->srq) {
		shca_log("ibv_create_qp: EOPNOTSUPP: shared receive queues are not modelled");
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (inl > MAX_INLINE) {
		shca_log("ibv_create_qp: EINVAL: max_inline_data %u exceeds the device's %d",
			 inl, MAX_INLINE);
		errno = EINVAL;
		return NULL;
	}
	if (inl < DEFAULT_INLINE)
		inl = DEFAULT_INLINE;
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	shca_begin(&ctx->conn, &b, "create_qp", 11);
	mp_kv_uint(&b, "pd", ((struct shca_pd *)ibpd)->handle);
	mp_kv_uint(&b, "scq", ((struct shca_cq *)attr->send_cq)->handle);
	mp_kv_uint(&b, "rcq", ((struct shca_cq *)attr->recv_cq)->handle);
	mp_kv_uint(&b, "qp_type", attr->qp_type);
	mp_kv_uint(&b, "max_send_wr", attr->cap.max_send_wr ? attr->cap.max_send_wr : 1);
	mp_kv_uint(&b, "max_recv_wr", attr->cap.max_recv_wr ? attr->cap.max_recv_wr : 1);
	mp_kv_uint(&b, "max_send_sge", attr->cap.max_send_sge);
	mp_kv_uint(&b, "max_recv_sge", attr->cap.max_recv_sge);
	mp_kv_uint(&b, "max_inline_data", inl);
	mp_str(&b, "sq_sig_all");
	mp_bool(&b, attr->sq_sig_all != 0);
	mp_kv_uint(&b, "send_ops_flags", send_ops_flags);
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = get_u32(&r, "qp", &qp->handle);
		if (!rc)
			rc = get_u32(&r, "qp_num", &qpn);
		shca_reply_free(&r);
	}
	if (rc) {
		free(qp);
		errno = rc;
		return NULL;
	}
	attr->cap.max_inline_data = inl;
	qp->max_inline = inl;
	qp->max_send_wr = attr->cap.max_send_wr;
	qp->max_recv_wr = attr->cap.max_recv_wr;
	qp->max_send_sge = attr->cap.max_send_sge;
	qp->max_recv_sge = attr->cap.max_recv_sge;
	qp->sq_sig_all = attr->sq_sig_all;
	qp->vqp.qp.context = ibctx;
	qp->vqp.qp.qp_context = attr->qp_context;
	qp->vqp.qp.pd = ibpd;
	qp->vqp.qp.send_cq = attr->send_cq;
	qp->vqp.qp.recv_cq = attr->recv_cq;
	qp->vqp.qp.srq = NULL;
	qp->vqp.qp.handle = qp->handle;
	qp->vqp.qp.qp_num = qpn;
	qp->vqp.qp.state = IBV_QPS_RESET;
	qp->vqp.qp.qp_type = attr->qp_type;
	pthread_mutex_init(&qp->vqp.qp.mutex, NULL);
	pthread_cond_init(&qp->vqp.qp.cond, NULL);
	if (extended) {
		qp->vqp.comp_mask |= VERBS_QP_EX;
		shca_qp_ex_init(qp, send_ops_flags);
	}
	pthread_mutex_lock(&ctx->conn.lock);
	qp->next = ctx->qps;
	ctx->qps = qp;
	pthread_mutex_unlock(&ctx->conn.lock);
	return &qp->vqp.qp;
}

static struct ibv_qp *shca_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	return create_qp(pd->context, pd, attr, 0, 0);
}

static struct ibv_qp *shca_create_qp_ex(struct ibv_context *ibctx,
					struct ibv_qp_init_attr_ex *ax)
{
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp;
	uint64_t ops = 0;

	if (!(ax->comp_mask & IBV_QP_INIT_ATTR_PD)) {
		errno = EINVAL;
		return NULL;
	}
	if (ax->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) {
		shca_log("ibv_create_qp_ex: EOPNOTSUPP: comp_mask %#x names attributes that "
			 "are not modelled", ax->comp_mask);
		errno = EOPNOTSUPP;
		return NULL;
	}
	memset(&a, 0, sizeof(a));
	a.qp_context = ax->qp_context;
	a.send_cq = ax->send_cq;
	a.recv_cq = ax->recv_cq;
	a.srq = ax->srq;
	a.cap = ax->cap;
	a.qp_type = ax->qp_type;
	a.sq_sig_all = ax->sq_sig_all;
	if (ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
		ops = ax->send_ops_flags;
	qp = create_qp(ibctx, ax->pd, &a, ops, (ax->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
		       != 0);
	if (qp)
		ax->cap = a.cap;
	return qp;
}

static int shca_destroy_qp(struct ibv_qp *ibqp)
{
	struct shca_context *ctx = to_sctx(ibqp->context);
	struct shca_qp *qp = (struct shca_qp *)ibqp, **pp;
	int rc = call_simple(ctx, "destroy_qp", "qp", qp->handle);

	if (rc)
		return rc;
	pthread_mutex_lock(&ctx->conn.lock);
	for (pp = &ctx->qps; *pp; pp = &(*pp)->next) {
		if (*pp == qp) {
			*pp = qp->next;
			break;
		}
	}
	pthread_mutex_unlock(&ctx->conn.lock);
	if (qp->bounce)
		shca_dereg(qp->bounce);
	free(qp->bounce_buf);
	mp_free(&qp->wrs);
	free(qp);
	return 0;
}

/* The address vector's dgid is a softhca GID, fe80::<IPv4>:<port>:<device index>: the
 * daemon and device the peer QP lives on (the address resolution RoCE does with ARP
 * or ND, done here by decoding). */
static int av_dest(struct shca_context *ctx, const struct ibv_ah_attr *ah, char *host,
		   size_t hlen, unsigned *port, const char **dev)
{
	const uint8_t *g = ah->grh.dgid.raw;
	unsigned idx;
	int i;

	if (!ah->is_global) {
		shca_log("ibv_modify_qp: EINVAL: a RoCE address vector needs a GRH (is_global "
			 "1 and a dgid; ibv_rc_pingpong: -g 0)");
		return EINVAL;
	}
	for (i = 0; i < 8; i++) {
		if (g[i] != (i == 0 ? 0xfe : i == 1 ? 0x80 : 0)) {
			shca_log("ibv_modify_qp: EINVAL: dgid is not a softhca GID (fe80::<IPv4>:"
				 "<port>:<device>): no daemon is reachable through it");
			return EINVAL;
		}
	}
	snprintf(host, hlen, "%u.%u.%u.%u", g[8], g[9], g[10], g[11]);
	*port = (unsigned)g[12] << 8 | g[13];
	idx = (unsigned)g[14] << 8 | g[15];
	/* Daemons name their devices alike (mlx5_0, ...): index i of the peer is the
	 * device this daemon lists at i. */
	if ((int)idx >= ctx->ndevices) {
		shca_log("ibv_modify_qp: EINVAL: dgid names device %u; the daemon has %d", idx,
			 ctx->ndevices);
		return EINVAL;
	}
	*dev = ctx->devices[idx];
	return 0;
}

struct qp_field {
	int bit;
	const char *name;
	size_t off;
	size_t size;
};

#define F(bit, name, member) {bit, name, offsetof(struct ibv_qp_attr, member), \
			      sizeof(((struct ibv_qp_attr *)0)->member)}
static const struct qp_field qp_fields[] = {
	F(IBV_QP_STATE, "qp_state", qp_state),
	F(IBV_QP_EN_SQD_ASYNC_NOTIFY, "en_sqd_async_notify", en_sqd_async_notify),
	F(IBV_QP_ACCESS_FLAGS, "qp_access_flags", qp_access_flags),
	F(IBV_QP_PATH_MTU, "path_mtu", path_mtu),
	F(IBV_QP_TIMEOUT, "timeout", timeout),
	F(IBV_QP_RETRY_CNT, "retry_cnt", retry_cnt),
	F(IBV_QP_RNR_RETRY, "rnr_retry", rnr_retry),
	F(IBV_QP_RQ_PSN, "rq_psn", rq_psn),
	F(IBV_QP_MAX_QP_RD_ATOMIC, "max_rd_atomic", max_rd_atomic),
	F(IBV_QP_MIN_RNR_TIMER, "min_rnr_timer", min_rnr_timer),
	F(IBV_QP_SQ_PSN, "sq_psn", sq_psn),
	F(IBV_QP_MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic", max_dest_rd_atomic),
	F(IBV_QP_DEST_QPN, "dest_qp_num", dest_qp_num),
};
#undef F

static uint64_t field_value(const struct ibv_qp_attr *a, const struct qp_field *f)
{
	const uint8_t *p = (const uint8_t *)a + f->off;

	switch (f->size) {
	case 1: return *p;
	case 2: return *(const uint16_t *)p;
	case 4: return *(const uint32_t *)p;
	default: return 0;
	}
}

static int shca_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	struct shca_context *ctx = to_sctx(ibqp->context);
	struct shca_qp *qp = (struct shca_qp *)ibqp;
	/* The port, the P_Key index and the current state the caller asserts are
	 * checked here: the device has one port and one P_Key. */
	const int local = IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_CUR_STATE;
	char host[32];
	unsigned port = 0;
	const char *dev = NULL;
	struct mp_buf b;
	struct shca_reply r;
	uint32_t n = 0, state;
	size_t i;
	int rc;

	if ((mask & IBV_QP_PORT) && attr->port_num != 1) {
		shca_log("ibv_modify_qp: EINVAL: port %u does not exist (the device has port 1)",
			 attr->port_num);
		return EINVAL;
	}
	if ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0) {
		shca_log("ibv_modify_qp: EINVAL: P_Key index %u is outside the one-entry table",
			 attr->pkey_index);
		return EINVAL;
	}
	if (mask & IBV_QP_AV) {
		rc = av_dest(ctx, &attr->ah_attr, host, sizeof(host), &port, &dev);
		if (rc)
			return rc;
		n += 3;
	}
	for (i = 0; i < sizeof(qp_fields) / sizeof(qp_fields[0]); i++)
		if (mask & qp_fields[i].bit)
			n++;
	shca_begin(&ctx->conn, &b, "modify_qp", 3);
	mp_kv_uint(&b, "qp", qp->handle);
	mp_kv_uint(&b, "mask", (uint32_t)(mask & ~local));
	mp_str(&b, "attr");
	mp_map(&b, n);
	for (i = 0; i < sizeof(qp_fields) / sizeof(qp_fields[0]); i++)
		if (mask & qp_fields[i].bit)
			mp_kv_uint(&b, qp_fields[i].name, field_value(attr, &qp_fields[i]));
	if (mask & IBV_QP_AV) {
		mp_str(&b, "dest_host");
		mp_str(&b, host);
		mp_kv_uint(&b, "dest_port", port);
		mp_str(&b, "dest_dev");
		mp_str(&b, dev);
	}
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	if (!get_u32(&r, "state", &state))
		ibqp->state = (enum ibv_qp_state)state;
	shca_reply_free(&r);
	return 0;
}

static int shca_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask,
			 struct ibv_qp_init_attr *init)
{
	struct shca_context *ctx = to_sctx(ibqp->context);
	struct shca_qp *qp = (struct shca_qp *)ibqp;
	struct mp_buf b;
	struct shca_reply r;
	struct mp_val a;
	uint64_t v;
	int rc;

	(void)mask;
	shca_begin(&ctx->conn, &b, "query_qp", 1);
	mp_kv_uint(&b, "qp", qp->handle);
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	memset(attr, 0, sizeof(*attr));
	memset(init, 0, sizeof(*init));
	if (mp_find(r.hdr, "attr", &a)) {
		if (mp_find_uint(a, "qp_state", &v))
			attr->qp_state = attr->cur_qp_state = (enum ibv_qp_state)v;
		if (mp_find_uint(a, "path_mtu", &v))
			attr->path_mtu = (enum ibv_mtu)v;
		if (mp_find_uint(a, "dest_qp_num", &v))
			attr->dest_qp_num = (uint32_t)v;
		if (mp_find_uint(a, "timeout", &v))
			attr->timeout = (uint8_t)v;
		if (mp_find_uint(a, "retry_cnt", &v))
			attr->retry_cnt = (uint8_t)v;
		if (mp_find_uint(a, "rnr_retry", &v))
			attr->rnr_retry = (uint8_t)v;
	}
	shca_reply_free(&r);
	attr->port_num = 1;
	attr->cap.max_send_wr = qp->max_send_wr;
	attr->cap.max_recv_wr = qp->max_recv_wr;
	attr->cap.max_send_sge = qp->max_send_sge;
	attr->cap.max_recv_sge = qp->max_recv_sge;
	attr->cap.max_inline_data = qp->max_inline;
	init->qp_context = ibqp->qp_context;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->cap = attr->cap;
	init->qp_type = ibqp->qp_type;
	init->sq_sig_all = qp->sq_sig_all;
	return 0;
}

static void encode_sges(struct mp_buf *b, const struct ibv_sge *sg, int n)
{
	int i;

	mp_str(b, "sg");
	mp_arr(b, (uint32_t)n);
	for (i = 0; i < n; i++) {
		mp_arr(b, 3);
		mp_uint(b, sg[i].addr);
		mp_uint(b, sg[i].length);
		mp_uint(b, sg[i].lkey);
	}
}

/* IBV_SEND_INLINE: the bytes may be in memory no MR covers (ibv_post_send(3): the
 * lkey is not checked), and the daemon reads them at post time. They are copied into
 * the QP's own registered bounce pages, which the daemon has read before the post's
 * reply comes back, so one post at a time may use them. */
int shca_inline_sge(struct shca_qp *qp, const struct ibv_sge *sg, int n,
		    struct ibv_sge *out)
{
	size_t total = 0, need;
	int i;

	for (i = 0; i < n; i++)
		total += sg[i].length;
	if (total > qp->max_inline) {
		shca_log("ibv_post_send: EINVAL: %zu bytes of inline data exceed max_inline_data "
			 "%u", total, qp->max_inline);
		return EINVAL;
	}
	need = (size_t)qp->max_inline * MAX_WRS_PER_POST;
	if (!qp->bounce) {
		struct ibv_mr *mr;

		if (posix_memalign((void **)&qp->bounce_buf, 4096, need))
			return ENOMEM;
		mr = shca_reg_mr(qp->vqp.qp.pd, qp->bounce_buf, need,
				 (uintptr_t)qp->bounce_buf, 0);
		if (!mr) {
			free(qp->bounce_buf);
			qp->bounce_buf = NULL;
			return errno;
		}
		qp->bounce = (struct shca_mr *)mr;
	}
	out->addr = (uintptr_t)qp->bounce_buf + qp->bounce_used;
	out->length = (uint32_t)total;
	out->lkey = qp->bounce->vmr.ibv_mr.lkey;
	for (i = 0; i < n; i++) {
		memcpy(qp->bounce_buf + qp->bounce_used, (void *)(uintptr_t)sg[i].addr,
		       sg[i].length);
		qp->bounce_used += sg[i].length;
	}
	return 0;
}

int shca_encode_send_wr(struct shca_qp *qp, struct mp_buf *b, const struct ibv_send_wr *wr,
			int bounced)
{
	int imm = wr->opcode == IBV_WR_SEND_WITH_IMM ||
		  wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	int atomic = wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		     wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
	struct ibv_sge one = {0};
	int rc;

	if (wr->num_sge < 0 || wr->num_sge > MAX_SGE || (uint32_t)wr->num_sge > qp->max_send_sge) {
		shca_log("ibv_post_send: EINVAL: num_sge %d exceeds the QP's max_send_sge %u",
			 wr->num_sge, qp->max_send_sge);
		return EINVAL;
	}
	mp_map(b, imm ? 10 : 9);
	mp_kv_uint(b, "wr_id", wr->wr_id);
	mp_kv_uint(b, "opcode", wr->opcode);
	if ((wr->send_flags & IBV_SEND_INLINE) && wr->num_sge && !bounced) {
		rc = shca_inline_sge(qp, wr->sg_list, wr->num_sge, &one);
		if (rc)
			return rc;
		encode_sges(b, &one, 1);
	} else {
		encode_sges(b, wr->sg_list, wr->num_sge);
	}
	mp_kv_uint(b, "send_flags", wr->send_flags);
	if (imm)
		mp_kv_uint(b, "imm_data", ntohl(wr->imm_data));
	if (atomic) {
		mp_kv_uint(b, "rkey", wr->wr.atomic.rkey);
		mp_kv_uint(b, "remote_addr", wr->wr.atomic.remote_addr);
		mp_kv_uint(b, "compare_add", wr->wr.atomic.compare_add);
		mp_kv_uint(b, "swap", wr->wr.atomic.swap);
	} else {
		mp_kv_uint(b, "rkey", wr->wr.rdma.rkey);
		mp_kv_uint(b, "remote_addr", wr->wr.rdma.remote_addr);
		mp_kv_uint(b, "compare_add", 0);
		mp_kv_uint(b, "swap", 0);
	}
	mp_kv_uint(b, "invalidate_rkey",
		   wr->opcode == IBV_WR_SEND_WITH_INV ? wr->invalidate_rkey : 0);
	return 0;
}

int shca_post_send_batch(struct shca_qp *qp, struct mp_buf *wrs, uint32_t n)
{
	struct shca_context *ctx = to_sctx(qp->vqp.qp.context);
	struct mp_buf b;
	struct shca_reply r;
	int rc;

	shca_begin(&ctx->conn, &b, "post_send", 2);
	mp_kv_uint(&b, "qp", qp->handle);
	mp_str(&b, "wrs");
	mp_arr(&b, n);
	mp_raw(&b, wrs->p, wrs->len);
	b.failed |= wrs->failed;
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (!rc)
		shca_reply_free(&r);
	return rc;
}

static int shca_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
			  struct ibv_send_wr **bad)
{
	struct shca_qp *qp = (struct shca_qp *)ibqp;
	struct ibv_send_wr *first = wr;
	struct mp_buf wrs;
	uint32_t n = 0;
	int rc = 0;

	while (wr) {
		first = wr;
		mp_init(&wrs);
		n = 0;
		qp->bounce_used = 0;
		for (; wr && n < MAX_WRS_PER_POST; wr = wr->next, n++) {
			rc = shca_encode_send_wr(qp, &wrs, wr, 0);
			if (rc)
				break;
		}
		if (!rc)
			rc = shca_post_send_batch(qp, &wrs, n);
		mp_free(&wrs);
		if (rc) {
			/* The daemon takes a post's WRs in order and stops at the first it
			 * refuses; the WRs before it are posted. */
			*bad = wr ? wr : first;
			return rc;
		}
	}
	return 0;
}

static int shca_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
			  struct ibv_recv_wr **bad)
{
	struct shca_context *ctx = to_sctx(ibqp->context);
	struct shca_qp *qp = (struct shca_qp *)ibqp;
	struct ibv_recv_wr *w, *first;
	struct mp_buf b;
	struct shca_reply r;
	uint32_t n;
	int rc;

	while (wr) {
		first = wr;
		for (n = 0, w = wr; w && n < MAX_WRS_PER_POST; w = w->next, n++) {
			if (w->num_sge < 0 || w->num_sge > MAX_SGE ||
			    (uint32_t)w->num_sge > qp->max_recv_sge) {
				shca_log("ibv_post_recv: EINVAL: num_sge %d exceeds the QP's "
					 "max_recv_sge %u", w->num_sge, qp->max_recv_sge);
				*bad = w;
				return EINVAL;
			}
		}
		shca_begin(&ctx->conn, &b, "post_recv", 2);
		mp_kv_uint(&b, "qp", qp->handle);
		mp_str(&b, "wrs");
		mp_arr(&b, n);
		for (w = wr; w != NULL && n; w = w->next, n--) {
			mp_map(&b, 2);
			mp_kv_uint(&b, "wr_id", w->wr_id);
			encode_sges(&b, w->sg_list, w->num_sge);
			wr = w->next;
		}
		rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
		if (rc) {
			*bad = first;
			return rc;
		}
		shca_reply_free(&r);
	}
	return 0;
}

/* -- registration with libibverbs ---------------------------------------------------- */

static const struct verbs_context_ops shca_ops = {
	.alloc_pd = shca_alloc_pd,
	.async_event = shca_async_event,
	.cq_event = shca_cq_event,
	.create_cq = shca_create_cq,
	.create_qp = shca_create_qp,
	.create_qp_ex = shca_create_qp_ex,
	.dealloc_pd = shca_dealloc_pd,
	.dereg_mr = shca_dereg_mr,
	.destroy_cq = shca_destroy_cq,
	.destroy_qp = shca_destroy_qp,
	.free_context = shca_free_context,
	.modify_qp = shca_modify_qp,
	.poll_cq = shca_poll_cq,
	.post_recv = shca_post_recv,
	.post_send = shca_post_send,
	.query_device_ex = shca_query_device_ex,
	.query_port = shca_query_port,
	.query_qp = shca_query_qp,
	.reg_mr = shca_reg_mr,
	.req_notify_cq = shca_req_notify_cq,
};

static struct verbs_device *shca_alloc_device(struct verbs_sysfs_dev *sysfs_dev)
{
	(void)sysfs_dev;
	return calloc(1, sizeof(struct verbs_device));
}

static void shca_uninit_device(struct verbs_device *dev)
{
	free(dev);
}

/* `softhca run` writes "softhca:" to the device's device/modalias in its sysfs tree;
 * no other device matches. */
static const struct verbs_match_ent shca_match[] = {
	{.u.modalias = "softhca:*", .kind = VERBS_MATCH_MODALIAS},
	{.kind = VERBS_MATCH_SENTINEL},
};

static const struct verbs_device_ops shca_dev_ops = {
	.name = "softhca",
	.match_min_abi_version = 0,
	.match_max_abi_version = INT32_MAX,
	.match_table = shca_match,
	.alloc_device = shca_alloc_device,
	.uninit_device = shca_uninit_device,
	.alloc_context = shca_alloc_context,
};

static __attribute__((constructor)) void shca_register(void)
{
	verbs_register_driver_34(&shca_dev_ops);
}
