/* The control connection's core, shared by the provider (conn.c) and softhca's
 * librdmacm (rdmacm/conn.c): requests numbered and sent one at a time, the reader
 * thread that takes each reply to the caller waiting for it and hands every other
 * frame (pushed completions, rdma_cm events, replies of its owner's own requests) to
 * its owner's callback, and the errno names of an "err" reply. The socket, its HELLO
 * and what a pushed frame means stay each library's. */
#ifndef SOFTHCA_CORE_H
#define SOFTHCA_CORE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "mp.h"

struct shca_core {
	int fd;
	pthread_mutex_t lock;       /* reply, reply_ready, dead; the owner's pushed state */
	pthread_cond_t cond;        /* the reply came, or the connection ended */
	pthread_mutex_t call_lock;  /* one request in flight at a time */
	pthread_mutex_t send_lock;  /* whole frames on the socket */
	uint32_t next_id;
	uint32_t want_id;
	uint32_t id_limit;          /* request ids run from 1 to below this (0: 2^32) */
	uint32_t max_frame;         /* a frame above this is a broken peer */
	struct shca_frame reply;
	int reply_ready;
	int dead;
	/* The reader thread's: each frame that is not the awaited reply goes to on_frame
	 * (which keeps or frees it); once the socket ends, on_dead (or NULL) is called
	 * under lock. dispatch (or NULL) is held from a frame's first byte until it is
	 * dealt with. */
	void (*on_frame)(void *owner, struct shca_frame *f);
	void (*on_dead)(void *owner);
	void *owner;
	pthread_mutex_t *dispatch;
};

/* A core with no socket yet (fd -1); the caller sets fd, the callbacks and owner. */
void shca_core_init(struct shca_core *c, uint32_t id_limit, uint32_t max_frame);
/* Starts a request: takes call_lock (shca_core_call releases it), and begins a map of
 * nfields + 2 entries whose "t" and "id" are written. */
void shca_core_begin(struct shca_core *c, struct mp_buf *b, const char *verb,
		     uint32_t nfields);
/* Sends b (freed) and waits for its reply: 0 with *r the reply, "ok" or "err" (free it
 * with shca_frame_free), or EIO when the connection is gone (*r empty). */
int shca_core_call(struct shca_core *c, struct mp_buf *b, const void *payload, size_t plen,
		   struct shca_frame *r);
/* One frame on the socket, whole among the other writers': 0 or an errno. */
int shca_core_send(struct shca_core *c, const struct mp_buf *b, const void *payload,
		   size_t plen);
/* The reader thread (shca_thread_start's fn, arg the core): until the socket ends. */
void *shca_core_reader(void *core);
/* 0 for an "ok" reply, else its "errno" name's value (EIO for a name not known). */
int shca_reply_errno(const struct shca_frame *r);
/* The "msg" of a reply (a refusal's reason, for the log): 1 with *s, *n set, or 0. */
int shca_reply_msg(const struct shca_frame *r, const char **s, uint32_t *n);
/* The errno value of a name of protocol/errors.py's ERRNO_NAMES (n bytes), or EIO. */
int shca_errno(const char *name, uint32_t n);

#endif
