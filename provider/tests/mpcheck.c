/* mp.c, the provider's msgpack codec, on its own (tests/unit/test_mp_codec.py drives it).
 *
 * One command a line on stdin, one answer a line on stdout:
 *
 *   enc KIND ARG  the value mp.c encodes, as hex. KIND: uint N, int N (decimal), str N
 *                 (N bytes 'a' + i % 26), bin N (N bytes i & 0xff), arr N (N nils),
 *                 map N (keys "k0".."k<N-1>", key i holding uint i), nil, bool 0|1.
 *   dec HEX       the bytes HEX, copied into a buffer of exactly their size, read with
 *                 mp.c's reader: "bad" when mp_skip refuses them or leaves bytes over,
 *                 else the value rendered (below), each map entry also found by mp_find.
 *
 * A rendered value: u<n> (an unsigned int), neg (a negative int: the reader has no
 * signed getter, and mp_get_uint must refuse it), float, nil, true, false, s<hex> (a
 * str), b<hex> (a bin), [v,v,...], {k:v,...}. The Python test computes what it expects
 * from its own values and judges with Python's msgpack.
 *
 * Built with AddressSanitizer (provider/Makefile), so a read past a buffer is an error
 * exit, not a lucky answer. The allocator below stands in for palloc.c's private pages,
 * which AddressSanitizer cannot see into: over malloc, every byte the encoder writes
 * is checked too. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mp.h"
#include "../palloc.h"
#include "hex.h"

void *shca_alloc(size_t n) { return calloc(1, n ? n : 1); }
void *shca_realloc(void *p, size_t n) { return realloc(p, n); }
void shca_free(void *p) { free(p); }

static void put_hex(const uint8_t *p, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		printf("%02x", p[i]);
}

static int encode(const char *kind, const char *arg)
{
	struct mp_buf b;
	unsigned long long n = arg ? strtoull(arg, NULL, 10) : 0;
	unsigned long long i;
	uint8_t *bytes;

	mp_init(&b);
	if (!strcmp(kind, "uint")) {
		mp_uint(&b, n);
	} else if (!strcmp(kind, "int")) {
		mp_int(&b, strtoll(arg, NULL, 10));
	} else if (!strcmp(kind, "str")) {
		char *s = malloc(n + 1);

		for (i = 0; i < n; i++)
			s[i] = (char)('a' + i % 26);
		s[n] = 0;
		mp_str(&b, s);
		free(s);
	} else if (!strcmp(kind, "bin")) {
		bytes = malloc(n ? n : 1);
		for (i = 0; i < n; i++)
			bytes[i] = (uint8_t)i;
		mp_bin(&b, bytes, (uint32_t)n);
		free(bytes);
	} else if (!strcmp(kind, "arr")) {
		mp_arr(&b, (uint32_t)n);
		for (i = 0; i < n; i++)
			mp_nil(&b);
	} else if (!strcmp(kind, "map")) {
		mp_map(&b, (uint32_t)n);
		for (i = 0; i < n; i++) {
			char key[32];

			snprintf(key, sizeof(key), "k%llu", i);
			mp_kv_uint(&b, key, i);
		}
	} else if (!strcmp(kind, "nil")) {
		mp_nil(&b);
	} else if (!strcmp(kind, "bool")) {
		mp_bool(&b, n != 0);
	} else {
		fprintf(stderr, "mpcheck: no such kind %s\n", kind);
		return 2;
	}
	if (b.failed) {
		fprintf(stderr, "mpcheck: out of memory\n");
		return 1;
	}
	put_hex(b.p, b.len);
	putchar('\n');
	mp_free(&b);
	return 0;
}

static void render(struct mp_val v);

static void render_str(struct mp_val v, char tag)
{
	const char *s;
	uint32_t n;

	if (!mp_get_str(v, &s, &n)) {
		printf("?");
		return;
	}
	putchar(tag);
	put_hex((const uint8_t *)s, n);
}

/* A map's entries, each also looked up by key with mp_find, which must land on that
 * very value (the test's maps have no key twice); in maps of up to 256 entries, as each
 * lookup walks the map from its start. */
static void render_map(struct mp_val v)
{
	struct mp_val k, val, found;
	uint32_t n, i;

	mp_get_map(v, &n, &k);
	putchar('{');
	for (i = 0; i < n; i++) {
		const char *s;
		uint32_t len;

		val = k;
		mp_next(&val);
		if (i)
			putchar(',');
		render(k);
		putchar(':');
		render(val);
		if (n <= 256 && mp_kind(k) == MP_STR && mp_get_str(k, &s, &len) && len < 64 &&
		    !memchr(s, 0, len)) {
			char key[64];

			memcpy(key, s, len);
			key[len] = 0;
			if (!mp_find(v, key, &found))
				printf("!notfound");
			else if (found.p != val.p)
				printf("!elsewhere");
		}
		k = val;
		mp_next(&k);
	}
	putchar('}');
}

static void render(struct mp_val v)
{
	struct mp_val e;
	uint64_t u;
	uint32_t n, i;

	switch (mp_kind(v)) {
	case MP_NIL: printf("nil"); break;
	case MP_BOOL: mp_get_uint(v, &u); printf(u ? "true" : "false"); break;
	case MP_UINT: mp_get_uint(v, &u); printf("u%llu", (unsigned long long)u); break;
	case MP_INT:
		if (mp_get_uint(v, &u))
			printf("u%llu", (unsigned long long)u);    /* a signed format, value >= 0 */
		else
			printf("neg");
		break;
	case MP_FLOAT: printf("float"); break;
	case MP_STR: render_str(v, 's'); break;
	case MP_BIN: render_str(v, 'b'); break;
	case MP_ARR:
		mp_get_arr(v, &n, &e);
		putchar('[');
		for (i = 0; i < n; i++) {
			if (i)
				putchar(',');
			render(e);
			mp_next(&e);
		}
		putchar(']');
		break;
	case MP_MAP: render_map(v); break;
	default: printf("?"); break;
	}
}

static int decode(const char *hex)
{
	size_t n = strlen(hex) / 2, i;
	/* exactly n bytes (malloc(0) for none): any read past them is AddressSanitizer's */
	uint8_t *buf = malloc(n);
	struct mp_val v;

	for (i = 0; i < n; i++) {
		int hi = hex_nibble(hex[2 * i]), lo = hex_nibble(hex[2 * i + 1]);

		if (hi < 0 || lo < 0) {
			fprintf(stderr, "mpcheck: bad hex\n");
			free(buf);
			return 2;
		}
		buf[i] = (uint8_t)(hi << 4 | lo);
	}
	v.p = buf;
	v.end = buf + n;
	if (mp_skip(v.p, v.end) != v.end)
		printf("bad");
	else
		render(v);
	putchar('\n');
	free(buf);
	return 0;
}

int main(void)
{
	static char line[1 << 22];

	while (fgets(line, sizeof(line), stdin)) {
		char *cmd = strtok(line, " \n");
		char *a = strtok(NULL, " \n");
		char *b = strtok(NULL, " \n");
		int rc;

		if (!cmd)
			continue;
		if (!strcmp(cmd, "enc"))
			rc = encode(a ? a : "", b);
		else if (!strcmp(cmd, "dec"))
			rc = decode(a ? a : "");
		else
			rc = 2;
		if (rc)
			return rc;
		fflush(stdout);
	}
	return 0;
}
