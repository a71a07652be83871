/* A small msgpack encoder and a bounded, non-allocating reader: what the control
 * protocol's headers need (docs/protocol.md: maps with str keys; nil, bool, int, str,
 * bin, array and map values). */
#ifndef SOFTHCA_MP_H
#define SOFTHCA_MP_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

struct mp_buf {
	uint8_t *p;
	size_t len, cap;
	bool failed;            /* out of memory: the frame is not sent */
};

void mp_init(struct mp_buf *b);
void mp_free(struct mp_buf *b);
void mp_map(struct mp_buf *b, uint32_t n);
void mp_arr(struct mp_buf *b, uint32_t n);
void mp_str(struct mp_buf *b, const char *s);
void mp_bin(struct mp_buf *b, const void *p, uint32_t n);
void mp_uint(struct mp_buf *b, uint64_t v);
void mp_int(struct mp_buf *b, int64_t v);
void mp_bool(struct mp_buf *b, bool v);
void mp_nil(struct mp_buf *b);
/* Bytes that are already msgpack (values encoded into another buffer). */
void mp_raw(struct mp_buf *b, const void *p, size_t n);
/* "key": unsigned value, the common case of a request field. */
void mp_kv_uint(struct mp_buf *b, const char *key, uint64_t v);

/* Reading: a value is the span [p, end). Each reader returns the byte after what it
 * read, or NULL if the bytes are not that kind of value or run past end. */
struct mp_val {
	const uint8_t *p, *end;
};
enum mp_kind { MP_BAD, MP_NIL, MP_BOOL, MP_UINT, MP_INT, MP_FLOAT, MP_STR, MP_BIN,
	       MP_ARR, MP_MAP };
enum mp_kind mp_kind(struct mp_val v);
const uint8_t *mp_skip(const uint8_t *p, const uint8_t *end);
bool mp_get_uint(struct mp_val v, uint64_t *out);
bool mp_get_str(struct mp_val v, const char **s, uint32_t *n);
/* A container's count and the first element (or key); false when v is not one. */
bool mp_get_arr(struct mp_val v, uint32_t *n, struct mp_val *first);
bool mp_get_map(struct mp_val v, uint32_t *n, struct mp_val *first);
/* The element after v (for walking arrays and maps). */
bool mp_next(struct mp_val *v);
/* The value of map entry `key`; false when v is not a map or has no such key. */
bool mp_find(struct mp_val map, const char *key, struct mp_val *out);
bool mp_find_uint(struct mp_val map, const char *key, uint64_t *out);
bool mp_str_eq(struct mp_val v, const char *s);

#endif
