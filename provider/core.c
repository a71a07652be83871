/* The control connection's core (core.h): one request in flight, its reply taken by
 * the reader thread, every other frame handed to the connection's owner. */
#include <errno.h>
#include <poll.h>
#include <string.h>

#include "core.h"
#include "wire_enc.h"

/* An err reply's errno name as its number: wire.h's table, generated from
 * protocol/errors.py's ERRNO_NAMES (every name the daemon may send), one for both
 * libraries; EIO for another. */
int shca_errno(const char *name, uint32_t n)
{
	return shca_errno_of(name, n);
}

int shca_reply_errno(const struct shca_frame *r)
{
	struct mp_val t, v;
	const char *s;
	uint32_t n;

	if (mp_find(r->hdr, SHCA_KEY_T, &t) && mp_str_eq(t, SHCA_T_OK))
		return 0;
	if (mp_find(r->hdr, SHCA_R_ERRNO, &v) && mp_get_str(v, &s, &n))
		return shca_errno(s, n);
	return EIO;
}

int shca_reply_msg(const struct shca_frame *r, const char **s, uint32_t *n)
{
	struct mp_val v;

	return mp_find(r->hdr, SHCA_R_MSG, &v) && mp_get_str(v, s, n);
}

void shca_core_init(struct shca_core *c, uint32_t id_limit, uint32_t max_frame)
{
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	c->next_id = 1;
	c->id_limit = id_limit;
	c->max_frame = max_frame;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	pthread_mutex_init(&c->call_lock, NULL);
	pthread_mutex_init(&c->send_lock, NULL);
}

void shca_core_begin(struct shca_core *c, struct mp_buf *b, const char *verb,
		     uint32_t nfields)
{
	pthread_mutex_lock(&c->call_lock);
	c->want_id = c->next_id++;
	/* 0 is no request's; the ids from id_limit up are the owner's own */
	if (!c->next_id || (c->id_limit && c->next_id >= c->id_limit))
		c->next_id = 1;
	shca_wire_begin(b, verb, c->want_id, nfields);
}

int shca_core_send(struct shca_core *c, const struct mp_buf *b, const void *payload,
		   size_t plen)
{
	int rc;

	pthread_mutex_lock(&c->send_lock);
	rc = shca_frame_write(c->fd, b, payload, plen);
	pthread_mutex_unlock(&c->send_lock);
	return rc;
}

int shca_core_call(struct shca_core *c, struct mp_buf *b, const void *payload, size_t plen,
		   struct shca_frame *r)
{
	int rc;

	memset(r, 0, sizeof(*r));
	pthread_mutex_lock(&c->lock);
	c->reply_ready = 0;
	pthread_mutex_unlock(&c->lock);
	rc = c->dead ? EIO : shca_core_send(c, b, payload, plen);
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
	return rc;
}

/* The reply the caller of shca_core_call waits for: 1 (the frame is taken), else 0. */
static int take_reply(struct shca_core *c, struct shca_frame *f)
{
	struct mp_val t;
	uint64_t id;

	if (!mp_find(f->hdr, SHCA_KEY_T, &t) ||
	    !(mp_str_eq(t, SHCA_T_OK) || mp_str_eq(t, SHCA_T_ERR)) ||
	    !mp_find_uint(f->hdr, SHCA_KEY_ID, &id) || id != c->want_id || id == 0)
		return 0;
	pthread_mutex_lock(&c->lock);
	shca_frame_free(&c->reply);
	c->reply = *f;
	c->reply_ready = 1;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	return 1;
}

void *shca_core_reader(void *arg)
{
	struct shca_core *c = arg;
	struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
	struct shca_frame f;
	int rc;

	for (;;) {
		/* Waiting writes no memory but pfd (on this thread's own stack): the
		 * frame's bytes are read, and everything they change written, under
		 * dispatch (the provider's ibv_reg_mr takes it while it moves pages). */
		rc = poll(&pfd, 1, -1);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0)
			break;
		if (c->dispatch)
			pthread_mutex_lock(c->dispatch);
		rc = shca_frame_read(c->fd, &f, c->max_frame);
		if (!rc && !take_reply(c, &f))
			c->on_frame(c->owner, &f);
		if (c->dispatch)
			pthread_mutex_unlock(c->dispatch);
		if (rc)
			break;
	}
	pthread_mutex_lock(&c->lock);
	c->dead = 1;
	pthread_cond_broadcast(&c->cond);
	if (c->on_dead)
		c->on_dead(c->owner);
	pthread_mutex_unlock(&c->lock);
	return NULL;
}
