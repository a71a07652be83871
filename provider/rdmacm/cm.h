/* softhca's librdmacm (docs/native.md, "The connection manager"): rdma_cm calls become
 * cm_* control requests to the daemon, whose connection manager talks to the peer's
 * daemon; the QPs are the provider's, moved through their states here with verbs. */
#ifndef SOFTHCA_CM_H
#define SOFTHCA_CM_H

#include <pthread.h>
#include <stdint.h>

#include "../frame.h"
#include "../mp.h"

struct cm_conn {
	int fd;
	pthread_t reader;
	pthread_mutex_t lock, call_lock;
	pthread_cond_t cond;
	uint32_t next_id, want_id;
	struct shca_frame reply, welcome;
	int reply_ready, dead;
};

int cm_connect(struct cm_conn *c, const char *path);
void cm_begin(struct cm_conn *c, struct mp_buf *b, const char *verb, uint32_t nfields);
int cm_call(struct cm_conn *c, struct mp_buf *b, const void *payload, size_t plen,
	    struct shca_frame *r);
/* The reader thread's: a pushed event, queued on its channel (cma.c). */
void cm_take_event(struct shca_frame *f);
void cm_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
