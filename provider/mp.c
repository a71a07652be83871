#include "mp.h"

#include <stdlib.h>

#include "palloc.h"
#include <string.h>

void mp_init(struct mp_buf *b)
{
	b->p = NULL;
	b->len = b->cap = 0;
	b->failed = false;
}

void mp_free(struct mp_buf *b)
{
	shca_free(b->p);
	mp_init(b);
}

static void put(struct mp_buf *b, const void *src, size_t n)
{
	if (b->failed)
		return;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 256;
		uint8_t *p;

		while (cap < b->len + n)
			cap *= 2;
		p = shca_realloc(b->p, cap);
		if (!p) {
			b->failed = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, src, n);
	b->len += n;
}

static void put_be(struct mp_buf *b, uint8_t tag, uint64_t v, int bytes)
{
	uint8_t out[9];
	int i;

	out[0] = tag;
	for (i = 0; i < bytes; i++)
		out[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
	put(b, out, 1 + bytes);
}

static void container(struct mp_buf *b, uint32_t n, uint8_t fix, uint8_t t16)
{
	if (n < 16) {
		uint8_t c = fix | n;

		put(b, &c, 1);
	} else if (n <= 0xffff) {
		put_be(b, t16, n, 2);
	} else {
		put_be(b, t16 + 1, n, 4);
	}
}

void mp_map(struct mp_buf *b, uint32_t n) { container(b, n, 0x80, 0xde); }
void mp_arr(struct mp_buf *b, uint32_t n) { container(b, n, 0x90, 0xdc); }

void mp_str(struct mp_buf *b, const char *s)
{
	size_t n = strlen(s);

	if (n < 32) {
		uint8_t c = 0xa0 | n;

		put(b, &c, 1);
	} else if (n <= 0xff) {
		put_be(b, 0xd9, n, 1);
	} else if (n <= 0xffff) {
		put_be(b, 0xda, n, 2);
	} else {
		put_be(b, 0xdb, n, 4);
	}
	put(b, s, n);
}

void mp_bin(struct mp_buf *b, const void *p, uint32_t n)
{
	if (n <= 0xff)
		put_be(b, 0xc4, n, 1);
	else if (n <= 0xffff)
		put_be(b, 0xc5, n, 2);
	else
		put_be(b, 0xc6, n, 4);
	put(b, p, n);
}

void mp_uint(struct mp_buf *b, uint64_t v)
{
	if (v < 128) {
		uint8_t c = v;

		put(b, &c, 1);
	} else if (v <= 0xff) {
		put_be(b, 0xcc, v, 1);
	} else if (v <= 0xffff) {
		put_be(b, 0xcd, v, 2);
	} else if (v <= 0xffffffffULL) {
		put_be(b, 0xce, v, 4);
	} else {
		put_be(b, 0xcf, v, 8);
	}
}

void mp_int(struct mp_buf *b, int64_t v)
{
	if (v >= 0) {
		mp_uint(b, (uint64_t)v);
	} else if (v >= -32) {
		uint8_t c = (uint8_t)(int8_t)v;

		put(b, &c, 1);
	} else {
		put_be(b, 0xd3, (uint64_t)v, 8);
	}
}

void mp_bool(struct mp_buf *b, bool v)
{
	uint8_t c = v ? 0xc3 : 0xc2;

	put(b, &c, 1);
}

void mp_nil(struct mp_buf *b)
{
	uint8_t c = 0xc0;

	put(b, &c, 1);
}

void mp_raw(struct mp_buf *b, const void *p, size_t n)
{
	put(b, p, n);
}

void mp_kv_uint(struct mp_buf *b, const char *key, uint64_t v)
{
	mp_str(b, key);
	mp_uint(b, v);
}

/* -- reading ----------------------------------------------------------------------- */

static uint64_t be(const uint8_t *p, int n)
{
	uint64_t v = 0;
	int i;

	for (i = 0; i < n; i++)
		v = v << 8 | p[i];
	return v;
}

/* The header of the value at p: its kind, its length (str/bin bytes, container
 * elements) or value (ints), and where its body starts. */
struct head {
	enum mp_kind kind;
	uint64_t n;
	const uint8_t *body;
};

static bool head(const uint8_t *p, const uint8_t *end, struct head *h)
{
	uint8_t c;
	int w = 0;

	if (!p || p >= end)
		return false;
	c = *p;
	h->body = p + 1;
	if (c <= 0x7f) {
		h->kind = MP_UINT;
		h->n = c;
		return true;
	}
	if (c >= 0xe0) {
		h->kind = MP_INT;
		h->n = (uint64_t)(int64_t)(int8_t)c;
		return true;
	}
	if ((c & 0xf0) == 0x80 || (c & 0xf0) == 0x90) {
		h->kind = (c & 0xf0) == 0x80 ? MP_MAP : MP_ARR;
		h->n = c & 0x0f;
		return true;
	}
	if ((c & 0xe0) == 0xa0) {
		h->kind = MP_STR;
		h->n = c & 0x1f;
		return true;
	}
	switch (c) {
	case 0xc0: h->kind = MP_NIL; h->n = 0; return true;
	case 0xc2: case 0xc3: h->kind = MP_BOOL; h->n = c & 1; return true;
	case 0xcc: h->kind = MP_UINT; w = 1; break;
	case 0xcd: h->kind = MP_UINT; w = 2; break;
	case 0xce: h->kind = MP_UINT; w = 4; break;
	case 0xcf: h->kind = MP_UINT; w = 8; break;
	case 0xd0: h->kind = MP_INT; w = 1; break;
	case 0xd1: h->kind = MP_INT; w = 2; break;
	case 0xd2: h->kind = MP_INT; w = 4; break;
	case 0xd3: h->kind = MP_INT; w = 8; break;
	case 0xca: h->kind = MP_FLOAT; w = 4; break;
	case 0xcb: h->kind = MP_FLOAT; w = 8; break;
	case 0xd9: case 0xc4: h->kind = c == 0xd9 ? MP_STR : MP_BIN; w = 1; break;
	case 0xda: case 0xc5: h->kind = c == 0xda ? MP_STR : MP_BIN; w = 2; break;
	case 0xdb: case 0xc6: h->kind = c == 0xdb ? MP_STR : MP_BIN; w = 4; break;
	case 0xdc: h->kind = MP_ARR; w = 2; break;
	case 0xdd: h->kind = MP_ARR; w = 4; break;
	case 0xde: h->kind = MP_MAP; w = 2; break;
	case 0xdf: h->kind = MP_MAP; w = 4; break;
	default: return false;  /* ext types are refused, as the daemon refuses them */
	}
	if (end - h->body < w)
		return false;
	h->n = be(h->body, w);
	if (h->kind == MP_INT) {
		int shift = 64 - 8 * w;

		h->n = (uint64_t)(((int64_t)(h->n << shift)) >> shift);
	}
	h->body += w;
	return true;
}

static const uint8_t *skip_depth(const uint8_t *p, const uint8_t *end, int depth)
{
	struct head h;
	uint64_t i, items;

	if (depth > 32 || !head(p, end, &h))
		return NULL;
	switch (h.kind) {
	case MP_STR:
	case MP_BIN:
		if ((uint64_t)(end - h.body) < h.n)
			return NULL;
		return h.body + h.n;
	case MP_ARR:
	case MP_MAP:
		items = h.kind == MP_MAP ? 2 * h.n : h.n;
		/* every element takes at least one byte: a count beyond the bytes is bad */
		if (items > (uint64_t)(end - h.body))
			return NULL;
		p = h.body;
		for (i = 0; i < items && p; i++)
			p = skip_depth(p, end, depth + 1);
		return p;
	default:
		return h.body;
	}
}

const uint8_t *mp_skip(const uint8_t *p, const uint8_t *end)
{
	return skip_depth(p, end, 0);
}

enum mp_kind mp_kind(struct mp_val v)
{
	struct head h;

	return head(v.p, v.end, &h) ? h.kind : MP_BAD;
}

bool mp_get_uint(struct mp_val v, uint64_t *out)
{
	struct head h;

	if (!head(v.p, v.end, &h))
		return false;
	if (h.kind == MP_UINT || (h.kind == MP_INT && (int64_t)h.n >= 0)) {
		*out = h.n;
		return true;
	}
	if (h.kind == MP_BOOL) {
		*out = h.n;
		return true;
	}
	return false;
}

bool mp_get_str(struct mp_val v, const char **s, uint32_t *n)
{
	struct head h;

	if (!head(v.p, v.end, &h) || (h.kind != MP_STR && h.kind != MP_BIN) ||
	    (uint64_t)(v.end - h.body) < h.n)
		return false;
	*s = (const char *)h.body;
	*n = (uint32_t)h.n;
	return true;
}

static bool get_container(struct mp_val v, enum mp_kind kind, uint32_t *n,
			  struct mp_val *first)
{
	struct head h;

	if (!head(v.p, v.end, &h) || h.kind != kind)
		return false;
	*n = (uint32_t)h.n;
	first->p = h.body;
	first->end = v.end;
	return true;
}

bool mp_get_arr(struct mp_val v, uint32_t *n, struct mp_val *first)
{
	return get_container(v, MP_ARR, n, first);
}

bool mp_get_map(struct mp_val v, uint32_t *n, struct mp_val *first)
{
	return get_container(v, MP_MAP, n, first);
}

bool mp_next(struct mp_val *v)
{
	const uint8_t *p = mp_skip(v->p, v->end);

	if (!p)
		return false;
	v->p = p;
	return true;
}

bool mp_str_eq(struct mp_val v, const char *s)
{
	const char *p;
	uint32_t n;

	return mp_get_str(v, &p, &n) && n == strlen(s) && memcmp(p, s, n) == 0;
}

bool mp_find(struct mp_val map, const char *key, struct mp_val *out)
{
	struct mp_val k;
	uint32_t n, i;

	if (!mp_get_map(map, &n, &k))
		return false;
	for (i = 0; i < n; i++) {
		struct mp_val val = k;

		if (!mp_next(&val))
			return false;
		if (mp_str_eq(k, key)) {
			*out = val;
			return true;
		}
		k = val;
		if (!mp_next(&k))
			return false;
	}
	return false;
}

bool mp_find_uint(struct mp_val map, const char *key, uint64_t *out)
{
	struct mp_val v;

	return mp_find(map, key, &v) && mp_get_uint(v, out);
}
