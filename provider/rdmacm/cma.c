/* The rdma_cm calls (rdma_cma.h) over the softhca daemon's connection manager.
 *
 * An event channel is a pipe: the reader thread (conn.c) queues each pushed event on
 * its id's channel and writes one byte, so the channel's fd is readable while events
 * wait, as rdma_get_cm_event(3) documents; rdma_get_cm_event reads the byte and does
 * what librdmacm does for its user before handing the event up: a new id for a
 * CONNECT_REQUEST, the QP to RTR and RTS and the RTU for a CONNECT_RESPONSE when the
 * id owns its QP (the user then sees ESTABLISHED). rdma_disconnect moves the QP to ERR
 * (its WRs flush) before the DREQ goes. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "../palloc.h"
#include "cm.h"
#include "ud.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVS 16
#define PDATA_MAX 256

struct cm_chan {
	struct rdma_event_channel ch;   /* fd: the pipe's read end */
	int wfd;
	pthread_mutex_t lock;
	struct cm_qev *head, *tail;
};

struct cm_qev {
	struct cm_qev *next;
	struct shca_frame f;
};


struct cm_event {
	struct rdma_cm_event ev;
	uint32_t counted;               /* the handle of the id it counts for */
	uint8_t pdata[PDATA_MAX];
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t acked;           /* an event was acknowledged */
	int ready, err;
	struct cm_conn conn;
	struct cm_id *ids;
	int ndev, on_lo;                /* on_lo: the daemon's address is a loopback one */
	char names[MAX_DEVS][64];
	struct ibv_context *ctx[MAX_DEVS];
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .acked = PTHREAD_COND_INITIALIZER};

static void take_event(struct shca_frame *f);

/* The daemon's connection and its devices, once per process. */
static int init(void)
{
	struct mp_val v, d;
	uint32_t n, i, len;
	const char *s;

	pthread_mutex_lock(&g.lock);
	if (!g.ready && !g.err) {
		g.err = cm_connect(&g.conn, getenv("SOFTHCA_SOCKET"), take_event);
		if (!g.err) {
			g.ready = 1;
			g.on_lo = mp_find(g.conn.welcome.hdr, SHCA_R_ADDRESS, &v) &&
				  mp_get_str(v, &s, &len) && len > 4 && !memcmp(s, "127.", 4);
			if (mp_find(g.conn.welcome.hdr, SHCA_R_DEVICES, &v) &&
			    mp_get_arr(v, &n, &d))
				for (i = 0; i < n && i < MAX_DEVS; i++, mp_next(&d))
					if (mp_get_str(d, &s, &len) && len < 64) {
						memcpy(g.names[i], s, len);
						g.names[i][len] = 0;
						g.ndev = (int)i + 1;
					}
		}
	}
	pthread_mutex_unlock(&g.lock);
	return g.ready ? 0 : g.err;
}

/* The verbs context of the daemon's device ``dev``, opened once. */
static struct ibv_context *device(int dev)
{
	struct ibv_device **list;
	int i, n;

	if (dev < 0 || dev >= g.ndev)
		return NULL;
	pthread_mutex_lock(&g.lock);
	if (!g.ctx[dev]) {
		list = ibv_get_device_list(&n);
		for (i = 0; list && i < n; i++)
			if (!strcmp(ibv_get_device_name(list[i]), g.names[dev]))
				g.ctx[dev] = ibv_open_device(list[i]);
		if (list)
			ibv_free_device_list(list);
	}
	pthread_mutex_unlock(&g.lock);
	return g.ctx[dev];
}

static int call(struct mp_buf *b, const void *payload, size_t plen, struct shca_frame *r)
{
	struct shca_frame tmp;
	int rc = cm_call(&g.conn, b, payload, plen, r ? r : &tmp);

	if (!rc && !r)
		shca_frame_free(&tmp);
	return rc;
}

static int call_id(const char *verb, struct cm_id *id)
{
	struct mp_buf b;

	cm_begin(&g.conn, &b, verb, 1);
	mp_kv_uint(&b, SHCA_K_CMID, id->handle);
	return call(&b, NULL, 0, NULL);
}

static uint32_t random_psn(void)
{
	uint32_t v = 0;

	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		v = (uint32_t)rand();
	return v & 0xffffff;
}

static struct cm_id *find(uint32_t handle)
{
	struct cm_id *i;

	for (i = g.ids; i; i = i->next)
		if (i->handle == handle)
			return i;
	return NULL;
}

/* -- event channels -------------------------------------------------------------- */

EXPORT struct rdma_event_channel *rdma_create_event_channel(void)
{
	struct cm_chan *c;
	int p[2], rc = init();

	if (rc) {
		errno = rc;
		return NULL;
	}
	c = shca_alloc(sizeof(*c));
	if (!c || pipe2(p, O_CLOEXEC)) {
		shca_free(c);
		errno = ENOMEM;
		return NULL;
	}
	c->ch.fd = p[0];
	c->wfd = p[1];
	pthread_mutex_init(&c->lock, NULL);
	return &c->ch;
}

EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	struct cm_chan *c = (struct cm_chan *)channel;
	struct cm_qev *e;

	while ((e = c->head)) {
		c->head = e->next;
		shca_frame_free(&e->f);
		shca_free(e);
	}
	close(c->ch.fd);
	close(c->wfd);
	shca_free(c);
}

/* The reader thread's (cm_connect's on_event): the event goes to its id's channel (a
 * CONNECT_REQUEST to its listener's). */
static void take_event(struct shca_frame *f)
{
	uint64_t h = 0, l = 0;
	struct cm_id *id;
	struct cm_chan *c = NULL;
	struct cm_qev *e;
	char one = 1;

	mp_find_uint(f->hdr, SHCA_R_CMID, &h);
	mp_find_uint(f->hdr, SHCA_R_LISTEN, &l);
	/* g.lock held until the event is queued: rdma_migrate_id moves an id's queued
	 * events under it, so none lands on the channel the id just left. */
	pthread_mutex_lock(&g.lock);
	id = find((uint32_t)(l ? l : h));
	if (id)
		c = (struct cm_chan *)id->id.channel;
	e = c ? shca_alloc(sizeof(*e)) : NULL;
	if (!e) {
		pthread_mutex_unlock(&g.lock);
		shca_frame_free(f);
		return;
	}
	e->next = NULL;
	e->f = *f;
	pthread_mutex_lock(&c->lock);
	if (c->tail)
		c->tail->next = e;
	else
		c->head = e;
	c->tail = e;
	if (write(c->wfd, &one, 1) != 1)
		cm_log("event channel: %s", strerror(errno));
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_unlock(&g.lock);
}

/* The id an event queued as ``f`` is for: a CONNECT_REQUEST's listener, else its own. */
static uint32_t event_owner(const struct shca_frame *f)
{
	uint64_t h = 0, l = 0;

	mp_find_uint(f->hdr, SHCA_R_CMID, &h);
	mp_find_uint(f->hdr, SHCA_R_LISTEN, &l);
	return (uint32_t)(l ? l : h);
}

/* rdma_migrate_id(3): the id's events go to ``channel`` from now on, with those queued
 * on its old channel and not yet read (in their order, after any already on the new
 * one); NULL makes it synchronous (a channel of its own, as rdma_create_id with none).
 * As the man page says, it waits while events of the id handed up on the old channel
 * are not acknowledged; a synchronous id's own last event is acknowledged here, and
 * its own channel goes. */
EXPORT int rdma_migrate_id(struct rdma_cm_id *cid, struct rdma_event_channel *channel)
{
	struct cm_id *id = (struct cm_id *)cid;
	struct cm_chan *from, *to;
	struct cm_qev **p, *e, *moved = NULL, **tail = &moved;
	struct pollfd pfd;
	char one;
	int own = 0;

	if (!cid)
		return fail(EINVAL);
	if (!channel && id->own_channel)
		return fail(EINVAL);        /* already synchronous */
	if (!channel) {
		channel = rdma_create_event_channel();
		if (!channel)
			return -1;
		own = 1;
	}
	if (channel == cid->channel)
		return 0;
	if (id->own_channel && cid->event) {
		rdma_ack_cm_event(cid->event);
		cid->event = NULL;
	}
	pthread_mutex_lock(&g.lock);
	from = (struct cm_chan *)cid->channel;
	to = (struct cm_chan *)channel;
	pthread_mutex_lock(&from->lock);
	for (p = &from->head; (e = *p);) {
		if (event_owner(&e->f) != id->handle) {
			p = &e->next;
			continue;
		}
		*p = e->next;
		e->next = NULL;
		*tail = e;
		tail = &e->next;
		/* its byte on the old pipe: there unless a reader took it (and found the
		 * queue without it, so it reads again), which the man page rules out */
		pfd.fd = from->ch.fd;
		pfd.events = POLLIN;
		if (poll(&pfd, 1, 0) == 1 && read(from->ch.fd, &one, 1) != 1)
			cm_log("rdma_migrate_id: %s", strerror(errno));
	}
	from->tail = NULL;
	for (e = from->head; e; e = e->next)
		from->tail = e;
	pthread_mutex_unlock(&from->lock);
	pthread_mutex_lock(&to->lock);
	while ((e = moved)) {
		moved = e->next;
		e->next = NULL;
		if (to->tail)
			to->tail->next = e;
		else
			to->head = e;
		to->tail = e;
		one = 1;
		if (write(to->wfd, &one, 1) != 1)
			cm_log("event channel: %s", strerror(errno));
	}
	pthread_mutex_unlock(&to->lock);
	cid->channel = channel;
	while (id->acked < id->reported)
		pthread_cond_wait(&g.acked, &g.lock);
	pthread_mutex_unlock(&g.lock);
	if (id->own_channel)
		rdma_destroy_event_channel(&from->ch);
	id->own_channel = own;
	return 0;
}

/* -- ids ------------------------------------------------------------------------- */

static struct cm_id *new_id(struct rdma_event_channel *ch, void *context,
			    enum rdma_port_space ps, enum ibv_qp_type qp_type, uint32_t handle)
{
	struct cm_id *id = shca_alloc(sizeof(*id));

	if (!id)
		return NULL;
	id->id.channel = ch;
	id->id.context = context;
	id->id.ps = ps;
	id->id.qp_type = qp_type;
	id->id.port_num = 1;
	id->handle = handle;
	pthread_mutex_lock(&g.lock);
	id->next = g.ids;
	g.ids = id;
	pthread_mutex_unlock(&g.lock);
	return id;
}

EXPORT int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id,
			  void *context, enum rdma_port_space ps)
{
	struct shca_frame r;
	struct mp_buf b;
	uint64_t h;
	struct cm_id *i;
	int own = 0, rc = init();

	if (rc)
		return fail(rc);
	if (ps != RDMA_PS_TCP && ps != RDMA_PS_UDP)
		return fail(EOPNOTSUPP);
	if (!channel) {
		channel = rdma_create_event_channel();
		if (!channel)
			return -1;
		own = 1;
	}
	cm_begin(&g.conn, &b, SHCA_V_CM_CREATE_ID, SHCA_NREQ_CM_CREATE_ID);
	mp_kv_uint(&b, SHCA_K_PS, ps);
	rc = call(&b, NULL, 0, &r);
	if (rc) {
		if (own)
			rdma_destroy_event_channel(channel);
		return fail(rc);
	}
	mp_find_uint(r.hdr, SHCA_R_CMID, &h);
	shca_frame_free(&r);
	i = new_id(channel, context, ps, ps == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC,
		   (uint32_t)h);
	if (!i)
		return fail(ENOMEM);
	i->own_channel = own;
	*id = &i->id;
	return 0;
}

EXPORT int rdma_destroy_id(struct rdma_cm_id *cid)
{
	struct cm_id *id = (struct cm_id *)cid, **p;
	int rc = call_id(SHCA_V_CM_DESTROY_ID, id);

	pthread_mutex_lock(&g.lock);
	for (p = &g.ids; *p; p = &(*p)->next)
		if (*p == id) {
			*p = id->next;
			break;
		}
	pthread_mutex_unlock(&g.lock);
	if (id->own_channel)
		rdma_destroy_event_channel(cid->channel);
	shca_free(id);
	return rc ? fail(rc) : 0;
}

/* An address of either family as the daemon takes it: its text and port (IPv6 ids are
 * the kernel's rdma_cm's too; the daemon says which IPv6 addresses name a daemon). */
static int ip_of(const struct sockaddr *a, char ip[INET6_ADDRSTRLEN], uint16_t *port)
{
	if (a && a->sa_family == AF_INET) {
		inet_ntop(AF_INET, &((const struct sockaddr_in *)a)->sin_addr, ip,
			  INET6_ADDRSTRLEN);
		*port = ntohs(((const struct sockaddr_in *)a)->sin_port);
		return 0;
	}
	if (a && a->sa_family == AF_INET6) {
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)a)->sin6_addr, ip,
			  INET6_ADDRSTRLEN);
		*port = ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
		return 0;
	}
	return EAFNOSUPPORT;
}

static size_t sa_size(const struct sockaddr *a)
{
	return a->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) :
		sizeof(struct sockaddr_in);
}

/* 127.0.0.0/8 or ::1 */
static int loopback(const struct sockaddr *a)
{
	if (a->sa_family == AF_INET6)
		return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);
	return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
}

EXPORT int rdma_bind_addr(struct rdma_cm_id *cid, struct sockaddr *addr)
{
	struct cm_id *id = (struct cm_id *)cid;
	struct shca_frame r;
	struct mp_buf b;
	char ip[INET6_ADDRSTRLEN];
	uint16_t port;
	uint64_t got = 0;
	int rc = ip_of(addr, ip, &port);

	if (rc)
		return fail(rc);
	cm_begin(&g.conn, &b, SHCA_V_CM_BIND, SHCA_NFIELDS_CM_BIND);
	mp_kv_uint(&b, SHCA_K_CMID, id->handle);
	mp_str(&b, SHCA_K_IP);
	mp_str(&b, ip);
	mp_kv_uint(&b, SHCA_K_PORT, port);
	mp_str(&b, SHCA_K_REUSE);
	mp_bool(&b, id->reuseaddr);
	mp_str(&b, SHCA_K_AFONLY);
	mp_bool(&b, id->afonly);
	rc = call(&b, NULL, 0, &r);
	if (rc)
		return fail(rc);
	mp_find_uint(r.hdr, SHCA_R_PORT, &got);
	shca_frame_free(&r);
	memset(&cid->route.addr.src_storage, 0, sizeof(cid->route.addr.src_storage));
	memcpy(&cid->route.addr.src_storage, addr, sa_size(addr));
	/* sin_port and sin6_port lie at one offset */
	cid->route.addr.src_sin.sin_port = htons((uint16_t)got);
	/* A bound id has its device: the daemon's first (its address is the daemon's).
	 * Not so a loopback address when the daemon is on another interface: lo has no
	 * RDMA device, and the id, bound as the kernel binds a wildcard, gets its device
	 * with a connection. libfabric's verbs provider binds "localhost" this way and,
	 * finding no device, listens on the device's own address (the peer could not
	 * reach 127.0.0.1). */
	if (!g.on_lo && loopback(addr))
		cid->verbs = NULL;
	else
		cid->verbs = device(0);
	return 0;
}

/* Wait for a synchronous id's event (its own channel): 0 when it is ``want``. */
static int sync_wait(struct rdma_cm_id *cid, enum rdma_cm_event_type want,
		     struct rdma_cm_event **out)
{
	struct rdma_cm_event *ev;
	int st;

	if (rdma_get_cm_event(cid->channel, &ev))
		return -1;
	if (ev->event == want) {
		if (out)
			*out = ev;
		else
			rdma_ack_cm_event(ev);
		return 0;
	}
	st = ev->status;
	rdma_ack_cm_event(ev);
	return fail(st < 0 ? -st : ECONNREFUSED);
}

EXPORT int rdma_resolve_addr(struct rdma_cm_id *cid, struct sockaddr *src,
			     struct sockaddr *dst, int timeout_ms)
{
	struct cm_id *id = (struct cm_id *)cid;
	struct mp_buf b;
	char ip[INET6_ADDRSTRLEN];
	uint16_t port;
	int rc;

	if (src && src->sa_family && rdma_bind_addr(cid, src))
		return -1;
	rc = ip_of(dst, ip, &port);
	if (rc)
		return fail(rc);
	cm_begin(&g.conn, &b, SHCA_V_CM_RESOLVE_ADDR, SHCA_NFIELDS_CM_RESOLVE_ADDR);
	mp_kv_uint(&b, SHCA_K_CMID, id->handle);
	mp_str(&b, SHCA_K_IP);
	mp_str(&b, ip);
	mp_kv_uint(&b, SHCA_K_PORT, port);
	mp_kv_uint(&b, SHCA_K_TIMEOUT_MS, timeout_ms > 0 ? (uint32_t)timeout_ms : 2000);
	rc = call(&b, NULL, 0, NULL);
	if (rc)
		return fail(rc);
	memset(&cid->route.addr.dst_storage, 0, sizeof(cid->route.addr.dst_storage));
	memcpy(&cid->route.addr.dst_storage, dst, sa_size(dst));
	return id->own_channel ? sync_wait(cid, RDMA_CM_EVENT_ADDR_RESOLVED, NULL) : 0;
}

EXPORT int rdma_resolve_route(struct rdma_cm_id *cid, int timeout_ms)
{
	struct cm_id *id = (struct cm_id *)cid;
	struct mp_buf b;
	int rc;

	cm_begin(&g.conn, &b, SHCA_V_CM_RESOLVE_ROUTE, SHCA_NFIELDS_CM_RESOLVE_ROUTE);
	mp_kv_uint(&b, SHCA_K_CMID, id->handle);
	mp_kv_uint(&b, SHCA_K_TIMEOUT_MS, timeout_ms > 0 ? (uint32_t)timeout_ms : 2000);
	rc = call(&b, NULL, 0, NULL);
	if (rc)
		return fail(rc);
	return id->own_channel ? sync_wait(cid, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL) : 0;
}

EXPORT int rdma_listen(struct rdma_cm_id *cid, int backlog)
{
	struct cm_id *id = (struct cm_id *)cid;
	struct mp_buf b;
	int rc;

	if (backlog < 0)
		backlog = 0;
	cm_begin(&g.conn, &b, SHCA_V_CM_LISTEN, SHCA_NREQ_CM_LISTEN);
	mp_kv_uint(&b, SHCA_K_CMID, id->handle);
	mp_kv_uint(&b, SHCA_K_BACKLOG, (uint32_t)backlog);
	rc = call(&b, NULL, 0, NULL);
	return rc ? fail(rc) : 0;
}

/* rdma_create_ep(3): a synchronous id, bound (passive) or resolved (active), with a QP
 * when asked (a listener keeps the attributes for the ids rdma_get_request gives). */
EXPORT int rdma_create_ep(struct rdma_cm_id **out, struct rdma_addrinfo *res,
			  struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	struct rdma_cm_id *cid;
	struct cm_id *id;

	if (!out || !res)
		return fail(EINVAL);
	if (rdma_create_id(NULL, &cid, NULL, (enum rdma_port_space)res->ai_port_space))
		return -1;
	id = (struct cm_id *)cid;
	if (res->ai_flags & RAI_PASSIVE) {
		if (rdma_bind_addr(cid, res->ai_src_addr))
			goto bad;
		if (qp_init_attr) {
			id->ep_attr = *qp_init_attr;
			id->has_ep_attr = 1;
		}
		id->ep_pd = pd;
	} else {
		if (rdma_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000) ||
		    rdma_resolve_route(cid, 2000))
			goto bad;
		if (qp_init_attr && rdma_create_qp(cid, pd, qp_init_attr))
			goto bad;
	}
	*out = cid;
	return 0;
bad:
	{
		int e = errno;

		rdma_destroy_id(cid);
		return fail(e);
	}
}

EXPORT void rdma_destroy_ep(struct rdma_cm_id *cid)
{
	rdma_destroy_qp(cid);
	rdma_destroy_id(cid);
}

/* rdma_get_request(3): the next connect request of a synchronous listener, as an id of
 * its own (its own channel), with a QP made as rdma_create_ep was asked. */
EXPORT int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **out)
{
	struct cm_id *lid = (struct cm_id *)listen, *id;
	struct rdma_cm_event *ev;
	struct rdma_event_channel *ch;

	if (!lid->own_channel)
		return fail(EINVAL);
	if (sync_wait(listen, RDMA_CM_EVENT_CONNECT_REQUEST, &ev))
		return -1;
	id = (struct cm_id *)ev->id;
	rdma_ack_cm_event(ev);
	ch = rdma_create_event_channel();
	if (!ch) {
		rdma_reject(&id->id, NULL, 0);
		rdma_destroy_id(&id->id);
		return -1;
	}
	pthread_mutex_lock(&g.lock);
	id->id.channel = ch;
	id->own_channel = 1;
	pthread_mutex_unlock(&g.lock);
	if (lid->has_ep_attr) {
		struct ibv_qp_init_attr a = lid->ep_attr;

		if (rdma_create_qp(&id->id, lid->ep_pd, &a)) {
			int e = errno;

			rdma_reject(&id->id, NULL, 0);
			rdma_destroy_id(&id->id);
			return fail(e);
		}
	}
	*out = &id->id;
	return 0;
}

/* -- connecting ------------------------------------------------------------------- */

EXPORT int rdma_connect(struct rdma_cm_id *cid, struct rdma_conn_param *p)
{
	struct cm_id *id = (struct cm_id *)cid;
	struct rdma_conn_param none = {.responder_resources = 1, .initiator_depth = 1,
				       .retry_count = 7, .rnr_retry_count = 7};
	struct mp_buf b;
	uint32_t qpn;
	int rc;

	if (!p)
		p = &none;
	qpn = cid->qp ? cid->qp->qp_num : p->qp_num;
	if (!qpn)
		return fail(EINVAL);
	id->my_psn = random_psn();
	id->rr = p->responder_resources;
	id->depth = p->initiator_depth;
	id->retry = p->retry_count > 7 ? 7 : p->retry_count;
	id->rnr = p->rnr_retry_count > 7 ? 7 : p->rnr_retry_count;
	cm_begin(&g.conn, &b, SHCA_V_CM_CONNECT, SHCA_NREQ_CM_CONNECT);
	mp_kv_uint(&b, SHCA_K_CMID, id->handle);
	mp_kv_uint(&b, SHCA_K_QPN, qpn);
	mp_kv_uint(&b, SHCA_K_PSN, id->my_psn);
	mp_kv_uint(&b, SHCA_K_RESPONDER_RESOURCES, id->rr);
	mp_kv_uint(&b, SHCA_K_INITIATOR_DEPTH, id->depth);
	mp_kv_uint(&b, SHCA_K_RETRY_COUNT, id->retry);
	mp_kv_uint(&b, SHCA_K_RNR_RETRY_COUNT, id->rnr);
	rc = call(&b, p->private_data, p->private_data ? p->private_data_len : 0, NULL);
	if (rc)
		return fail(rc);
	return id->own_channel ? sync_wait(cid, RDMA_CM_EVENT_ESTABLISHED, NULL) : 0;
}

EXPORT int rdma_accept(struct rdma_cm_id *cid, struct rdma_conn_param *p)
{
	struct cm_id *id = (struct cm_id *)cid;
	struct mp_buf b;
	uint32_t qpn;
	uint8_t rep_rnr = 7;
	int rc;

	/* Our QP's resources: what the user asks, within what the peer offered (its
	 * initiator depth bounds our responder resources and the other way round). The
	 * RNR retry count given here is the peer's, carried in the REP; our own QP's is
	 * the REQ's (IBTA's CM: each side's is what its peer asked for). */
	if (p) {
		if (p->responder_resources < id->rr)
			id->rr = p->responder_resources;
		if (p->initiator_depth < id->depth)
			id->depth = p->initiator_depth;
		rep_rnr = p->rnr_retry_count > 7 ? 7 : p->rnr_retry_count;
	}
	qpn = cid->qp ? cid->qp->qp_num : (p ? p->qp_num : 0);
	if (!qpn)
		return fail(EINVAL);
	/* my_psn was drawn with the CONNECT_REQUEST: a program that moves its own QP
	 * (rdma_init_qp_attr) has used it for RTS before it calls rdma_accept. */
	if (cid->qp && cid->qp_type != IBV_QPT_UD) {
		rc = cm_move_qp(cid, IBV_QPS_RTR);
		if (!rc)
			rc = cm_move_qp(cid, IBV_QPS_RTS);
		if (rc)
			return fail(rc);
	}
	cm_begin(&g.conn, &b, SHCA_V_CM_ACCEPT, SHCA_NREQ_CM_ACCEPT);
	mp_kv_uint(&b, SHCA_K_CMID, id->handle);
	mp_kv_uint(&b, SHCA_K_QPN, qpn);
	mp_kv_uint(&b, SHCA_K_PSN, id->my_psn);
	mp_kv_uint(&b, SHCA_K_RESPONDER_RESOURCES, id->rr);
	mp_kv_uint(&b, SHCA_K_INITIATOR_DEPTH, id->depth);
	mp_kv_uint(&b, SHCA_K_RNR_RETRY_COUNT, rep_rnr);
	rc = call(&b, p ? p->private_data : NULL,
		  p && p->private_data ? p->private_data_len : 0, NULL);
	if (rc)
		return fail(rc);
	/* a UD id's SIDR_REP is the end: no RTU, no ESTABLISHED for the passive side */
	return id->own_channel && cid->qp_type != IBV_QPT_UD ?
		sync_wait(cid, RDMA_CM_EVENT_ESTABLISHED, NULL) : 0;
}

EXPORT int rdma_reject(struct rdma_cm_id *cid, const void *private_data,
		       uint8_t private_data_len)
{
	struct cm_id *id = (struct cm_id *)cid;
	struct mp_buf b;
	int rc;

	cm_begin(&g.conn, &b, SHCA_V_CM_REJECT, SHCA_NREQ_CM_REJECT);
	mp_kv_uint(&b, SHCA_K_CMID, id->handle);
	rc = call(&b, private_data, private_data ? private_data_len : 0, NULL);
	return rc ? fail(rc) : 0;
}

EXPORT int rdma_establish(struct rdma_cm_id *cid)
{
	int rc = call_id(SHCA_V_CM_ESTABLISH, (struct cm_id *)cid);

	return rc ? fail(rc) : 0;
}

EXPORT int rdma_disconnect(struct rdma_cm_id *cid)
{
	int rc;

	/* The QP flushes its WRs now, as librdmacm moves it to ERR before the DREQ. */
	rc = cm_qp_to_err(cid);
	if (rc)
		return fail(rc);
	rc = call_id(SHCA_V_CM_DISCONNECT, (struct cm_id *)cid);
	return rc ? fail(rc) : 0;
}

/* -- events ------------------------------------------------------------------------ */

/* An event frame's "cm" names the event: wire.h's SHCA_CM_EV_ names, the enum's own
 * words (protocol/cm.py EVENTS). */
#define KIND(n) {SHCA_CM_EV_##n, RDMA_CM_EVENT_##n}
static const struct { const char *name; enum rdma_cm_event_type type; } kinds[] = {
	KIND(ADDR_RESOLVED), KIND(ADDR_ERROR), KIND(ROUTE_RESOLVED), KIND(ROUTE_ERROR),
	KIND(CONNECT_REQUEST), KIND(CONNECT_RESPONSE), KIND(CONNECT_ERROR), KIND(UNREACHABLE),
	KIND(REJECTED), KIND(ESTABLISHED), KIND(DISCONNECTED), KIND(TIMEWAIT_EXIT),
};
#undef KIND

static uint8_t u8(struct mp_val h, const char *k)
{
	uint64_t v = 0;

	mp_find_uint(h, k, &v);
	return (uint8_t)v;
}

static void gid_of(struct mp_val h, const char *k, union ibv_gid *gid)
{
	struct mp_val v;
	const uint8_t *p = NULL;

	/* a bin of 16 bytes: 0xc4 0x10 then the GID */
	if (mp_find(h, k, &v) && v.end - v.p >= 18 && v.p[0] == 0xc4 && v.p[1] == 16)
		p = v.p + 2;
	if (p)
		memcpy(gid->raw, p, 16);
}

/* An event's address, in the family its text is: the family the program used (for a
 * passive id, the one its peer's REQ carried, as the kernel's rdma_cm has it). */
static void addr_of(struct mp_val h, const char *ipk, const char *portk,
		    struct sockaddr_storage *ss)
{
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
	struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
	struct mp_val v;
	const char *s;
	uint32_t n;
	char ip[INET6_ADDRSTRLEN];
	uint64_t port = 0;

	if (!mp_find(h, ipk, &v) || !mp_get_str(v, &s, &n) || n >= sizeof(ip))
		return;
	memcpy(ip, s, n);
	ip[n] = 0;
	mp_find_uint(h, portk, &port);
	memset(ss, 0, sizeof(*ss));
	if (memchr(ip, ':', n)) {
		s6->sin6_family = AF_INET6;
		inet_pton(AF_INET6, ip, &s6->sin6_addr);
		s6->sin6_port = htons((uint16_t)port);
	} else {
		s4->sin_family = AF_INET;
		inet_pton(AF_INET, ip, &s4->sin_addr);
		s4->sin_port = htons((uint16_t)port);
	}
}

static void route_of(struct rdma_cm_id *cid, struct mp_val h)
{
	uint64_t dev = 0;

	mp_find_uint(h, SHCA_R_DEV, &dev);
	cid->verbs = device((int)dev);
	addr_of(h, SHCA_R_SIP, SHCA_R_SPORT, &cid->route.addr.src_storage);
	addr_of(h, SHCA_R_DIP, SHCA_R_DPORT, &cid->route.addr.dst_storage);
	gid_of(h, SHCA_R_SGID, &cid->route.addr.addr.ibaddr.sgid);
	gid_of(h, SHCA_R_DGID, &cid->route.addr.addr.ibaddr.dgid);
	cid->route.addr.addr.ibaddr.pkey = htons(0xffff);
}

/* The event's conn param. A REQ's or REP's resources are the sender's; the IB CM hands
 * them up as the receiver's to give (cm_format_req_event, cm_format_rep_event): its
 * responder resources are the peer's initiator depth and its initiator depth the
 * peer's responder resources, so a program that accepts with the request's values
 * (tgtd's iSER target does) offers what the peer asked for. */
static void conn_param(struct cm_event *e, struct shca_frame *f, struct mp_val h)
{
	size_t n = f->payload_len < PDATA_MAX ? f->payload_len : PDATA_MAX;

	memcpy(e->pdata, f->payload, n);
	e->ev.param.conn.private_data = n ? e->pdata : NULL;
	e->ev.param.conn.private_data_len = (uint8_t)(n > 255 ? 255 : n);
	e->ev.param.conn.responder_resources = u8(h, SHCA_R_DEPTH);
	e->ev.param.conn.initiator_depth = u8(h, SHCA_R_RR);
	e->ev.param.conn.retry_count = u8(h, SHCA_R_RETRY);
	e->ev.param.conn.rnr_retry_count = u8(h, SHCA_R_RNR);
}

/* The event's status: an int of either sign (msgpack's negative fixint, int 8, int 16
 * for a negative errno; a uint otherwise). */
static int event_status(struct mp_val h)
{
	struct mp_val v;
	uint64_t status;

	if (!mp_find(h, SHCA_R_STATUS, &v))
		return 0;
	if (mp_get_uint(v, &status))
		return (int)(int64_t)status;
	if (v.p[0] >= 0xe0)             /* a negative fixint */
		return (int8_t)v.p[0];
	if (v.p[0] == 0xd0 && v.end - v.p >= 2)
		return (int8_t)v.p[1];
	if (v.p[0] == 0xd1 && v.end - v.p >= 3)
		return (int16_t)((v.p[1] << 8) | v.p[2]);
	return 0;
}

/* The event's kind by its name (kinds[]); an unknown one is an ADDR_ERROR. */
static enum rdma_cm_event_type event_kind(struct mp_val h)
{
	struct mp_val v;
	size_t i;

	if (mp_find(h, SHCA_R_CM, &v))
		for (i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
			if (mp_str_eq(v, kinds[i].name))
				return kinds[i].type;
	return RDMA_CM_EVENT_ADDR_ERROR;
}

/* The peer QP's number and first PSN, as a REQ or a REP carries them. */
static void peer_qp_of(struct cm_id *id, struct mp_val h)
{
	uint64_t x = 0;

	mp_find_uint(h, SHCA_R_QPN, &x);
	id->peer_qpn = (uint32_t)x;
	x = 0;
	mp_find_uint(h, SHCA_R_PSN, &x);
	id->peer_psn = (uint32_t)x;
}

/* A CONNECT_REQUEST: a new id on the listener's channel, with what the REQ carries;
 * 0 to hand it up. */
static int connect_request(struct cm_event *e, struct shca_frame *f, struct cm_id *lid,
			   uint32_t handle)
{
	struct mp_val h = f->hdr;
	struct cm_id *id;

	if (!lid)
		return -1;
	id = new_id(lid->id.channel, lid->id.context, lid->id.ps, lid->id.qp_type, handle);
	if (!id)
		return -1;
	route_of(&id->id, h);
	peer_qp_of(id, h);
	/* what the passive side may use: the peer's depth is our responder limit */
	id->rr = u8(h, SHCA_R_DEPTH);
	id->depth = u8(h, SHCA_R_RR);
	id->retry = u8(h, SHCA_R_RETRY);
	id->rnr = u8(h, SHCA_R_RNR);         /* the REQ's: our QP's RNR retry count */
	id->my_psn = random_psn();
	e->ev.listen_id = &lid->id;
	e->ev.id = &id->id;
	conn_param(e, f, h);
	e->ev.param.conn.qp_num = id->peer_qpn;
	if (id->id.qp_type == IBV_QPT_UD)
		cm_ud_param(&e->ev, &id->id, h, e->pdata, e->ev.param.conn.private_data_len);
	if (lid->has_ep_attr) {
		id->ep_attr = lid->ep_attr;
		id->has_ep_attr = 1;
	}
	return 0;
}

/* An event of a UD id (SIDR): its route and its UD parameters. */
static void ud_event(struct cm_event *e, struct shca_frame *f, struct cm_id *id)
{
	if (e->ev.event == RDMA_CM_EVENT_ESTABLISHED ||
	    e->ev.event == RDMA_CM_EVENT_ADDR_RESOLVED)
		route_of(&id->id, f->hdr);
	conn_param(e, f, f->hdr);
	cm_ud_param(&e->ev, &id->id, f->hdr, e->pdata, e->ev.param.conn.private_data_len);
}

/* librdmacm's part of a CONNECT_RESPONSE for an id that owns its QP: the QP to RTR and
 * RTS, then the RTU; the user sees ESTABLISHED, or CONNECT_ERROR with the failure. */
static void establish(struct cm_event *e, struct cm_id *id)
{
	int rc = cm_move_qp(&id->id, IBV_QPS_RTR);

	if (!rc)
		rc = cm_move_qp(&id->id, IBV_QPS_RTS);
	if (!rc)
		rc = call_id(SHCA_V_CM_ESTABLISH, id);
	if (rc) {
		e->ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
		e->ev.status = -rc;
	} else {
		e->ev.event = RDMA_CM_EVENT_ESTABLISHED;
	}
}

/* A CONNECT_RESPONSE (a REP): the peer's QP, the values both sides agree on (the lower
 * of each), and the id's QP connected if it has one. */
static void connect_response(struct cm_event *e, struct shca_frame *f, struct cm_id *id)
{
	struct mp_val h = f->hdr;

	route_of(&id->id, h);
	peer_qp_of(id, h);
	if (u8(h, SHCA_R_DEPTH) < id->rr)
		id->rr = u8(h, SHCA_R_DEPTH);
	if (u8(h, SHCA_R_RR) < id->depth)
		id->depth = u8(h, SHCA_R_RR);
	id->rnr = u8(h, SHCA_R_RNR);
	conn_param(e, f, h);
	e->ev.param.conn.qp_num = id->peer_qpn;
	if (id->id.qp)
		establish(e, id);
}

/* An event of a connected-mode id other than a CONNECT_REQUEST. */
static void rc_event(struct cm_event *e, struct shca_frame *f, struct cm_id *id)
{
	switch (e->ev.event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		route_of(&id->id, f->hdr);
		break;
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
		connect_response(e, f, id);
		break;
	case RDMA_CM_EVENT_REJECTED:
		/* the kernel's CM moves the id's QP to ERR on a REJ: its WRs flush */
		cm_qp_to_err(&id->id);
		conn_param(e, f, f->hdr);
		break;
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
		conn_param(e, f, f->hdr);
		break;
	default:
		/* DISCONNECTED among them: the QP is the program's, which may have destroyed
		 * it already (rping does, with ibv_destroy_qp); its own rdma_disconnect
		 * moves it to ERR. */
		break;
	}
}

/* What librdmacm does with an event before its user sees it; 0 to hand it up. */
static int process(struct cm_event *e, struct shca_frame *f)
{
	uint64_t handle = 0, listen = 0;
	struct cm_id *id, *lid;

	mp_find_uint(f->hdr, SHCA_R_CMID, &handle);
	mp_find_uint(f->hdr, SHCA_R_LISTEN, &listen);
	e->ev.status = event_status(f->hdr);
	e->ev.event = event_kind(f->hdr);
	pthread_mutex_lock(&g.lock);
	id = find((uint32_t)handle);
	lid = listen ? find((uint32_t)listen) : NULL;
	pthread_mutex_unlock(&g.lock);
	if (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST)
		return connect_request(e, f, lid, (uint32_t)handle);
	if (!id)
		return -1;          /* destroyed meanwhile */
	e->ev.id = &id->id;
	if (id->id.qp_type == IBV_QPT_UD)
		ud_event(e, f, id);
	else
		rc_event(e, f, id);
	return 0;
}

EXPORT int rdma_get_cm_event(struct rdma_event_channel *channel,
			     struct rdma_cm_event **event)
{
	struct cm_chan *c = (struct cm_chan *)channel;
	struct cm_event *e;
	struct cm_id *counted;
	struct cm_qev *q;
	char one;
	ssize_t n;

	for (;;) {
		n = read(c->ch.fd, &one, 1);
		if (n < 0)
			return -1;      /* EAGAIN on a non-blocking channel, EINTR */
		if (n == 0) {
			/* The channel was destroyed while this thread waited on it (rping's
			 * main does that, its event thread still blocked here). A reader of
			 * librdmacm's kernel channel is never woken by that: nor is this one,
			 * until the process exits, rather than report an error it never would. */
			for (;;)
				pause();
		}
		pthread_mutex_lock(&c->lock);
		q = c->head;
		if (q) {
			c->head = q->next;
			if (!c->head)
				c->tail = NULL;
		}
		pthread_mutex_unlock(&c->lock);
		if (!q)
			continue;
		e = calloc(1, sizeof(*e));
		if (!e) {
			shca_frame_free(&q->f);
			shca_free(q);
			return fail(ENOMEM);
		}
		if (process(e, &q->f)) {
			free(e);
			shca_frame_free(&q->f);
			shca_free(q);
			continue;
		}
		shca_frame_free(&q->f);
		shca_free(q);
		*event = &e->ev;
		e->ev.id->event = &e->ev;
		e->counted = ((struct cm_id *)(e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST ?
					       e->ev.listen_id : e->ev.id))->handle;
		pthread_mutex_lock(&g.lock);
		counted = find(e->counted);
		if (counted)
			counted->reported++;
		pthread_mutex_unlock(&g.lock);
		return 0;
	}
}

EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	struct cm_event *e = (struct cm_event *)event;
	struct cm_id *counted;

	if (!event)
		return fail(EINVAL);
	if (event->id && event->id->event == event)
		event->id->event = NULL;
	pthread_mutex_lock(&g.lock);
	counted = find(e->counted);     /* by handle: the id may be gone */
	if (counted) {
		counted->acked++;
		pthread_cond_broadcast(&g.acked);
	}
	pthread_mutex_unlock(&g.lock);
	free(event);
	return 0;
}

EXPORT const char *rdma_event_str(enum rdma_cm_event_type event)
{
	static const char *names[] = {
		"RDMA_CM_EVENT_ADDR_RESOLVED", "RDMA_CM_EVENT_ADDR_ERROR",
		"RDMA_CM_EVENT_ROUTE_RESOLVED", "RDMA_CM_EVENT_ROUTE_ERROR",
		"RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
		"RDMA_CM_EVENT_CONNECT_ERROR", "RDMA_CM_EVENT_UNREACHABLE",
		"RDMA_CM_EVENT_REJECTED", "RDMA_CM_EVENT_ESTABLISHED",
		"RDMA_CM_EVENT_DISCONNECTED", "RDMA_CM_EVENT_DEVICE_REMOVAL",
		"RDMA_CM_EVENT_MULTICAST_JOIN", "RDMA_CM_EVENT_MULTICAST_ERROR",
		"RDMA_CM_EVENT_ADDR_CHANGE", "RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};

	if ((unsigned)event < sizeof(names) / sizeof(names[0]))
		return names[event];
	return "UNKNOWN EVENT";
}

EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	return id->route.addr.src_sin.sin_port;
}

EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	return id->route.addr.dst_sin.sin_port;
}

EXPORT struct ibv_context **rdma_get_devices(int *num_devices)
{
	struct ibv_context **list;
	int i, n = 0;

	if (init()) {
		errno = ENODEV;
		return NULL;
	}
	list = calloc((size_t)g.ndev + 1, sizeof(*list));
	if (!list)
		return NULL;
	for (i = 0; i < g.ndev; i++)
		if (device(i))
			list[n++] = device(i);
	if (num_devices)
		*num_devices = n;
	return list;
}

EXPORT void rdma_free_devices(struct ibv_context **list)
{
	free(list);
}
