/* mlx5dv's objects on a softhca device: MKEYs, DEKs and crypto login objects (each
 * the daemon's handle), the device's signature and crypto caps. The calls of
 * softhca_mlx5dv_ops that make, query and destroy them; dv.c has the QP's. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "softhca.h"

#define CRYPTO_KEY_BYTES(size) ((size) == MLX5DV_CRYPTO_KEY_SIZE_128 ? 32 : 64)
#define KEYTAG_BYTES 8
/* AES key wrap (RFC 3394) adds one 64-bit block to what it wraps. */
#define WRAP_BYTES 8

/* -- MKEYs ---------------------------------------------------------------------------- */

struct mlx5dv_mkey *shca_dv_create_mkey(struct mlx5dv_mkey_init_attr *attr)
{
	struct shca_context *ctx;
	struct shca_mkey *mk;
	struct mp_buf b;
	struct shca_frame r;
	int rc;

	if (!attr || !attr->pd) {
		errno = EINVAL;
		return NULL;
	}
	ctx = to_sctx(attr->pd->context);
	mk = calloc(1, sizeof(*mk));
	if (!mk) {
		errno = ENOMEM;
		return NULL;
	}
	shca_begin(ctx->conn, &b, SHCA_V_CREATE_MKEY, SHCA_NREQ_CREATE_MKEY);
	mp_kv_uint(&b, SHCA_K_PD, to_spd(attr->pd)->handle);
	mp_kv_uint(&b, SHCA_K_CREATE_FLAGS, attr->create_flags);
	mp_kv_uint(&b, SHCA_K_MAX_ENTRIES, attr->max_entries);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = shca_get_u32(&r, SHCA_R_MKEY, &mk->handle);
		if (!rc)
			rc = shca_get_u32(&r, SHCA_R_LKEY, &mk->dv.lkey);
		if (!rc)
			rc = shca_get_u32(&r, SHCA_R_RKEY, &mk->dv.rkey);
		shca_frame_free(&r);
	}
	if (rc) {
		free(mk);
		errno = rc;
		return NULL;
	}
	mk->ctx = ctx;
	return &mk->dv;
}

int shca_dv_destroy_mkey(struct mlx5dv_mkey *mkey)
{
	struct shca_mkey *mk = shca_to_mkey(mkey);
	int rc = shca_call_simple(mk->ctx, SHCA_V_DESTROY_MKEY, SHCA_K_MKEY, mk->handle);

	if (!rc)
		free(mk);
	return rc;
}

int shca_dv_mkey_check(struct mlx5dv_mkey *mkey, struct mlx5dv_mkey_err *err_info,
		      size_t err_info_size)
{
	struct shca_mkey *mk = shca_to_mkey(mkey);
	struct mlx5dv_mkey_err e;
	struct mp_buf b;
	struct shca_frame r;
	uint64_t v;
	int rc;

	if (!err_info || err_info_size < offsetof(struct mlx5dv_mkey_err, err))
		return EINVAL;
	shca_begin(mk->ctx->conn, &b, SHCA_V_MKEY_CHECK, SHCA_NREQ_MKEY_CHECK);
	mp_kv_uint(&b, SHCA_K_MKEY, mk->handle);
	rc = shca_call(mk->ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	memset(&e, 0, sizeof(e));
	if (mp_find_uint(r.hdr, SHCA_R_ERR_TYPE, &v))
		e.err_type = (enum mlx5dv_mkey_err_type)v;
	if (mp_find_uint(r.hdr, SHCA_R_ACTUAL_VALUE, &v))
		e.err.sig.actual_value = v;
	if (mp_find_uint(r.hdr, SHCA_R_EXPECTED_VALUE, &v))
		e.err.sig.expected_value = v;
	if (mp_find_uint(r.hdr, SHCA_R_OFFSET, &v))
		e.err.sig.offset = v;
	shca_frame_free(&r);
	/* an application built with an older, shorter struct gets what fits */
	memcpy(err_info, &e, err_info_size < sizeof(e) ? err_info_size : sizeof(e));
	return 0;
}

/* -- device caps ------------------------------------------------------------------------ */

static int query_caps(struct shca_context *ctx, struct mlx5dv_sig_caps *sig,
		      struct mlx5dv_crypto_caps *crypto)
{
	struct mp_buf b;
	struct shca_frame r;
	struct mp_val a, c;
	uint64_t v;
	int rc;

	shca_begin(ctx->conn, &b, SHCA_V_QUERY_MLX5_DEVICE, SHCA_NREQ_QUERY_MLX5_DEVICE);
	mp_kv_uint(&b, SHCA_K_CTX, ctx->handle);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	memset(sig, 0, sizeof(*sig));
	memset(crypto, 0, sizeof(*crypto));
	if (mp_find(r.hdr, SHCA_R_ATTR, &a)) {
		if (mp_find(a, SHCA_R_SIG_CAPS, &c)) {
#define U(field, key) if (mp_find_uint(c, key, &v)) sig->field = v
			U(block_size, SHCA_R_BLOCK_SIZE);
			U(block_prot, SHCA_R_BLOCK_PROT);
			U(t10dif_bg, SHCA_R_T10DIF_BG);
			U(crc_type, SHCA_R_CRC_TYPE);
		}
		if (mp_find(a, SHCA_R_CRYPTO_CAPS, &c)) {
#define C(field, key) if (mp_find_uint(c, key, &v)) crypto->field = v
			C(failed_selftests, SHCA_R_FAILED_SELFTESTS);
			C(crypto_engines, SHCA_R_CRYPTO_ENGINES);
			C(wrapped_import_method, SHCA_R_WRAPPED_IMPORT_METHOD);
			C(log_max_num_deks, SHCA_R_LOG_MAX_NUM_DEKS);
			C(flags, SHCA_R_FLAGS);
#undef C
#undef U
		}
	}
	shca_frame_free(&r);
	return 0;
}

/* mlx5dv_query_device(3): comp_mask is in/out; of what is asked, the signature and crypto
 * caps are answered (the rest of mlx5's hardware features are not modelled). */
int shca_dv_query_device(struct ibv_context *context, struct mlx5dv_context *attrs)
{
	struct mlx5dv_sig_caps sig;
	struct mlx5dv_crypto_caps crypto;
	uint64_t asked = attrs->comp_mask, out = 0;
	int rc = query_caps(to_sctx(context), &sig, &crypto);

	if (rc)
		return rc;
	attrs->version = 0;
	attrs->flags = 0;
	if (asked & MLX5DV_CONTEXT_MASK_SIGNATURE_OFFLOAD) {
		attrs->sig_caps = sig;
		out |= MLX5DV_CONTEXT_MASK_SIGNATURE_OFFLOAD;
	}
	if (asked & MLX5DV_CONTEXT_MASK_CRYPTO_OFFLOAD) {
		attrs->crypto_caps = crypto;
		out |= MLX5DV_CONTEXT_MASK_CRYPTO_OFFLOAD;
	}
	attrs->comp_mask = out;
	return 0;
}

/* -- crypto login and DEKs ------------------------------------------------------------ */

_Static_assert(SHCA_NFIELDS_CRYPTO_LOGIN == SHCA_NFIELDS_CREATE_CRYPTO_LOGIN,
	       "crypto_login and create_crypto_login take the same fields (login_request)");

static int login_request(struct shca_context *ctx, const char *verb, const void *cred,
			 size_t cred_len, uint32_t kek, uint32_t cred_id, uint64_t comp_mask,
			 struct shca_frame *r)
{
	struct mp_buf b;

	if (cred_len > 4096)
		return EINVAL;
	/* every field of crypto_login and create_crypto_login, which take the same */
	shca_begin(ctx->conn, &b, verb, SHCA_NFIELDS_CRYPTO_LOGIN);
	mp_kv_uint(&b, SHCA_K_CTX, ctx->handle);
	mp_str(&b, SHCA_K_CREDENTIAL);
	mp_bin(&b, cred, (uint32_t)cred_len);
	mp_kv_uint(&b, SHCA_K_IMPORT_KEK_ID, kek);
	mp_kv_uint(&b, SHCA_K_CREDENTIAL_ID, cred_id);
	mp_kv_uint(&b, SHCA_K_COMP_MASK, comp_mask);
	return shca_call(ctx->conn, &b, NULL, 0, r);
}

int shca_dv_crypto_login(struct ibv_context *context, struct mlx5dv_crypto_login_attr *a)
{
	struct shca_frame r;
	int rc;

	if (!a)
		return EINVAL;
	rc = login_request(to_sctx(context), SHCA_V_CRYPTO_LOGIN, a->credential,
			   sizeof(a->credential), a->import_kek_id, a->credential_id,
			   a->comp_mask, &r);
	if (!rc)
		shca_frame_free(&r);
	return rc;
}

_Static_assert(SHCA_NREQ_CRYPTO_LOGIN_QUERY == SHCA_NREQ_CRYPTO_LOGIN_QUERY_STATE,
	       "both login state queries take one handle (login_state)");

static int login_state(struct shca_context *ctx, const char *verb, const char *key,
		       uint32_t handle, enum mlx5dv_crypto_login_state *state)
{
	struct mp_buf b;
	struct shca_frame r;
	uint32_t v;
	int rc;

	shca_begin(ctx->conn, &b, verb, SHCA_NREQ_CRYPTO_LOGIN_QUERY);
	mp_kv_uint(&b, key, handle);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	rc = shca_get_u32(&r, SHCA_R_STATE, &v);
	shca_frame_free(&r);
	if (!rc)
		*state = (enum mlx5dv_crypto_login_state)v;
	return rc;
}

int shca_dv_crypto_login_query_state(struct ibv_context *context,
				    enum mlx5dv_crypto_login_state *state)
{
	struct shca_context *ctx = to_sctx(context);

	if (!state)
		return EINVAL;
	return login_state(ctx, SHCA_V_CRYPTO_LOGIN_QUERY_STATE, SHCA_K_CTX, ctx->handle, state);
}

int shca_dv_crypto_logout(struct ibv_context *context)
{
	struct shca_context *ctx = to_sctx(context);

	return shca_call_simple(ctx, SHCA_V_CRYPTO_LOGOUT, SHCA_K_CTX, ctx->handle);
}

struct mlx5dv_crypto_login_obj *shca_dv_crypto_login_create(
	struct ibv_context *context, struct mlx5dv_crypto_login_attr_ex *a)
{
	struct shca_context *ctx = to_sctx(context);
	struct mlx5dv_crypto_login_obj *o;
	struct shca_frame r;
	int rc;

	if (!a || (a->credential_len && !a->credential)) {
		errno = EINVAL;
		return NULL;
	}
	o = calloc(1, sizeof(*o));
	if (!o) {
		errno = ENOMEM;
		return NULL;
	}
	rc = login_request(ctx, SHCA_V_CREATE_CRYPTO_LOGIN, a->credential, a->credential_len,
			   a->import_kek_id, a->credential_id, a->comp_mask, &r);
	if (!rc) {
		rc = shca_get_u32(&r, SHCA_R_LOGIN, &o->handle);
		shca_frame_free(&r);
	}
	if (rc) {
		free(o);
		errno = rc;
		return NULL;
	}
	o->ctx = ctx;
	return o;
}

int shca_dv_crypto_login_query(struct mlx5dv_crypto_login_obj *o,
			      struct mlx5dv_crypto_login_query_attr *q)
{
	if (!o || !q)
		return EINVAL;
	q->comp_mask = 0;
	return login_state(o->ctx, SHCA_V_CRYPTO_LOGIN_QUERY, SHCA_K_LOGIN, o->handle, &q->state);
}

int shca_dv_crypto_login_destroy(struct mlx5dv_crypto_login_obj *o)
{
	int rc;

	if (!o)
		return EINVAL;
	rc = shca_call_simple(o->ctx, SHCA_V_DESTROY_CRYPTO_LOGIN, SHCA_K_LOGIN, o->handle);
	if (!rc)
		free(o);
	return rc;
}

/* mlx5dv_dek_create(3): key[] holds key1 || key2 (|| keytag with has_keytag), wrapped
 * (one more 64-bit block) on a device whose DEKs are imported wrapped; how many of its 128
 * bytes are the key follows from that. */
struct mlx5dv_dek *shca_dv_dek_create(struct ibv_context *context,
				     struct mlx5dv_dek_init_attr *a)
{
	struct shca_context *ctx = to_sctx(context);
	struct mlx5dv_sig_caps sig;
	struct mlx5dv_crypto_caps caps;
	struct mlx5dv_dek *dek;
	struct mp_buf b;
	struct shca_frame r;
	size_t len;
	int rc;

	if (!a || !a->pd || a->pd->context != context) {
		shca_log("mlx5dv_dek_create: EINVAL: init_attr->pd must be a PD of this context");
		errno = EINVAL;
		return NULL;
	}
	rc = query_caps(ctx, &sig, &caps);
	if (rc) {
		errno = rc;
		return NULL;
	}
	len = CRYPTO_KEY_BYTES(a->key_size) + (a->has_keytag ? KEYTAG_BYTES : 0) +
	      (caps.wrapped_import_method & MLX5DV_CRYPTO_WRAPPED_IMPORT_METHOD_CAP_AES_XTS ?
	       WRAP_BYTES : 0);
	dek = calloc(1, sizeof(*dek));
	if (!dek) {
		errno = ENOMEM;
		return NULL;
	}
	shca_begin(ctx->conn, &b, SHCA_V_CREATE_DEK, SHCA_NFIELDS_CREATE_DEK);
	mp_kv_uint(&b, SHCA_K_CTX, ctx->handle);
	mp_kv_uint(&b, SHCA_K_PD, to_spd(a->pd)->handle);
	mp_kv_uint(&b, SHCA_K_KEY_SIZE, a->key_size);
	mp_str(&b, SHCA_K_KEY);
	mp_bin(&b, a->key, (uint32_t)len);
	mp_str(&b, SHCA_K_HAS_KEYTAG);
	mp_bool(&b, a->has_keytag);
	mp_str(&b, SHCA_K_KEYTAG);
	mp_bin(&b, "", 0);
	mp_kv_uint(&b, SHCA_K_KEY_PURPOSE, a->key_purpose);
	mp_str(&b, SHCA_K_OPAQUE);
	mp_bin(&b, a->opaque, sizeof(a->opaque));
	mp_kv_uint(&b, SHCA_K_COMP_MASK, a->comp_mask);
	mp_kv_uint(&b, SHCA_K_CRYPTO_LOGIN,
		   (a->comp_mask & MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN) && a->crypto_login ?
		   a->crypto_login->handle : 0);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = shca_get_u32(&r, SHCA_R_DEK, &dek->handle);
		shca_frame_free(&r);
	}
	if (rc) {
		free(dek);
		errno = rc;
		return NULL;
	}
	dek->ctx = ctx;
	return dek;
}

int shca_dv_dek_query(struct mlx5dv_dek *dek, struct mlx5dv_dek_attr *attr)
{
	struct mp_buf b;
	struct shca_frame r;
	struct mp_val v;
	const char *s;
	uint32_t n, state = 0;
	int rc;

	if (!dek || !attr)
		return EINVAL;
	shca_begin(dek->ctx->conn, &b, SHCA_V_QUERY_DEK, SHCA_NREQ_QUERY_DEK);
	mp_kv_uint(&b, SHCA_K_DEK, dek->handle);
	rc = shca_call(dek->ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	rc = shca_get_u32(&r, SHCA_R_STATE, &state);
	if (!rc) {
		attr->state = (enum mlx5dv_dek_state)state;
		attr->comp_mask = 0;
		memset(attr->opaque, 0, sizeof(attr->opaque));
		/* opaque travels as bin; mp_get_str reads str and bin alike */
		if (mp_find(r.hdr, SHCA_R_OPAQUE, &v) && mp_get_str(v, &s, &n))
			memcpy(attr->opaque, s, n < sizeof(attr->opaque) ? n : sizeof(attr->opaque));
	}
	shca_frame_free(&r);
	return rc;
}

int shca_dv_dek_destroy(struct mlx5dv_dek *dek)
{
	int rc;

	if (!dek)
		return EINVAL;
	rc = shca_call_simple(dek->ctx, SHCA_V_DESTROY_DEK, SHCA_K_DEK, dek->handle);
	if (!rc)
		free(dek);
	return rc;
}
