/* The provider's control-protocol encodings (wire_enc.c, wire.h) on their own
 * (tests/unit/test_wire_codec.py drives it and judges with the Python decoders).
 *
 * One command a line on stdin, one answer a line on stdout:
 *
 *   req VERB       a request of VERB with every field wire.h's table gives it, each
 *                  value by the rule below, as the header's hex (shca_wire_begin, id 7).
 *   post_send UD ALL OPCODE WR_ID SEND_FLAGS IMM RKEY RADDR CMP SWAP INV AH RQPN RQKEY
 *             MW MR_LKEY BADDR BLEN BACCESS NSGE [ADDR LEN LKEY]...
 *                  a post_send of one struct ibv_send_wr with those fields (decimal;
 *                  IMM in host order, set with htonl as an application does), encoded
 *                  by shca_wire_send_wr and shca_wire_post_send (qp 3), as hex.
 *   post_recv WR_ID NSGE [ADDR LEN LKEY]...
 *                  a post_recv (qp 3) of one struct ibv_recv_wr, by shca_wire_recv_wr.
 *   check HEX      a request header (what Python encoded) read against wire.h's table:
 *                  "ok VERB N" (N fields), or "bad <why>": an unknown verb or key, a
 *                  required field missing, a value not of its field's type.
 *   reply VERB HEX an ok reply to VERB (what the daemon answered) read against wire.h's
 *                  replies' table, the maps nested in it against shca_wire_maps by
 *                  path ("query_device.attr"): "ok VERB N" (N fields) or "bad <why>".
 *   frame NAME HEX a frame of shca_wire_maps' NAME ("welcome", "err", "wc", "cm_event",
 *                  "mkey_configure.crypto", ...) read the same way.
 *   wc HEX         a pushed "wc" frame's header: each WC of "wcs" read by shca_wire_wc,
 *                  "cq=<n>" then per WC "wr_id,status,opcode,byte_len,qp_num,wc_flags,
 *                  vendor_err,src_qp,imm_data(host order),invalidated_rkey".
 *   errno NAME     shca_errno_of(NAME) as a number.
 *   hello          the HELLO shca_hello_begin writes for a control session, as hex.
 *
 * The value of a field by type in a "req": u, i and n its upper bound (hi); b true; s
 * and y max(lo, min(hi, 3)) bytes ('x', 0xab); a an empty array, m an empty map, both
 * only when lo is 0; a field of a nested type the rule cannot fill ("wrs": one WR by
 * the encoders above, "credits": [[1, 1]], "pieces": [[0, 0, 4096]]) is named, any
 * other with lo > 0 is
 * "unfilled <key>". The Python test computes the same values from protocol/'s tables.
 *
 * Built with AddressSanitizer and UBSan (provider/Makefile), as mpcheck.c is; the
 * allocator below stands in for palloc.c's private pages. Linked with frame.c (its
 * HELLO) and wire_enc.c and mp.c: no libibverbs object. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHCA_WIRE_TABLES
#include "../frame.h"
#include "../palloc.h"
#include "../wire_enc.h"
#include "hex.h"

void *shca_alloc(size_t n) { return calloc(1, n ? n : 1); }
void *shca_realloc(void *p, size_t n) { return realloc(p, n); }
void shca_free(void *p) { free(p); }

static void put_hex(const struct mp_buf *b)
{
	size_t i;

	for (i = 0; i < b->len; i++)
		printf("%02x", b->p[i]);
	putchar('\n');
}

static char *next_tok(void)
{
	return strtok(NULL, " \n");
}

static unsigned long long next_num(void)
{
	char *t = next_tok();

	return t ? strtoull(t, NULL, 10) : 0;
}

static int read_sges(struct ibv_sge *sg, int n)
{
	int i;

	if (n < 0 || n > SHCA_MAX_SGE)
		return -1;
	for (i = 0; i < n; i++) {
		sg[i].addr = next_num();
		sg[i].length = (uint32_t)next_num();
		sg[i].lkey = (uint32_t)next_num();
	}
	return 0;
}

/* The numbers of a post_send command set as an application sets them: each in the
 * member of the unions its opcode and QP type use (wr.rdma, wr.atomic or wr.ud;
 * imm_data or invalidate_rkey; bind_mw). */
static void one_send_wr(struct mp_buf *wrs, int *all)
{
	static struct ibv_sge sg[SHCA_MAX_SGE];
	unsigned long long x[20];
	struct ibv_send_wr wr;
	struct ibv_mr mr;
	enum ibv_wr_opcode op;
	int i, ud;

	for (i = 0; i < 20; i++)
		x[i] = next_num();
	memset(&wr, 0, sizeof(wr));
	memset(&mr, 0, sizeof(mr));
	ud = (int)x[0];
	*all = (int)x[1];
	wr.opcode = op = (enum ibv_wr_opcode)x[2];
	wr.wr_id = x[3];
	wr.send_flags = (unsigned)x[4];
	if (op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM)
		wr.imm_data = htonl((uint32_t)x[5]);
	if (op == IBV_WR_SEND_WITH_INV || op == IBV_WR_LOCAL_INV)
		wr.invalidate_rkey = (uint32_t)x[10];
	wr.wr.rdma.rkey = (uint32_t)x[6];
	wr.wr.rdma.remote_addr = x[7];
	if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD ||
	    (op == IBV_WR_ATOMIC_WRITE && x[19] == 0)) {
		wr.wr.atomic.rkey = (uint32_t)x[6];
		wr.wr.atomic.remote_addr = x[7];
		wr.wr.atomic.compare_add = x[8];
		wr.wr.atomic.swap = x[9];
	}
	if (ud) {
		wr.wr.ud.remote_qpn = (uint32_t)x[12];
		wr.wr.ud.remote_qkey = (uint32_t)x[13];
	}
	if (op == IBV_WR_BIND_MW) {
		mr.lkey = (uint32_t)x[15];
		wr.bind_mw.rkey = (uint32_t)x[6];
		wr.bind_mw.bind_info.mr = &mr;
		wr.bind_mw.bind_info.addr = x[16];
		wr.bind_mw.bind_info.length = x[17];
		wr.bind_mw.bind_info.mw_access_flags = (unsigned)x[18];
	}
	wr.num_sge = (int)x[19];
	if (read_sges(sg, wr.num_sge))
		wr.num_sge = 0;
	wr.sg_list = sg;
	shca_wire_send_wr(wrs, &wr, sg, wr.num_sge, ud, (uint32_t)x[11], (uint32_t)x[14]);
}

static void post_send(void)
{
	struct mp_buf b, wrs;
	int all = 0;

	mp_init(&wrs);
	one_send_wr(&wrs, &all);
	shca_wire_begin(&b, SHCA_V_POST_SEND, 7, SHCA_POST_SEND_NFIELDS(all));
	shca_wire_post_send(&b, 3, &wrs, 1, all);
	put_hex(&b);
	mp_free(&wrs);
	mp_free(&b);
}

static void post_recv(void)
{
	static struct ibv_sge sg[SHCA_MAX_SGE];
	struct ibv_recv_wr wr;
	struct mp_buf b;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = next_num();
	wr.num_sge = (int)next_num();
	if (read_sges(sg, wr.num_sge))
		wr.num_sge = 0;
	wr.sg_list = sg;
	shca_wire_begin(&b, SHCA_V_POST_RECV, 7, SHCA_NREQ_POST_RECV);
	mp_kv_uint(&b, SHCA_K_QP, 3);
	mp_str(&b, SHCA_K_WRS);
	mp_arr(&b, 1);
	shca_wire_recv_wr(&b, &wr);
	put_hex(&b);
	mp_free(&b);
}

static const struct shca_wire_req *find_req(const char *verb, uint32_t n)
{
	int i;

	for (i = 0; i < SHCA_REQ_COUNT; i++)
		if (strlen(shca_wire_reqs[i].verb) == n && !memcmp(shca_wire_reqs[i].verb, verb, n))
			return &shca_wire_reqs[i];
	return NULL;
}

static void fill(struct mp_buf *b, const struct shca_wire_field *f)
{
	uint64_t len = f->hi < 3 ? f->hi : 3;
	uint8_t bytes[256];

	if ((uint64_t)f->lo > len)
		len = (uint64_t)f->lo;
	memset(bytes, f->type == 's' ? 'x' : 0xab, sizeof(bytes));
	switch (f->type) {
	case 'u': case 'i': case 'n': mp_uint(b, f->hi); break;
	case 'b': mp_bool(b, true); break;
	case 's': bytes[len] = 0; mp_str(b, (const char *)bytes); break;
	case 'y': mp_bin(b, bytes, (uint32_t)len); break;
	case 'a': mp_arr(b, 0); break;
	case 'm': mp_map(b, 0); break;
	}
}

static int request(const char *verb)
{
	const struct shca_wire_req *r = verb ? find_req(verb, (uint32_t)strlen(verb)) : NULL;
	struct mp_buf b;
	unsigned i;

	if (!r) {
		printf("unknown %s\n", verb ? verb : "");
		return 0;
	}
	for (i = 0; i < r->nfields; i++) {
		const struct shca_wire_field *f = &r->fields[i];

		if ((f->type == 'a' || f->type == 'm') && f->lo > 0 &&
		    strcmp(f->key, SHCA_K_WRS) && strcmp(f->key, SHCA_K_CREDITS) &&
		    strcmp(f->key, SHCA_K_PIECES)) {
			printf("unfilled %s\n", f->key);
			return 0;
		}
	}
	shca_wire_begin(&b, r->verb, 7, r->nfields);
	for (i = 0; i < r->nfields; i++) {
		const struct shca_wire_field *f = &r->fields[i];

		mp_str(&b, f->key);
		if (!strcmp(f->key, SHCA_K_CREDITS)) {
			mp_arr(&b, 1);
			mp_arr(&b, 2);
			mp_uint(&b, 1);
			mp_uint(&b, 1);
		} else if (!strcmp(f->key, SHCA_K_PIECES)) {
			mp_arr(&b, 1);
			mp_arr(&b, 3);
			mp_uint(&b, 0);
			mp_uint(&b, 0);
			mp_uint(&b, 4096);
		} else if (!strcmp(f->key, SHCA_K_WRS) && !strcmp(r->verb, SHCA_V_POST_SEND)) {
			static const struct ibv_sge sg = {.addr = 4096, .length = 8, .lkey = 5};
			struct ibv_send_wr wr = {.wr_id = 1, .opcode = IBV_WR_SEND, .num_sge = 1};

			mp_arr(&b, 1);
			shca_wire_send_wr(&b, &wr, &sg, 1, 0, 0, 0);
		} else if (!strcmp(f->key, SHCA_K_WRS)) {
			struct ibv_sge sg = {.addr = 4096, .length = 8, .lkey = 5};
			struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sg, .num_sge = 1};

			mp_arr(&b, 1);
			shca_wire_recv_wr(&b, &wr);
		} else {
			fill(&b, f);
		}
	}
	put_hex(&b);
	mp_free(&b);
	return 0;
}

/* The bytes of hex in a buffer of exactly their size (malloc'ed; NULL if not hex). */
static uint8_t *unhex(const char *hex, size_t *n)
{
	size_t i;
	uint8_t *buf;

	*n = strlen(hex) / 2;
	buf = malloc(*n ? *n : 1);
	for (i = 0; i < *n; i++) {
		int hi = hex_nibble(hex[2 * i]), lo = hex_nibble(hex[2 * i + 1]);

		if (hi < 0 || lo < 0) {
			free(buf);
			return NULL;
		}
		buf[i] = (uint8_t)(hi << 4 | lo);
	}
	return buf;
}

/* A value of a field of type (wire.h's letters; upper case: nil too). */
static int type_ok(char type, struct mp_val v)
{
	enum mp_kind k = mp_kind(v);

	if (type >= 'A' && type <= 'Z') {
		if (k == MP_NIL)
			return 1;
		type = (char)(type - 'A' + 'a');
	}
	switch (type) {
	case 'u': return k == MP_UINT || (k == MP_INT && mp_get_uint(v, &(uint64_t){0}));
	case 'i': return k == MP_UINT || k == MP_INT;
	case 'n': return k == MP_UINT || k == MP_INT || k == MP_FLOAT;
	case 'b': return k == MP_BOOL;
	case 's': return k == MP_STR;
	case 'y': return k == MP_BIN;
	case 'a': return k == MP_ARR;
	case 'm': return k == MP_MAP;
	}
	return 0;
}

static const struct shca_wire_req *find_map(const char *path)
{
	int i;

	for (i = 0; i < SHCA_WIRE_NMAPS; i++)
		if (!strcmp(shca_wire_maps[i].verb, path))
			return &shca_wire_maps[i];
	return NULL;
}

static int is_header_key(const char *key, uint32_t klen)
{
	return (klen == 1 && key[0] == 't') || (klen == 2 && !memcmp(key, "id", 2));
}

/* A map against a table: each key one of its fields (or t, id), of its type; every
 * required field there; with nest, a map-valued field whose path ("<path>.<key>") is
 * one of shca_wire_maps against that table too. Its fields counted in *fields; the
 * first fault written to why (0 returned). */
static int check_map(struct mp_val v, const struct shca_wire_req *r, const char *path,
		     int nest, unsigned *fields, char *why, size_t wn)
{
	struct mp_val k, val;
	uint32_t count, i;
	unsigned j;

	if (!mp_get_map(v, &count, &k)) {
		snprintf(why, wn, "%s is not a map", path);
		return 0;
	}
	for (i = 0; i < count; i++) {
		const char *key;
		uint32_t klen;

		val = k;
		mp_next(&val);
		if (!mp_get_str(k, &key, &klen)) {
			snprintf(why, wn, "key not a str");
			return 0;
		}
		if (!is_header_key(key, klen)) {
			for (j = 0; j < r->nfields; j++)
				if (strlen(r->fields[j].key) == klen &&
				    !memcmp(r->fields[j].key, key, klen))
					break;
			if (j == r->nfields) {
				snprintf(why, wn, "unknown field %.*s of %s", (int)klen, key, path);
				return 0;
			}
			if (!type_ok(r->fields[j].type, val)) {
				snprintf(why, wn, "field %s of %s is not of type %c",
					 r->fields[j].key, path, r->fields[j].type);
				return 0;
			}
			if (nest && mp_kind(val) == MP_MAP) {
				char sub[256];
				const struct shca_wire_req *m;
				unsigned inner = 0;

				snprintf(sub, sizeof(sub), "%s.%s", path, r->fields[j].key);
				m = find_map(sub);
				if (m && !check_map(val, m, sub, 1, &inner, why, wn))
					return 0;
			}
			(*fields)++;
		}
		k = val;
		mp_next(&k);
	}
	for (j = 0; j < r->nfields; j++) {
		if (r->fields[j].required && !mp_find(v, r->fields[j].key, &val)) {
			snprintf(why, wn, "missing %s of %s", r->fields[j].key, path);
			return 0;
		}
	}
	return 1;
}

/* "check HEX": a request header against the requests' table. */
static void check(const char *hex)
{
	size_t n;
	uint8_t *buf = unhex(hex, &n);
	struct mp_val v = {buf, buf + n}, t;
	const struct shca_wire_req *r;
	const char *s;
	uint32_t len, count;
	unsigned fields = 0;
	char why[512];

	if (!buf || mp_skip(v.p, v.end) != v.end || !mp_get_map(v, &count, &t)) {
		printf("bad not a map\n");
		goto out;
	}
	if (!mp_find(v, SHCA_KEY_T, &t) || !mp_get_str(t, &s, &len) || !(r = find_req(s, len))) {
		printf("bad unknown verb\n");
		goto out;
	}
	if (check_map(v, r, r->verb, 0, &fields, why, sizeof(why)))
		printf("ok %s %u\n", r->verb, fields);
	else
		printf("bad %s\n", why);
out:
	free(buf);
}

/* "reply VERB HEX": an ok reply to VERB against shca_wire_replies; "frame NAME HEX": a
 * frame of kind NAME against shca_wire_maps. "ok NAME N" (N fields at the top), or
 * "bad <why>". */
static void check_reply(const char *what, const char *name, const char *hex)
{
	size_t n;
	uint8_t *buf = unhex(hex, &n);
	struct mp_val v = {buf, buf + n}, t;
	const struct shca_wire_req *r;
	unsigned fields = 0;
	char why[512];

	if (!strcmp(what, "reply")) {
		r = find_req(name, (uint32_t)strlen(name));
		r = r ? &shca_wire_replies[r - shca_wire_reqs] : NULL;
	} else {
		r = find_map(name);
	}
	if (!r) {
		printf("bad no table %s\n", name);
	} else if (!buf || mp_skip(v.p, v.end) != v.end) {
		printf("bad not one value\n");
	} else if (!strcmp(what, "reply") &&
		   !(mp_find(v, SHCA_KEY_T, &t) && mp_str_eq(t, SHCA_T_OK))) {
		printf("bad not an ok reply\n");
	} else if (check_map(v, r, name, 1, &fields, why, sizeof(why))) {
		printf("ok %s %u\n", name, fields);
	} else {
		printf("bad %s\n", why);
	}
	free(buf);
}

static void wcs(const char *hex)
{
	size_t n;
	uint8_t *buf = unhex(hex, &n);
	struct mp_val v = {buf, buf + n}, list, w;
	uint64_t cq = 0;
	uint32_t count, i;
	struct ibv_wc wc;

	if (!buf || mp_skip(v.p, v.end) != v.end || !mp_find_uint(v, SHCA_R_CQ, &cq) ||
	    !mp_find(v, SHCA_R_WCS, &list) || !mp_get_arr(list, &count, &w)) {
		printf("bad\n");
		free(buf);
		return;
	}
	printf("cq=%llu", (unsigned long long)cq);
	for (i = 0; i < count; i++) {
		shca_wire_wc(w, &wc);
		printf(" %llu,%u,%u,%u,%u,%u,%u,%u,%u,%u", (unsigned long long)wc.wr_id,
		       wc.status, wc.opcode, wc.byte_len, wc.qp_num, wc.wc_flags,
		       wc.vendor_err, wc.src_qp,
		       wc.wc_flags & IBV_WC_WITH_INV ? 0 : ntohl(wc.imm_data),
		       wc.wc_flags & IBV_WC_WITH_INV ? wc.invalidated_rkey : 0);
		mp_next(&w);
	}
	putchar('\n');
	free(buf);
}

int main(void)
{
	static char line[1 << 20];
	struct mp_buf b;

	while (fgets(line, sizeof(line), stdin)) {
		char *cmd = strtok(line, " \n");
		char *a;

		if (!cmd)
			continue;
		if (!strcmp(cmd, "req")) {
			request(next_tok());
		} else if (!strcmp(cmd, "post_send")) {
			post_send();
		} else if (!strcmp(cmd, "post_recv")) {
			post_recv();
		} else if (!strcmp(cmd, "check")) {
			a = next_tok();
			check(a ? a : "");
		} else if (!strcmp(cmd, "reply") || !strcmp(cmd, "frame")) {
			char *name = next_tok();

			a = next_tok();
			check_reply(cmd, name ? name : "", a ? a : "");
		} else if (!strcmp(cmd, "wc")) {
			a = next_tok();
			wcs(a ? a : "");
		} else if (!strcmp(cmd, "errno")) {
			a = next_tok();
			printf("%d\n", a ? shca_errno_of(a, (uint32_t)strlen(a)) : -1);
		} else if (!strcmp(cmd, "hello")) {
			shca_hello_begin(&b, "control", 0);
			put_hex(&b);
			mp_free(&b);
		} else {
			fprintf(stderr, "wirecheck: no such command %s\n", cmd);
			return 2;
		}
		fflush(stdout);
	}
	return 0;
}
