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
/* How long an empty poll_cq waits for a completion to arrive before returning 0. */
#define EMPTY_POLL_WAIT_NS 200000L

/* -- small helpers ----------------------------------------------------------------- */

int shca_get_u32(struct shca_frame *r, const char *key, uint32_t *out)
{
	uint64_t v;

	if (!mp_find_uint(r->hdr, key, &v) || v > UINT32_MAX)
		return EPROTO;
	*out = (uint32_t)v;
	return 0;
}

/* A request whose reply carries nothing the caller needs: the destroy, dealloc and
 * deregistration verbs (shca_call_destroy). */
int shca_call_simple(struct shca_context *ctx, const char *verb, const char *key,
		       uint32_t handle)
{
	struct mp_buf b;
	struct shca_frame r;
	int rc;

	shca_begin(ctx->conn, &b, verb, 1);
	mp_kv_uint(&b, key, handle);
	rc = shca_call_destroy(ctx->conn, &b, &r);
	if (!rc)
		shca_frame_free(&r);
	return rc;
}

/* -- device and context ---------------------------------------------------------- */

static void parse_welcome(struct shca_context *ctx, struct mp_buf *w)
{
	struct mp_val hdr = {w->p, w->p + w->len}, v, e;
	const char *s;
	uint32_t n, i, len;
	uint64_t x;

	if (mp_find(hdr, SHCA_R_DEVICES, &v) && mp_get_arr(v, &n, &e)) {
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
	if (mp_find(hdr, SHCA_R_MEMFD_KEY, &v) && mp_get_str(v, &s, &len) &&
	    len < sizeof(ctx->memfd_key)) {
		memcpy(ctx->memfd_key, s, len);
		ctx->memfd_key[len] = 0;
	}
	/* a daemon that attaches SysV segments itself (docs/native.md, "Memory already
	 * shared"); an older one takes fds only */
	ctx->sysv_attach = mp_find(hdr, SHCA_R_SYSV_ATTACH, &v) && mp_get_uint(v, &x) && x == 1;
	/* a daemon that takes CQs' completion rings (cq.c) */
	ctx->cq_ring = mp_find(hdr, SHCA_R_CQ_RING, &v) && mp_get_uint(v, &x) && x == 1;
	/* ...and QPs' send and receive rings (wq.c) */
	ctx->wq_ring = mp_find(hdr, SHCA_R_WQ_RING, &v) && mp_get_uint(v, &x) && x == 1;
	if (mp_find(hdr, SHCA_R_ADDRESS, &v) && mp_get_str(v, &s, &len) &&
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
	ctx->device_cap_flags_ex = 0;
	if (mp_find(a, SHCA_R_FW_VER, &v) && mp_get_str(v, &s, &n) && n < sizeof(d->fw_ver))
		memcpy(d->fw_ver, s, n);
#define U(field, key) if (mp_find_uint(a, key, &x)) d->field = x
	U(vendor_id, SHCA_R_VENDOR_ID);
	U(vendor_part_id, SHCA_R_VENDOR_PART_ID);
	U(max_qp, SHCA_R_MAX_QP);
	U(max_qp_wr, SHCA_R_MAX_QP_WR);
	U(max_sge, SHCA_R_MAX_SGE);
	U(max_cqe, SHCA_R_MAX_CQE);
	U(max_mr_size, SHCA_R_MAX_MR_SIZE);
	U(max_pd, SHCA_R_MAX_PD);
	U(max_qp_rd_atom, SHCA_R_MAX_QP_RD_ATOM);
	U(phys_port_cnt, SHCA_R_PHYS_PORT_CNT);
	U(max_srq, SHCA_R_MAX_SRQ);
	U(max_srq_wr, SHCA_R_MAX_SRQ_WR);
	U(max_srq_sge, SHCA_R_MAX_SRQ_SGE);
	U(max_cq, SHCA_R_MAX_CQ);
	U(max_mr, SHCA_R_MAX_MR);
	U(max_mw, SHCA_R_MAX_MW);
	U(max_ah, SHCA_R_MAX_AH);
	U(max_sge_rd, SHCA_R_MAX_SGE_RD);
	U(max_qp_init_rd_atom, SHCA_R_MAX_QP_INIT_RD_ATOM);
	U(max_res_rd_atom, SHCA_R_MAX_RES_RD_ATOM);
	U(page_size_cap, SHCA_R_PAGE_SIZE_CAP);
	U(atomic_cap, SHCA_R_ATOMIC_CAP);
	U(max_pkeys, SHCA_R_MAX_PKEYS);
	U(local_ca_ack_delay, SHCA_R_LOCAL_CA_ACK_DELAY);
#undef U
	if (mp_find_uint(a, SHCA_R_NODE_GUID, &x)) {
		d->node_guid = htobe64(x);
		d->sys_image_guid = htobe64(x);
	}
	if (mp_find_uint(a, SHCA_R_MAX_MSG_SZ, &x))
		ctx->max_msg_sz = x;
	/* What the device models is the daemon's to say (server/device_attr.py); the
	 * extended flags hold the same low 32 bits, as the kernel's uverbs answers them. */
	if (mp_find_uint(a, SHCA_R_DEVICE_CAP_FLAGS, &x))
		d->device_cap_flags = (unsigned int)x;
	if (mp_find_uint(a, SHCA_R_DEVICE_CAP_FLAGS_EX, &x))
		ctx->device_cap_flags_ex = x;
	memset(&ctx->odp_caps, 0, sizeof(ctx->odp_caps));
	if (mp_find(a, SHCA_R_ODP_CAPS, &v)) {
		if (mp_find_uint(v, SHCA_R_GENERAL_CAPS, &x))
			ctx->odp_caps.general_caps = x;
		if (mp_find_uint(v, SHCA_R_RC_ODP_CAPS, &x))
			ctx->odp_caps.per_transport_caps.rc_odp_caps = (uint32_t)x;
		if (mp_find_uint(v, SHCA_R_UC_ODP_CAPS, &x))
			ctx->odp_caps.per_transport_caps.uc_odp_caps = (uint32_t)x;
		if (mp_find_uint(v, SHCA_R_UD_ODP_CAPS, &x))
			ctx->odp_caps.per_transport_caps.ud_odp_caps = (uint32_t)x;
	}
}

static int open_device(struct shca_context *ctx, const char *name)
{
	struct mp_buf b;
	struct shca_frame r;
	struct mp_val a;
	int rc;

	shca_begin(ctx->conn, &b, SHCA_V_OPEN_DEVICE, SHCA_NREQ_OPEN_DEVICE);
	mp_str(&b, SHCA_K_NAME);
	mp_str(&b, name);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	rc = shca_get_u32(&r, SHCA_R_CTX, &ctx->handle);
	shca_frame_free(&r);
	if (rc)
		return rc;
	shca_begin(ctx->conn, &b, SHCA_V_QUERY_DEVICE, SHCA_NREQ_QUERY_DEVICE);
	mp_kv_uint(&b, SHCA_K_CTX, ctx->handle);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	if (mp_find(r.hdr, SHCA_R_ATTR, &a))
		attr_from_reply(ctx, a);
	shca_frame_free(&r);
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
	pthread_mutex_init(&ctx->handoff_lock, NULL);
	ctx->handoff_fd = -1;
	ctx->async_pipe[0] = ctx->async_pipe[1] = -1;
	ctx->pid = getpid();
	ctx->generation = shca_generation();
	ctx->conn = shca_alloc(sizeof(*ctx->conn));
	if (!ctx->conn) {
		rc = ENOMEM;
		goto fail;
	}
	snprintf(ctx->path, sizeof(ctx->path), "%s", path && *path ? path : DEFAULT_SOCKET);
	rc = shca_connect(ctx->conn, ctx->path, ctx, &welcome);
	if (rc)
		goto fail;
	parse_welcome(ctx, &welcome);
	mp_free(&welcome);
	rc = open_device(ctx, ibdev->name);
	if (rc) {
		shca_disconnect(ctx->conn);
		goto fail;
	}
	/* libibverbs asks the kernel for an async event fd unless the provider set one;
	 * there is no kernel here, so the provider's own socket pair is it. */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0) {
		fcntl(sv[1], F_SETFL, O_NONBLOCK);
		ctx->async_pipe[0] = sv[0];
		ctx->async_pipe[1] = sv[1];
		ctx->vctx.context.async_fd = sv[0];
		ctx->vctx.context.num_comp_vectors = 1;
		/* The daemon answers this wait with the context's next event. */
		shca_async_arm(ctx->conn);
	}
	verbs_set_ops(&ctx->vctx, &shca_ops);
	return &ctx->vctx;
fail:
	shca_free(ctx->conn);
	errno = rc;
	verbs_uninit_context(&ctx->vctx);
	free(ctx);
	return NULL;
}

static void shca_free_context(struct ibv_context *ibctx)
{
	struct shca_context *ctx = to_sctx(ibctx);

	/* a forked child's copy closes its fds and frees; the daemon's objects are the
	 * parent's */
	if (!shca_forked(ctx, "ibv_close_device"))
		shca_call_simple(ctx, SHCA_V_CLOSE_DEVICE, SHCA_K_CTX, ctx->handle);
	shca_disconnect(ctx->conn);
	shca_hand_over_close(ctx);
	shca_mem_release_all(ctx);
	if (ctx->async_pipe[1] >= 0)
		close(ctx->async_pipe[1]);
	/* async_pipe[0] is the context's async_fd; libibverbs closes it */
	shca_free(ctx->conn);
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
	/* A caller built against an older struct gets only the fields it has room for. */
	if (attr_size >= offsetof(struct ibv_device_attr_ex, device_cap_flags_ex) +
			 sizeof(attr->device_cap_flags_ex))
		attr->device_cap_flags_ex = ctx->device_cap_flags_ex;
	if (attr_size >= offsetof(struct ibv_device_attr_ex, odp_caps) + sizeof(attr->odp_caps))
		attr->odp_caps = ctx->odp_caps;
	if (attr_size >= offsetof(struct ibv_device_attr_ex, phys_port_cnt_ex) +
			 sizeof(attr->phys_port_cnt_ex))
		attr->phys_port_cnt_ex = ctx->attr.phys_port_cnt;
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
	struct shca_frame r;
	int rc;

	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	shca_begin(ctx->conn, &b, SHCA_V_ALLOC_PD, SHCA_NREQ_ALLOC_PD);
	mp_kv_uint(&b, SHCA_K_CTX, ctx->handle);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = shca_get_u32(&r, SHCA_R_PD, &pd->handle);
		shca_frame_free(&r);
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
	struct shca_pd *pd = to_spd(ibpd);
	int rc = shca_call_simple(to_sctx(ibpd->context), SHCA_V_DEALLOC_PD, SHCA_K_PD, pd->handle);

	if (!rc)
		free(pd);
	return rc;
}

struct ibv_mr *shca_reg_mr(struct ibv_pd *ibpd, void *addr, size_t length, uint64_t iova,
			   int access)
{
	struct shca_context *ctx = to_sctx(ibpd->context);
	struct shca_pd *pd = to_spd(ibpd);
	struct shca_mr *mr;
	struct mp_buf b;
	struct shca_frame r;
	struct mp_buf pieces;
	uint64_t offset;
	uint32_t seq;
	int rc;

	if (shca_forked(ctx, "ibv_reg_mr")) {
		errno = EIO;
		return NULL;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	/* The MR's last byte needs an address below 2^64 (the daemon refuses it too). */
	if (length && iova > UINT64_MAX - (length - 1)) {
		shca_log("ibv_reg_mr_iova(%p, %zu, %#llx): EINVAL: iova + length passes 2^64",
			 addr, length, (unsigned long long)iova);
		free(mr);
		errno = EINVAL;
		return NULL;
	}
	mp_init(&pieces);
	rc = shca_mem_share(ctx, addr, length, &mr->mem, &pieces, &offset, &seq);
	if (rc) {
		mp_free(&pieces);
		free(mr);
		errno = rc;
		return NULL;
	}
	shca_begin(ctx->conn, &b, SHCA_V_REG_MR_SHARED, SHCA_NREQ_REG_MR_SHARED);
	mp_kv_uint(&b, SHCA_K_FDS, seq);
	mp_kv_uint(&b, SHCA_K_PD, pd->handle);
	mp_kv_uint(&b, SHCA_K_ADDR, iova);
	mp_kv_uint(&b, SHCA_K_LENGTH, length);
	mp_kv_uint(&b, SHCA_K_ACCESS, (uint32_t)access);
	mp_kv_uint(&b, SHCA_K_OFFSET, offset);
	mp_str(&b, SHCA_K_PIECES);
	mp_raw(&b, pieces.p, pieces.len);
	b.failed |= pieces.failed;
	mp_free(&pieces);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = shca_get_u32(&r, SHCA_R_MR, &mr->handle);
		if (!rc)
			rc = shca_get_u32(&r, SHCA_R_LKEY, &mr->vmr.ibv_mr.lkey);
		if (!rc)
			rc = shca_get_u32(&r, SHCA_R_RKEY, &mr->vmr.ibv_mr.rkey);
		shca_frame_free(&r);
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
	int rc = shca_call_simple(ctx, SHCA_V_DEREG_MR, SHCA_K_MR, mr->handle);

	if (rc)
		return rc;
	shca_mem_release(ctx, &mr->mem);
	free(mr);
	return 0;
}

static int shca_dereg_mr(struct verbs_mr *vmr)
{
	return shca_dereg(to_smr(&vmr->ibv_mr));
}

/* -- CQ --------------------------------------------------------------------------- */

/* Completion channels. A kernel channel's fd is an event file: read() gives one
 * struct ib_uverbs_comp_event_desc (the CQ's handle, here its pointer) per event,
 * poll() says readable while one waits. Here it is the read end of a socket pair whose
 * write end the reader thread writes an armed CQ's pointer to (conn.c take_wcs).
 *
 * libibverbs' own ibv_create_comp_channel asks the kernel for the fd and, with no
 * kernel, keeps a number that is not a channel. Under `softhca run` the preload library
 * (preload/) calls shca_create_comp_channel instead, so the fd is real from the start:
 * a program may make it non-blocking and poll it before any CQ is bound. A channel made
 * by libibverbs' function (a program run by hand without the preload) still gets a pair
 * at the first CQ bound to it, its fd replaced then. */
struct chan {
	struct ibv_comp_channel *ch;
	int rfd, wfd;
	struct chan *next;
};
static struct chan *chans;
static pthread_mutex_t chans_lock = PTHREAD_MUTEX_INITIALIZER;

/* A new entry of a fresh pair for ch (chans_lock held), its read end ch's fd. */
static struct chan *chan_new(struct ibv_comp_channel *ch)
{
	struct chan *c = calloc(1, sizeof(*c));
	int sv[2];

	if (!c)
		return NULL;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
		free(c);
		return NULL;
	}
	/* The reader thread must never block on a program that reads no events. */
	fcntl(sv[1], F_SETFL, O_NONBLOCK);
	c->ch = ch;
	c->rfd = sv[0];
	c->wfd = sv[1];
	c->next = chans;
	chans = c;
	ch->fd = sv[0];
	return c;
}

static struct ibv_comp_channel *shca_create_comp_channel(struct ibv_context *ibctx)
{
	struct ibv_comp_channel *ch = calloc(1, sizeof(*ch));
	struct chan *c = NULL;

	if (ch) {
		ch->context = ibctx;
		pthread_mutex_lock(&chans_lock);
		c = chan_new(ch);
		pthread_mutex_unlock(&chans_lock);
	}
	if (!c) {
		int rc = ch ? errno : ENOMEM;

		shca_log("ibv_create_comp_channel: %s: no socket pair for the channel's fd",
			 strerror(rc));
		free(ch);
		errno = rc;
		return NULL;
	}
	return ch;
}

/* libibverbs counts the CQs bound to a channel in its refcnt, under the context's
 * mutex (ibv_create_cq / ibv_destroy_cq); a channel with any is EBUSY, as the kernel's. */
static int shca_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	struct ibv_context *ibctx = ch->context;
	struct chan *c, **pp;

	pthread_mutex_lock(&ibctx->mutex);
	if (ch->refcnt) {
		pthread_mutex_unlock(&ibctx->mutex);
		return EBUSY;
	}
	pthread_mutex_lock(&chans_lock);
	for (pp = &chans; (c = *pp); pp = &c->next) {
		if (c->ch == ch) {
			*pp = c->next;
			close(c->wfd);
			free(c);
			break;
		}
	}
	pthread_mutex_unlock(&chans_lock);
	close(ch->fd);
	pthread_mutex_unlock(&ibctx->mutex);
	free(ch);
	return 0;
}

const struct softhca_channel_ops softhca_channel_ops = {
	.version = SOFTHCA_CHANNEL_OPS_VERSION,
	.size = sizeof(struct softhca_channel_ops),
	.owns = shca_owns,
	.create = shca_create_comp_channel,
	.destroy = shca_destroy_comp_channel,
};

/* The write end for a CQ bound to ch, or -1. */
static int channel_wfd(struct ibv_comp_channel *ch)
{
	struct chan *c, **pp;
	int wfd = -1;

	pthread_mutex_lock(&chans_lock);
	for (pp = &chans; (c = *pp); pp = &c->next) {
		if (c->ch != ch)
			continue;
		if (ch->fd == c->rfd)
			break;
		/* A channel of libibverbs' making destroyed (its fd closed by libibverbs)
		 * and a new one at the same address: the old pair's write end goes. */
		*pp = c->next;
		close(c->wfd);
		free(c);
		c = NULL;
		break;
	}
	if (!c)
		c = chan_new(ch);
	if (c)
		wfd = c->wfd;
	pthread_mutex_unlock(&chans_lock);
	return wfd;
}

static struct ibv_cq *shca_create_cq(struct ibv_context *ibctx, int cqe,
				     struct ibv_comp_channel *channel, int comp_vector)
{
	struct shca_context *ctx = to_sctx(ibctx);
	struct shca_cq *cq = shca_alloc(sizeof(*cq));
	struct mp_buf b;
	struct shca_frame r;
	uint32_t seq = 0, chan_seq = 0;
	int rc, shared, chan = 0;

	(void)comp_vector;
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	if (cqe <= 0 || (uint32_t)cqe > (uint32_t)ctx->attr.max_cqe) {
		shca_log("ibv_create_cq: EINVAL: cqe %d is outside [1, max_cqe %d]", cqe,
			 ctx->attr.max_cqe);
		shca_free(cq);
		errno = EINVAL;
		return NULL;
	}
	cq->chan_wfd = -1;
	/* the completions in a ring shared with the daemon, or pushed as frames */
	shared = !shca_cq_ring_make(ctx, &cq->shared, (uint32_t)cqe, &seq);
	cq->cap = shared ? 0 : (uint32_t)cqe;
	cq->ring = shared ? NULL : shca_alloc((size_t)cq->cap * sizeof(*cq->ring));
	if (!shared && !cq->ring) {
		shca_free(cq);
		errno = ENOMEM;
		return NULL;
	}
	rc = 0;
	if (channel) {
		cq->chan_wfd = channel_wfd(channel);
		if (cq->chan_wfd < 0)
			rc = EMFILE;
		/* A ring CQ's events the daemon writes into the channel itself, as the
		 * kernel does; without the handoff the reader thread writes them. */
		else if (shared)
			chan = !shca_cq_channel_hand_over(ctx, cq->chan_wfd, &chan_seq);
	}
	if (!rc) {
		shca_begin(ctx->conn, &b, SHCA_V_CREATE_CQ,
			   SHCA_NFIELDS_CREATE_CQ - !shared - 2 * !chan);
		mp_kv_uint(&b, SHCA_K_CTX, ctx->handle);
		mp_kv_uint(&b, SHCA_K_CQE, (uint32_t)cqe);
		mp_str(&b, SHCA_K_PUSH);
		mp_bool(&b, true);
		if (shared)
			mp_kv_uint(&b, SHCA_K_RING, seq);
		if (chan) {
			mp_kv_uint(&b, SHCA_K_CHANNEL, chan_seq);
			mp_kv_uint(&b, SHCA_K_EVENT, (uint64_t)(uintptr_t)&cq->cq);
		}
		rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	}
	if (!rc) {
		rc = shca_get_u32(&r, SHCA_R_CQ, &cq->handle);
		shca_frame_free(&r);
	}
	if (rc) {
		shca_cq_ring_unmap(&cq->shared);
		shca_free(cq->ring);
		shca_free(cq);
		errno = rc;
		return NULL;
	}
	cq->cq.context = ibctx;
	cq->cq.cqe = cqe;
	cq->cq.handle = cq->handle;
	pthread_mutex_lock(&ctx->conn->core.lock);
	cq->next = ctx->cqs;
	ctx->cqs = cq;
	pthread_mutex_unlock(&ctx->conn->core.lock);
	return &cq->cq;
}

static int shca_destroy_cq(struct ibv_cq *ibcq)
{
	struct shca_context *ctx = to_sctx(ibcq->context);
	struct shca_cq *cq = to_scq(ibcq);
	int rc = SHCA_DESTROY_LISTED(ctx, SHCA_V_DESTROY_CQ, SHCA_K_CQ, &ctx->cqs, cq);

	if (rc)
		return rc;
	shca_cq_ring_unmap(&cq->shared);
	shca_free(cq->ring);
	shca_free(cq);
	return 0;
}

static int shca_poll_cq(struct ibv_cq *ibcq, int num, struct ibv_wc *wc)
{
	struct shca_context *ctx = to_sctx(ibcq->context);
	struct shca_cq *cq = to_scq(ibcq);
	struct mp_buf b;
	int n = 0;

	if (shca_forked(ctx, "ibv_poll_cq")) {
		errno = EIO;
		return -EIO;
	}
	if (num <= 0)
		return 0;
	if (cq->shared.base)
		return shca_cq_ring_poll(cq, num, wc);
	pthread_mutex_lock(&ctx->conn->core.lock);
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
		pthread_cond_timedwait(&ctx->conn->wc_cond, &ctx->conn->core.lock, &until);
	}
	while (n < num && cq->count) {
		wc[n++] = cq->ring[cq->head];
		cq->head = (cq->head + 1) % cq->cap;
		cq->count--;
	}
	pthread_mutex_unlock(&ctx->conn->core.lock);
	if (n) {
		/* The room goes back at once: the daemon counts every entry it pushed and
		 * the program has not polled against cqe, as the CQ's overrun rule says. */
		shca_wire_begin(&b, SHCA_V_CQ_CREDIT, 0, SHCA_NREQ_CQ_CREDIT);
		mp_str(&b, SHCA_K_CREDITS);
		mp_arr(&b, 1);
		mp_arr(&b, 2);
		mp_uint(&b, cq->handle);
		mp_uint(&b, (uint64_t)n);
		shca_send_oneway(ctx->conn, &b);
	}
	return n;
}

static int shca_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct shca_context *ctx = to_sctx(ibcq->context);
	struct shca_cq *cq = to_scq(ibcq);

	/* Solicited-only arming notifies on any completion: more events than asked
	 * for, which ibv_req_notify_cq(3) allows a consumer to see (it polls anyway). */
	if (shca_forked(ctx, "ibv_req_notify_cq"))
		return EIO;
	if (cq->shared.base)
		return shca_cq_ring_notify(ctx, cq, solicited_only);
	pthread_mutex_lock(&ctx->conn->core.lock);
	cq->armed = 1;
	pthread_mutex_unlock(&ctx->conn->core.lock);
	return 0;
}

static void shca_cq_event(struct ibv_cq *cq)
{
	(void)cq;
}

/* -- registration with libibverbs ---------------------------------------------------- */

static const struct verbs_context_ops shca_ops = {
	.alloc_pd = shca_alloc_pd,
	.create_srq = shca_create_srq,
	.modify_srq = shca_modify_srq,
	.query_srq = shca_query_srq,
	.destroy_srq = shca_destroy_srq,
	.post_srq_recv = shca_post_srq_recv,
	.async_event = shca_async_event,
	.cq_event = shca_cq_event,
	.create_ah = shca_create_ah,
	.create_cq = shca_create_cq,
	.create_qp = shca_create_qp,
	.create_qp_ex = shca_create_qp_ex,
	.dealloc_pd = shca_dealloc_pd,
	.dereg_mr = shca_dereg_mr,
	.destroy_ah = shca_destroy_ah,
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
	.alloc_mw = shca_alloc_mw,
	.dealloc_mw = shca_dealloc_mw,
	.bind_mw = shca_bind_mw,
	.rereg_mr = shca_rereg_mr,
	.resize_cq = shca_resize_cq,
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

bool shca_owns_device(struct ibv_device *device)
{
	return device && ((struct verbs_device *)device)->ops == &shca_dev_ops;
}

bool shca_owns(struct ibv_context *context)
{
	return context && shca_owns_device(context->device);
}

static __attribute__((constructor)) void shca_register(void)
{
	verbs_register_driver_34(&shca_dev_ops);
}
