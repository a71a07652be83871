/* The control connection: the socket, the HELLO (the frames themselves are frame.c's),
 * fork's generations, and what the daemon pushes: one request at a time and the
 * reader thread are core.c's, which hands this file each frame that is no call's reply,
 * so that the daemon's pushed completions ("wc" frames) reach their CQ's ring as they
 * come and a program blocked in ibv_get_cq_event still sees them arrive. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "softhca.h"

/* The daemon refuses frames above its max_frame; a reply above this is a broken peer. */
#define MAX_FRAME (64u << 20)
/* Request ids from here up are the reader thread's (the asynchronous event wait and its
 * acknowledgements); a program's calls use the ids below. */
#define OWN_IDS 0x80000000u
/* How long one get_async_event waits on the daemon before it is asked anew (s). */
#define ASYNC_WAIT_S 3600

/* -- fork ------------------------------------------------------------------------ */

/* How many fork(2)s separate this process from the one that loaded the provider: a
 * child has a copy of its parent's contexts, but their socket is the parent's (one
 * file description, shared), its reader thread is not in the child, and a lock another
 * of the parent's threads held stays held. A context of an earlier generation answers
 * every call that needs the daemon with EIO, before any lock or system call. */
static volatile unsigned fork_generation;

static void after_fork_in_child(void)
{
	fork_generation++;
}

static __attribute__((constructor)) void fork_watch(void)
{
	pthread_atfork(NULL, NULL, after_fork_in_child);
}

unsigned shca_generation(void)
{
	return fork_generation;
}

int shca_forked(struct shca_context *ctx, const char *verb)
{
	static pid_t told;
	pid_t me;

	if (__builtin_expect(ctx->generation == fork_generation, 1))
		return 0;
	me = getpid();
	if (told != me) {
		told = me;
		shca_log("%s: EIO: this process (%d) is a child of fork(2) and the device "
			 "context is its parent's (process %d): the connection to the daemon is "
			 "the parent's, so a forked child cannot use it or the verbs objects made "
			 "on it; the child opens a device context of its own", verb, (int)me,
			 (int)ctx->pid);
	}
	return EIO;
}

void shca_begin(struct shca_conn *c, struct mp_buf *b, const char *verb, uint32_t nfields)
{
	if (shca_forked(c->ctx, verb)) {
		/* shca_call refuses it; call_lock may be held by a thread of the parent */
		mp_init(b);
		b->failed = true;
		return;
	}
	shca_core_begin(&c->core, b, verb, nfields);
}

/* ``quiet``: an errno whose refusal is the program's to see in the return value only,
 * its reason on stderr only under SOFTHCA_DEBUG (0: none). */
static int call(struct shca_conn *c, struct mp_buf *b, const void *payload, size_t plen,
		struct shca_frame *r, uint32_t *taken, int quiet)
{
	const char *s;
	uint64_t bad;
	uint32_t n;
	int rc;

	if (taken)
		*taken = 0;
	if (shca_forked(c->ctx, "the verb")) {
		memset(r, 0, sizeof(*r));
		mp_free(b);
		return EIO;
	}
	rc = shca_core_call(&c->core, b, payload, plen, r);
	if (rc) {
		shca_log("the daemon's connection is gone");
		return rc;
	}
	rc = shca_reply_errno(r);
	if (!rc)
		return 0;
	if (shca_reply_msg(r, &s, &n)) {
		if (rc == quiet)
			shca_debug("%.*s", (int)n, s);
		else
			shca_log("%.*s", (int)n, s);
	}
	/* A post's refusal names the WR refused; those before it were taken. */
	if (taken && mp_find_uint(r->hdr, SHCA_R_BAD_WR, &bad) && bad <= UINT32_MAX)
		*taken = (uint32_t)bad;
	shca_frame_free(r);
	return rc;
}

int shca_call(struct shca_conn *c, struct mp_buf *b, const void *payload, size_t plen,
	      struct shca_frame *r)
{
	return call(c, b, payload, plen, r, NULL, 0);
}

/* A destroy or dealloc verb: EBUSY (the object is still in use: a PD with MRs, a CQ a
 * QP uses) is an answer programs meet in their teardown order (qperf destroys the PD
 * before its MRs, then again after), which a kernel device gives without a line. */
int shca_call_destroy(struct shca_conn *c, struct mp_buf *b, struct shca_frame *r)
{
	return call(c, b, NULL, 0, r, NULL, EBUSY);
}

int shca_call_post(struct shca_conn *c, struct mp_buf *b, uint32_t *taken)
{
	struct shca_frame r;
	int rc = call(c, b, NULL, 0, &r, taken, 0);

	if (!rc)
		shca_frame_free(&r);
	return rc;
}

int shca_send_oneway(struct shca_conn *c, struct mp_buf *b)
{
	int rc = c->core.dead || shca_forked(c->ctx, "the verb") ? EIO :
		 shca_core_send(&c->core, b, NULL, 0);

	mp_free(b);
	return rc;
}

/* -- pushed completions ---------------------------------------------------------- */

/* The CQ's completion channel, if it has one, gets its event (core.lock held). */
static void channel_event(struct shca_cq *cq)
{
	uint64_t ptr = (uintptr_t)&cq->cq;

	if (cq->chan_wfd < 0)
		return;
	/* ibv_get_cq_event reads the CQ's pointer from the channel's fd. */
	if (send(cq->chan_wfd, &ptr, sizeof(ptr), MSG_NOSIGNAL) != sizeof(ptr))
		shca_log("completion channel write failed: %s", strerror(errno));
}

static void take_wcs(struct shca_conn *c, struct mp_val hdr)
{
	uint64_t handle;
	struct mp_val wcs, w;
	uint32_t n, i;
	struct shca_cq *cq;

	if (!mp_find_uint(hdr, SHCA_R_CQ, &handle) || !mp_find(hdr, SHCA_R_WCS, &wcs) ||
	    !mp_get_arr(wcs, &n, &w))
		return;
	pthread_mutex_lock(&c->core.lock);
	for (cq = c->ctx->cqs; cq && cq->handle != handle; cq = cq->next)
		;
	if (cq) {
		for (i = 0; i < n; i++) {
			/* The daemon pushes at most cqe entries the program has not polled
			 * (cq_credit returns the room), so the ring never overflows. */
			if (cq->count < cq->cap) {
				shca_wire_wc(w, &cq->ring[(cq->head + cq->count) % cq->cap]);
				cq->count++;
			}
			if (!mp_next(&w))
				break;
		}
		if (n)
			pthread_cond_broadcast(&c->wc_cond);
		if (n && cq->armed) {
			cq->armed = 0;
			channel_event(cq);
		}
	}
	pthread_mutex_unlock(&c->core.lock);
}

/* An armed ring CQ got an entry (cq.c): the daemon's "cq_event" frame. */
static void take_cq_event(struct shca_conn *c, struct mp_val hdr)
{
	uint64_t handle;
	struct shca_cq *cq;

	if (!mp_find_uint(hdr, SHCA_R_CQ, &handle))
		return;
	pthread_mutex_lock(&c->core.lock);
	for (cq = c->ctx->cqs; cq && cq->handle != handle; cq = cq->next)
		;
	if (cq)
		channel_event(cq);
	pthread_mutex_unlock(&c->core.lock);
}

static uint32_t own_id(struct shca_conn *c)
{
	uint32_t id = OWN_IDS | (c->own_ids++ & ~OWN_IDS);

	return id ? id : OWN_IDS;
}

int shca_async_arm(struct shca_conn *c)
{
	struct mp_buf b;

	c->async_id = own_id(c);
	shca_wire_begin(&b, SHCA_V_GET_ASYNC_EVENT, c->async_id, SHCA_NREQ_GET_ASYNC_EVENT);
	mp_kv_uint(&b, SHCA_K_CTX, c->ctx->handle);
	mp_kv_uint(&b, SHCA_K_TIMEOUT, ASYNC_WAIT_S);
	return shca_send_oneway(c, &b);
}

/* struct ib_uverbs_async_event_desc, what ibv_get_async_event reads from async_fd */
struct async_desc {
	uint64_t element;
	uint32_t event_type;
	uint32_t reserved;
};

/* An event the daemon handed out: acknowledged at once (libibverbs' own
 * ibv_ack_async_event never reaches a provider), then written to the context's
 * async fd with its element as libibverbs expects it: the QP's or CQ's pointer, or the
 * port number. */
static void take_async(struct shca_conn *c, struct mp_val hdr)
{
	struct shca_context *ctx = c->ctx;
	struct async_desc d = {.element = 1};
	struct mp_val ev;
	uint64_t id, type, h;
	struct mp_buf b;

	if (!mp_find(hdr, SHCA_R_EVENT, &ev) || mp_kind(ev) != MP_MAP ||
	    !mp_find_uint(ev, SHCA_R_EVENT, &id) || !mp_find_uint(ev, SHCA_R_EVENT_TYPE, &type))
		return;
	shca_wire_begin(&b, SHCA_V_ACK_ASYNC_EVENT, own_id(c), SHCA_NREQ_ACK_ASYNC_EVENT);
	mp_kv_uint(&b, SHCA_K_EVENT, id);
	shca_send_oneway(c, &b);
	d.event_type = (uint32_t)type;
	pthread_mutex_lock(&c->core.lock);
	if (mp_find_uint(ev, SHCA_R_QP, &h)) {
		struct shca_qp *qp;

		for (qp = ctx->qps; qp && qp->handle != h; qp = qp->next)
			;
		d.element = qp ? (uintptr_t)&qp->vqp.qp : 0;
	} else if (mp_find_uint(ev, SHCA_R_CQ, &h)) {
		struct shca_cq *cq;

		for (cq = ctx->cqs; cq && cq->handle != h; cq = cq->next)
			;
		d.element = cq ? (uintptr_t)&cq->cq : 0;
	} else if (mp_find_uint(ev, SHCA_R_SRQ, &h)) {
		struct shca_srq *srq;

		for (srq = ctx->srqs; srq && srq->handle != h; srq = srq->next)
			;
		d.element = srq ? (uintptr_t)&srq->srq : 0;
	}
	pthread_mutex_unlock(&c->core.lock);
	if (!d.element) {
		shca_log("asynchronous event %u of an object already destroyed: dropped",
			 d.event_type);
		return;
	}
	if (ctx->async_pipe[1] < 0 ||
	    send(ctx->async_pipe[1], &d, sizeof(d), MSG_NOSIGNAL) != sizeof(d))
		shca_log("asynchronous event %u lost: the context's async fd is full",
			 d.event_type);
}

/* The reader thread's, for each frame that is not the reply a call waits for: pushed
 * completions, an asynchronous event, the replies of its own requests. */
static void on_frame(void *owner, struct shca_frame *r)
{
	struct shca_conn *c = owner;
	struct mp_val t;
	uint64_t id;

	if (!mp_find(r->hdr, SHCA_KEY_T, &t)) {
		shca_frame_free(r);
		return;
	}
	if (mp_str_eq(t, SHCA_T_WC)) {
		take_wcs(c, r->hdr);
		shca_frame_free(r);
		return;
	}
	if (mp_str_eq(t, SHCA_T_CQ_EVENT)) {
		take_cq_event(c, r->hdr);
		shca_frame_free(r);
		return;
	}
	if (mp_str_eq(t, SHCA_T_OK) && mp_find_uint(r->hdr, SHCA_KEY_ID, &id) && c->async_id &&
	    id == c->async_id) {
		take_async(c, r->hdr);
		shca_frame_free(r);
		shca_async_arm(c);
		return;
	}
	if (mp_str_eq(t, SHCA_T_OK))
		;       /* the reply of an acknowledgement */
	else if (mp_str_eq(t, SHCA_T_ERR)) {
		const char *s;
		uint32_t n;

		/* a refused cq_credit (id 0): a bug, said, not hidden */
		if (shca_reply_msg(r, &s, &n))
			shca_log("daemon: %.*s", (int)n, s);
	}
	shca_frame_free(r);
}

/* The connection ended: a thread waiting for completions sees it (under core.lock), and
 * the context gets IBV_EVENT_DEVICE_FATAL, as from a device that died (a kernel driver
 * raises it on a fatal error; every verb after it fails with EIO): a program blocked in
 * ibv_get_async_event learns it, and one that only polls its CQs can. Its element is the
 * port, as libibverbs reads it for a device event. */
static void on_dead(void *owner)
{
	struct shca_conn *c = owner;
	struct async_desc d = {.element = 1, .event_type = IBV_EVENT_DEVICE_FATAL};

	pthread_cond_broadcast(&c->wc_cond);
	if (__atomic_load_n(&c->closing, __ATOMIC_ACQUIRE))
		return;
	if (c->ctx->async_pipe[1] >= 0 &&
	    send(c->ctx->async_pipe[1], &d, sizeof(d), MSG_NOSIGNAL) != sizeof(d))
		shca_log("IBV_EVENT_DEVICE_FATAL lost: the context's async fd is full");
}

static int expect(struct shca_frame *r, const char *kind)
{
	struct mp_val t;
	const char *s;
	uint32_t n;

	if (mp_find(r->hdr, SHCA_KEY_T, &t) && mp_str_eq(t, kind))
		return 0;
	if (shca_reply_msg(r, &s, &n))
		shca_log("the daemon refused the connection: %.*s", (int)n, s);
	return -1;
}

int shca_connect(struct shca_conn *c, const char *path, struct shca_context *ctx,
		 struct mp_buf *welcome)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct shca_frame r;
	struct mp_val auth;
	uint64_t need = 0;

	memset(c, 0, sizeof(*c));
	c->ctx = ctx;
	/* the ids from OWN_IDS up are the reader thread's own requests' */
	shca_core_init(&c->core, OWN_IDS, MAX_FRAME);
	c->core.on_frame = on_frame;
	c->core.on_dead = on_dead;
	c->core.owner = c;
	c->core.dispatch = &c->dispatch;
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&c->wc_cond, &ca);
		pthread_condattr_destroy(&ca);
	}
	pthread_mutex_init(&c->dispatch, NULL);
	if (strlen(path) >= sizeof(sa.sun_path)) {
		shca_log("socket path %s is too long", path);
		return ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	c->core.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->core.fd < 0)
		return errno;
	if (connect(c->core.fd, (struct sockaddr *)&sa, sizeof(sa))) {
		int e = errno;

		shca_log("cannot connect to the daemon at %s: %s", path, strerror(e));
		close(c->core.fd);
		return e;
	}
	if (shca_frame_read(c->core.fd, &r, MAX_FRAME) || expect(&r, SHCA_T_CHALLENGE))
		goto bad;
	if (mp_find(r.hdr, SHCA_R_AUTH, &auth))
		mp_get_uint(auth, &need);
	shca_frame_free(&r);
	if (need) {
		/* The UNIX socket's peer credentials are its authentication; a daemon that
		 * asks this socket for a token is misconfigured. */
		shca_log("the daemon at %s asks for a token on its UNIX socket", path);
		close(c->core.fd);
		return EACCES;
	}
	if (shca_frame_hello(c->core.fd))
		goto bad;
	if (shca_frame_read(c->core.fd, &r, MAX_FRAME) || expect(&r, SHCA_T_WELCOME))
		goto bad;
	mp_init(welcome);
	/* kept for the caller: the device list and the daemon's address */
	welcome->p = r.buf;
	welcome->len = (size_t)(r.hdr.end - r.hdr.p);
	welcome->cap = r.len;
	if (shca_thread_start(&c->reader, shca_core_reader, &c->core)) {
		shca_frame_free(&r);
		close(c->core.fd);
		return EAGAIN;
	}
	c->reader_started = 1;
	{
		/* The reader's stack is written by it at any moment: no registration may
		 * reach it (palloc.h). */
		pthread_attr_t a;
		void *stack;
		size_t size;

		if (!pthread_getattr_np(c->reader, &a)) {
			if (!pthread_attr_getstack(&a, &stack, &size) &&
			    !shca_pages_add((uintptr_t)stack, (uintptr_t)stack + size))
				c->stack = (uintptr_t)stack;
			pthread_attr_destroy(&a);
		}
	}
	return 0;
bad:
	shca_frame_free(&r);
	close(c->core.fd);
	return EPROTO;
}

/* -- memfd handoff ----------------------------------------------------------------- */

/* A new connection of the context's to the daemon's socket, its challenge read: the fd,
 * or -1 with *rc an errno (said on stderr). */
static int handoff_connect(struct shca_context *ctx, int *rc)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct shca_frame r = {0};
	int fd;

	strcpy(sa.sun_path, ctx->path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		*rc = errno;
		return -1;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		*rc = errno;
		shca_log("ibv_reg_mr: cannot connect to the daemon at %s to hand over the "
			 "memory: %s", ctx->path, strerror(*rc));
		close(fd);
		return -1;
	}
	if (shca_frame_read(fd, &r, 1u << 16) || expect(&r, SHCA_T_CHALLENGE)) {
		shca_log("ibv_reg_mr: the daemon at %s broke off the memfd handoff", ctx->path);
		shca_frame_free(&r);
		close(fd);
		*rc = EPROTO;
		return -1;
	}
	shca_frame_free(&r);
	return fd;
}

/* One memfd HELLO on fd carrying the n fds (SCM_RIGHTS, with its first byte), and the
 * daemon's answer in *r: 0, ENOMEM, or EPIPE when the connection broke before an
 * answer came (nothing said). */
static int handoff_exchange(struct shca_context *ctx, int fd, const int *fds, int n,
			    uint32_t seq, struct shca_frame *r)
{
	union {
		struct cmsghdr h;
		char room[CMSG_SPACE(sizeof(int) * SHCA_MAX_PIECES)];
	} anc;
	struct msghdr msg = {0};
	struct iovec iov[2];
	struct cmsghdr *cm;
	struct mp_buf b;
	uint32_t pre[2];
	size_t total, done;
	ssize_t w;

	shca_hello_begin(&b, SHCA_ROLE_MEMFD, 2);
	mp_str(&b, SHCA_R_KEY);
	mp_str(&b, ctx->memfd_key);
	mp_kv_uint(&b, SHCA_R_SEQ, seq);
	if (b.failed) {
		mp_free(&b);
		return ENOMEM;
	}
	pre[0] = htonl((uint32_t)(4 + b.len));
	pre[1] = htonl((uint32_t)b.len);
	iov[0].iov_base = pre;
	iov[0].iov_len = sizeof(pre);
	iov[1].iov_base = b.p;
	iov[1].iov_len = b.len;
	total = sizeof(pre) + b.len;
	memset(&anc, 0, sizeof(anc));
	msg.msg_iov = iov;
	msg.msg_iovlen = 2;
	msg.msg_control = anc.room;
	msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
	cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
	memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)n);
	do
		w = sendmsg(fd, &msg, MSG_NOSIGNAL);
	while (w < 0 && errno == EINTR);
	/* the fds went with the first byte; the rest of the frame (a short write) follows */
	for (done = w > 0 ? (size_t)w : 0; w > 0 && done < total; done += (size_t)w) {
		const uint8_t *from = done < sizeof(pre) ? (const uint8_t *)pre + done :
				      b.p + (done - sizeof(pre));
		size_t len = done < sizeof(pre) ? sizeof(pre) - done : total - done;

		do
			w = send(fd, from, len, MSG_NOSIGNAL);
		while (w < 0 && errno == EINTR);
	}
	mp_free(&b);
	if (w <= 0 || shca_frame_read(fd, r, 1u << 16))
		return EPIPE;
	return 0;
}

/* Hands the n memfds of one registration to the daemon under seq: a HELLO of role
 * "memfd" with the session's key carries them with SCM_RIGHTS; the daemon files them
 * for the session's reg_mr_shared naming seq. It maps what this process sent, never a
 * file it opens by number. The HELLOs go on one connection of the context's own, made
 * at its first registration and kept while the daemon keeps it (its welcome says
 * "keep"): a connection per registration costs the daemon's one thread an accept and a
 * challenge each, milliseconds under load. A kept connection found broken is made anew
 * once; any refusal ends it (the daemon's too). A forked child's copy is its parent's
 * and is never used (shca_forked). 0, or an errno said on stderr. */
int shca_hand_over(struct shca_context *ctx, const int *fds, int n, uint32_t seq)
{
	struct shca_frame r = {0};
	struct mp_val t, v;
	int rc = 0, fresh, keep = 0;

	if (shca_forked(ctx, "ibv_reg_mr"))
		return EIO;
	if (!ctx->memfd_key[0]) {
		shca_log("ibv_reg_mr: EOPNOTSUPP: the daemon at %s takes no memfds (its welcome "
			 "names no memfd_key): a daemon of another version", ctx->path);
		return EOPNOTSUPP;
	}
	if (n <= 0 || n > SHCA_MAX_PIECES)
		return EINVAL;
	pthread_mutex_lock(&ctx->handoff_lock);
	do {
		fresh = ctx->handoff_fd < 0;
		if (fresh)
			ctx->handoff_fd = handoff_connect(ctx, &rc);
		if (ctx->handoff_fd < 0)
			break;
		rc = handoff_exchange(ctx, ctx->handoff_fd, fds, n, seq, &r);
		if (rc == EPIPE) {
			/* the daemon ended it (idle, or before this HELLO was read) */
			close(ctx->handoff_fd);
			ctx->handoff_fd = -1;
		}
	} while (rc == EPIPE && !fresh);
	if (rc == EPIPE) {
		shca_log("ibv_reg_mr: the daemon at %s broke off the memfd handoff", ctx->path);
		rc = EPROTO;
	} else if (!rc && mp_find(r.hdr, SHCA_KEY_T, &t) && mp_str_eq(t, SHCA_T_WELCOME)) {
		uint64_t k = 0;

		keep = mp_find_uint(r.hdr, SHCA_R_KEEP, &k) && k;
	} else if (!rc) {
		const char *s = "";
		uint32_t len = 0;

		rc = EIO;
		if (mp_find(r.hdr, SHCA_R_ERRNO, &v) && mp_get_str(v, &s, &len))
			rc = shca_errno(s, len);
		if (shca_reply_msg(&r, &s, &len))
			shca_log("ibv_reg_mr: the daemon refused the memory: %.*s", (int)len, s);
	}
	if (!keep && ctx->handoff_fd >= 0) {
		close(ctx->handoff_fd);
		ctx->handoff_fd = -1;
	}
	pthread_mutex_unlock(&ctx->handoff_lock);
	shca_frame_free(&r);
	return rc;
}

/* The context's memfd connection closed (ibv_close_device); a forked child's is its
 * parent's file, closed here but not shut down, its lock never taken (a thread of the
 * parent may have held it at the fork). */
void shca_hand_over_close(struct shca_context *ctx)
{
	int forked = ctx->generation != shca_generation();

	if (!forked)
		pthread_mutex_lock(&ctx->handoff_lock);
	if (ctx->handoff_fd >= 0)
		close(ctx->handoff_fd);
	ctx->handoff_fd = -1;
	if (!forked)
		pthread_mutex_unlock(&ctx->handoff_lock);
}

void shca_disconnect(struct shca_conn *c)
{
	if (shca_forked(c->ctx, "ibv_close_device")) {
		/* the socket is the parent's too: shutdown would end its session, and the
		 * reader thread is the parent's alone */
		close(c->core.fd);
		return;
	}
	__atomic_store_n(&c->closing, 1, __ATOMIC_RELEASE);
	shutdown(c->core.fd, SHUT_RDWR);
	if (c->reader_started)
		pthread_join(c->reader, NULL);
	if (c->stack)
		shca_pages_remove(c->stack);
	close(c->core.fd);
	shca_frame_free(&c->core.reply);
}
