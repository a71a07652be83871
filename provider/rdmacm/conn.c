/* librdmacm's own connection to the softhca daemon: the UNIX socket of SOFTHCA_SOCKET
 * and the HELLO as a control session (docs/protocol.md); the requests, their replies
 * and the reader thread are the provider's core (../core.c), which hands the pushed
 * rdma_cm events to cma.c's callback (it queues them on their ids' event channels). */
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

/* The reader thread's, for a frame that is no reply of ours: an event, else dropped. */
static void on_frame(void *owner, struct shca_frame *f)
{
	struct cm_conn *c = owner;
	struct mp_val t;

	if (mp_find(f->hdr, SHCA_KEY_T, &t) && mp_str_eq(t, SHCA_T_EVENT))
		c->on_event(f);         /* keeps the frame, or frees it */
	else
		shca_frame_free(f);
}

void cm_begin(struct cm_conn *c, struct mp_buf *b, const char *verb, uint32_t nfields)
{
	shca_core_begin(&c->core, b, verb, nfields);
}

int cm_call(struct cm_conn *c, struct mp_buf *b, const void *payload, size_t plen,
	    struct shca_frame *r)
{
	const char *s;
	uint32_t n;
	int rc = shca_core_call(&c->core, b, payload, plen, r);

	if (rc)
		return rc;
	rc = shca_reply_errno(r);
	if (!rc)
		return 0;
	if (getenv("SOFTHCA_CM_DEBUG") && shca_reply_msg(r, &s, &n))
		cm_log("%.*s", (int)n, s);
	shca_frame_free(r);
	return rc;
}

int cm_connect(struct cm_conn *c, const char *path, void (*on_event)(struct shca_frame *f))
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct shca_frame f;
	struct mp_val t;
	int fd;

	memset(c, 0, sizeof(*c));
	shca_core_init(&c->core, 0, MAX_FRAME);
	c->core.on_frame = on_frame;
	c->core.owner = c;
	c->on_event = on_event;
	if (!path || strlen(path) >= sizeof(sa.sun_path))
		return ENODEV;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		goto bad;
	if (shca_frame_read(fd, &f, MAX_FRAME))
		goto bad;
	if (!mp_find(f.hdr, SHCA_KEY_T, &t) || !mp_str_eq(t, SHCA_T_CHALLENGE)) {
		shca_frame_free(&f);
		goto bad;
	}
	shca_frame_free(&f);
	if (shca_frame_hello(fd))
		goto bad;
	if (shca_frame_read(fd, &c->welcome, MAX_FRAME))
		goto bad;
	if (!mp_find(c->welcome.hdr, SHCA_KEY_T, &t) || !mp_str_eq(t, SHCA_T_WELCOME)) {
		shca_frame_free(&c->welcome);
		goto bad;
	}
	c->core.fd = fd;
	if (shca_thread_start(&c->reader, shca_core_reader, &c->core))
		goto bad;
	return 0;
bad:
	c->core.fd = -1;
	close(fd);
	return ENODEV;
}
