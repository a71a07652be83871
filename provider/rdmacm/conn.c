/* librdmacm's own connection to the softhca daemon: the UNIX socket of SOFTHCA_SOCKET,
 * the HELLO as a control session (docs/protocol.md), one request in flight at a time,
 * and a reader thread that hands replies to the caller and queues the pushed rdma_cm
 * events on their ids' event channels (cma.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "cm.h"

#define MAX_FRAME (1u << 20)

static int read_full(int fd, void *buf, size_t n)
{
	uint8_t *p = buf;

	while (n) {
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

int cm_read_frame(int fd, struct cm_frame *f)
{
	uint8_t pre[8];
	uint32_t l, h;

	memset(f, 0, sizeof(*f));
	if (read_full(fd, pre, 8))
		return -1;
	memcpy(&l, pre, 4);
	memcpy(&h, pre + 4, 4);
	l = ntohl(l);
	h = ntohl(h);
	if (l < 4 || l > MAX_FRAME || h > l - 4)
		return -1;
	f->len = l - 4;
	f->buf = malloc(f->len ? f->len : 1);
	if (!f->buf || read_full(fd, f->buf, f->len)) {
		free(f->buf);
		f->buf = NULL;
		return -1;
	}
	f->hdr.p = f->buf;
	f->hdr.end = f->buf + h;
	f->payload = f->buf + h;
	f->payload_len = f->len - h;
	return 0;
}

void cm_frame_free(struct cm_frame *f)
{
	free(f->buf);
	memset(f, 0, sizeof(*f));
}

static int send_frame(struct cm_conn *c, struct mp_buf *b, const void *payload, size_t plen)
{
	uint32_t pre[2];
	struct iovec iov[3];
	int n, i = 0;

	if (b->failed)
		return ENOMEM;
	pre[0] = htonl((uint32_t)(4 + b->len + plen));
	pre[1] = htonl((uint32_t)b->len);
	iov[0].iov_base = pre;
	iov[0].iov_len = 8;
	iov[1].iov_base = b->p;
	iov[1].iov_len = b->len;
	iov[2].iov_base = (void *)payload;
	iov[2].iov_len = plen;
	n = plen ? 3 : 2;
	while (i < n) {
		ssize_t w = writev(c->fd, iov + i, n - i);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return EIO;
		while (i < n && (size_t)w >= iov[i].iov_len) {
			w -= (ssize_t)iov[i].iov_len;
			i++;
		}
		if (i < n) {
			iov[i].iov_base = (uint8_t *)iov[i].iov_base + w;
			iov[i].iov_len -= (size_t)w;
		}
	}
	return 0;
}

static void *reader_main(void *arg)
{
	struct cm_conn *c = arg;
	struct cm_frame f;
	struct mp_val t;
	uint64_t id;

	while (!cm_read_frame(c->fd, &f)) {
		if (!mp_find(f.hdr, "t", &t)) {
			cm_frame_free(&f);
			continue;
		}
		if (mp_str_eq(t, "event")) {
			cm_take_event(&f);      /* keeps the frame, or frees it */
			continue;
		}
		if ((mp_str_eq(t, "ok") || mp_str_eq(t, "err")) && mp_find_uint(f.hdr, "id", &id)
		    && id == c->want_id && id != 0) {
			pthread_mutex_lock(&c->lock);
			cm_frame_free(&c->reply);
			c->reply = f;
			c->reply_ready = 1;
			pthread_cond_broadcast(&c->cond);
			pthread_mutex_unlock(&c->lock);
			continue;
		}
		cm_frame_free(&f);
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
	mp_init(b);
	mp_map(b, nfields + 2);
	mp_str(b, "t");
	mp_str(b, verb);
	c->want_id = c->next_id++;
	if (!c->next_id)
		c->next_id = 1;
	mp_kv_uint(b, "id", c->want_id);
}

static const struct { const char *name; int err; } errnos[] = {
	{"EINVAL", EINVAL}, {"ENOENT", ENOENT}, {"ENOMEM", ENOMEM}, {"EAGAIN", EAGAIN},
	{"EADDRINUSE", EADDRINUSE}, {"EADDRNOTAVAIL", EADDRNOTAVAIL}, {"EPROTO", EPROTO},
	{"EOPNOTSUPP", EOPNOTSUPP}, {"EBUSY", EBUSY}, {"ETIMEDOUT", ETIMEDOUT},
	{"EMSGSIZE", EMSGSIZE},
};

int cm_call(struct cm_conn *c, struct mp_buf *b, const void *payload, size_t plen,
	    struct cm_frame *r)
{
	struct mp_val t, v;
	const char *s;
	uint32_t n;
	size_t i;
	int rc;

	memset(r, 0, sizeof(*r));
	pthread_mutex_lock(&c->lock);
	c->reply_ready = 0;
	pthread_mutex_unlock(&c->lock);
	rc = c->dead ? EIO : send_frame(c, b, payload, plen);
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
	if (mp_find(r->hdr, "errno", &v) && mp_get_str(v, &s, &n))
		for (i = 0; i < sizeof(errnos) / sizeof(errnos[0]); i++)
			if (strlen(errnos[i].name) == n && !memcmp(errnos[i].name, s, n))
				rc = errnos[i].err;
	if (getenv("SOFTHCA_CM_DEBUG") && mp_find(r->hdr, "msg", &v) && mp_get_str(v, &s, &n))
		cm_log("%.*s", (int)n, s);
	cm_frame_free(r);
	return rc;
}

int cm_connect(struct cm_conn *c, const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct cm_frame f;
	struct mp_buf b;
	struct mp_val t;

	memset(c, 0, sizeof(*c));
	c->next_id = 1;
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
	if (cm_read_frame(c->fd, &f))
		goto bad;
	if (!mp_find(f.hdr, "t", &t) || !mp_str_eq(t, "challenge")) {
		cm_frame_free(&f);
		goto bad;
	}
	cm_frame_free(&f);
	mp_init(&b);
	mp_map(&b, 3);
	mp_str(&b, "t");
	mp_str(&b, "hello");
	mp_kv_uint(&b, "version", 1);
	mp_str(&b, "role");
	mp_str(&b, "control");
	if (send_frame(c, &b, NULL, 0)) {
		mp_free(&b);
		goto bad;
	}
	mp_free(&b);
	if (cm_read_frame(c->fd, &c->welcome))
		goto bad;
	if (!mp_find(c->welcome.hdr, "t", &t) || !mp_str_eq(t, "welcome")) {
		cm_frame_free(&c->welcome);
		goto bad;
	}
	if (pthread_create(&c->reader, NULL, reader_main, c))
		goto bad;
	return 0;
bad:
	close(c->fd);
	return ENODEV;
}
