/* librdmacm's own connection to the softhca daemon: the UNIX socket of SOFTHCA_SOCKET,
 * the HELLO as a control session (docs/protocol.md), one request in flight at a time,
 * and a reader thread that hands replies to the caller and queues the pushed rdma_cm
 * events on their ids' event channels (cma.c's callback, given to cm_connect). */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cm.h"

#define MAX_FRAME (1u << 20)

void cm_log(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("softhca-rdmacm: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static void *reader_main(void *arg)
{
	struct cm_conn *c = arg;
	struct shca_frame f;
	struct mp_val t;
	uint64_t id;

	while (!shca_frame_read(c->fd, &f, MAX_FRAME)) {
		if (!mp_find(f.hdr, "t", &t)) {
			shca_frame_free(&f);
			continue;
		}
		if (mp_str_eq(t, "event")) {
			c->on_event(&f);        /* keeps the frame, or frees it */
			continue;
		}
		if ((mp_str_eq(t, "ok") || mp_str_eq(t, "err")) && mp_find_uint(f.hdr, "id", &id)
		    && id == c->want_id && id != 0) {
			pthread_mutex_lock(&c->lock);
			shca_frame_free(&c->reply);
			c->reply = f;
			c->reply_ready = 1;
			pthread_cond_broadcast(&c->cond);
			pthread_mutex_unlock(&c->lock);
			continue;
		}
		shca_frame_free(&f);
	}
	pthread_mutex_lock(&c->lock);
	c->dead = 1;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

void cm_begin(struct cm_conn *c, struct mp_buf *b, const char *verb, uint32_t nfields)
{
	pthread_mutex_lock(&c->call_lock);
	c->want_id = c->next_id++;
	if (!c->next_id)
		c->next_id = 1;
	shca_wire_begin(b, verb, c->want_id, nfields);
}

int cm_call(struct cm_conn *c, struct mp_buf *b, const void *payload, size_t plen,
	    struct shca_frame *r)
{
	struct mp_val t, v;
	const char *s;
	uint32_t n;
	int rc;

	memset(r, 0, sizeof(*r));
	pthread_mutex_lock(&c->lock);
	c->reply_ready = 0;
	pthread_mutex_unlock(&c->lock);
	rc = c->dead ? EIO : shca_frame_write(c->fd, b, payload, plen);
	mp_free(b);
	if (!rc) {
		pthread_mutex_lock(&c->lock);
		while (!c->reply_ready && !c->dead)
			pthread_cond_wait(&c->cond, &c->lock);
		if (c->reply_ready) {
			*r = c->reply;
			memset(&c->reply, 0, sizeof(c->reply));
			c->reply_ready = 0;
		} else {
			rc = EIO;
		}
		pthread_mutex_unlock(&c->lock);
	}
	pthread_mutex_unlock(&c->call_lock);
	if (rc)
		return rc;
	if (mp_find(r->hdr, "t", &t) && mp_str_eq(t, "ok"))
		return 0;
	rc = EIO;
	/* wire.h's table of protocol/errors.py's names, as the provider's */
	if (mp_find(r->hdr, "errno", &v) && mp_get_str(v, &s, &n))
		rc = shca_errno_of(s, n);
	if (getenv("SOFTHCA_CM_DEBUG") && mp_find(r->hdr, "msg", &v) && mp_get_str(v, &s, &n))
		cm_log("%.*s", (int)n, s);
	shca_frame_free(r);
	return rc;
}

int cm_connect(struct cm_conn *c, const char *path, void (*on_event)(struct shca_frame *f))
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct shca_frame f;
	struct mp_val t;

	memset(c, 0, sizeof(*c));
	c->next_id = 1;
	c->on_event = on_event;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	pthread_mutex_init(&c->call_lock, NULL);
	if (!path || strlen(path) >= sizeof(sa.sun_path))
		return ENODEV;
	strcpy(sa.sun_path, path);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return errno;
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)))
		goto bad;
	if (shca_frame_read(c->fd, &f, MAX_FRAME))
		goto bad;
	if (!mp_find(f.hdr, "t", &t) || !mp_str_eq(t, "challenge")) {
		shca_frame_free(&f);
		goto bad;
	}
	shca_frame_free(&f);
	if (shca_frame_hello(c->fd))
		goto bad;
	if (shca_frame_read(c->fd, &c->welcome, MAX_FRAME))
		goto bad;
	if (!mp_find(c->welcome.hdr, "t", &t) || !mp_str_eq(t, "welcome")) {
		shca_frame_free(&c->welcome);
		goto bad;
	}
	if (shca_thread_start(&c->reader, reader_main, c))
		goto bad;
	return 0;
bad:
	close(c->fd);
	return ENODEV;
}
