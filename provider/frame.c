/* Frames over the daemon's socket (frame.h): reads and writes that go on through
 * short transfers and EINTR until the whole frame has moved. */
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "frame.h"
#include "palloc.h"

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

static int write_all(int fd, struct iovec *iov, int n)
{
	while (n) {
		ssize_t w = writev(fd, iov, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		while (n && (size_t)w >= iov->iov_len) {
			w -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n) {
			iov->iov_base = (uint8_t *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
	return 0;
}

int shca_frame_read(int fd, struct shca_frame *f, uint32_t max_frame)
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
	if (l < 4 || l > max_frame || h > l - 4)
		return -1;
	f->len = l - 4;
	f->buf = shca_alloc(f->len ? f->len : 1);
	if (!f->buf || read_full(fd, f->buf, f->len)) {
		shca_free(f->buf);
		f->buf = NULL;
		return -1;
	}
	f->hdr.p = f->buf;
	f->hdr.end = f->buf + h;
	f->payload = f->buf + h;
	f->payload_len = f->len - h;
	return 0;
}

void shca_frame_free(struct shca_frame *f)
{
	shca_free(f->buf);
	memset(f, 0, sizeof(*f));
}

int shca_frame_write(int fd, const struct mp_buf *b, const void *payload, size_t plen)
{
	uint32_t pre[2];
	struct iovec iov[3];

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
	return write_all(fd, iov, plen ? 3 : 2) ? EIO : 0;
}

void shca_hello_begin(struct mp_buf *b, const char *role, uint32_t extra)
{
	mp_init(b);
	mp_map(b, 3 + extra);
	mp_str(b, SHCA_KEY_T);
	mp_str(b, SHCA_T_HELLO);
	mp_kv_uint(b, SHCA_R_VERSION, SHCA_PROTOCOL_VERSION);
	mp_str(b, SHCA_R_ROLE);
	mp_str(b, role);
}

int shca_frame_hello(int fd)
{
	struct mp_buf b;
	int rc;

	shca_hello_begin(&b, SHCA_ROLE_CONTROL, 0);
	rc = shca_frame_write(fd, &b, NULL, 0);
	mp_free(&b);
	return rc;
}

int shca_thread_start(pthread_t *t, void *(*fn)(void *), void *arg)
{
	sigset_t all, old;
	int rc;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(t, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}
