/* The control protocol's framing (docs/protocol.md: u32 L, u32 H, an H-byte msgpack
 * header, a raw payload; L counts H's 4 bytes, the header and the payload), shared by
 * the provider (conn.c) and softhca's librdmacm (rdmacm/conn.c), through their common
 * core (core.c, which locks and sets the limit); these only move whole frames over a
 * socket. */
#ifndef SOFTHCA_FRAME_H
#define SOFTHCA_FRAME_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "mp.h"
#include "wire.h"

/* One frame read: buf (malloc'ed) holds the header and the payload, len bytes. */
struct shca_frame {
	uint8_t *buf;
	size_t len;
	struct mp_val hdr;
	uint8_t *payload;
	size_t payload_len;
};

/* 0, or -1 on a read error, end of file, or a frame whose L is above max_frame or
 * whose H does not fit in it (then the stream cannot be resynchronised). */
int shca_frame_read(int fd, struct shca_frame *f, uint32_t max_frame);
void shca_frame_free(struct shca_frame *f);
/* The header b and plen payload bytes as one frame: 0, ENOMEM if b ran out of memory
 * while it was built, or EIO. Not locked: a caller with several writers locks. */
int shca_frame_write(int fd, const struct mp_buf *b, const void *payload, size_t plen);
/* A HELLO's map opened with its common fields (t, version, role) and room for
 * ``extra`` more entries, which the caller adds. */
void shca_hello_begin(struct mp_buf *b, const char *role, uint32_t extra);
/* The HELLO that opens a control session (after the daemon's challenge). */
int shca_frame_hello(int fd);
/* pthread_create with every signal blocked in the new thread (it inherits the
 * creator's mask, set full around the call): a signal the program sends itself is
 * then taken by one of its own threads, never by a library's reader. 0 or an errno. */
int shca_thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

#endif
