/* mlx5dv on a softhca device: the MKEY configure WR builders of struct mlx5dv_qp_ex,
 * MKEYs, DEKs, crypto logins, the device's signature and crypto caps, and signature
 * pipelining's cancel; softhca's libmlx5.so.1 (provider/mlx5/) reaches them through
 * `softhca_mlx5dv_ops` (dv_bridge.h). Each is a control request to the daemon
 * (protocol/control.py), encoded the way the Python client encodes it.
 *
 * The builders only record: mlx5dv_wr_mkey_configure and its setters append calls to
 * the QP's ibv_wr_* batch (qp_ex.c), and ibv_wr_complete posts each run of them as one
 * mkey_configure request, which the daemon validates whole and applies whole. What can
 * be told without the daemon (a setter with no open configure, more or fewer setters
 * than announced, a builder the QP was not created for) is caught here, before anything
 * of the batch is posted. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "softhca.h"

/* Calls in one mkey_configure request (protocol/control.py MkeyConfigure). */
#define MAX_CONFIGURE_CALLS 2048
/* The man pages' MKEY builders, each needing its mlx5dv send_ops_flags bit. */
#define MKEY_OPS (MLX5DV_QP_EX_WITH_MR_INTERLEAVED | MLX5DV_QP_EX_WITH_MR_LIST | \
		  MLX5DV_QP_EX_WITH_MKEY_CONFIGURE)
#define CRYPTO_KEY_BYTES(size) ((size) == MLX5DV_CRYPTO_KEY_SIZE_128 ? 32 : 64)
#define KEYTAG_BYTES 8
/* AES key wrap (RFC 3394) adds one 64-bit block to what it wraps. */
#define WRAP_BYTES 8

struct shca_mkey {
	struct mlx5dv_mkey dv;   /* what the application sees: lkey, rkey */
	struct shca_context *ctx;
	uint32_t handle;
};

/* The application sees these only as pointers (mlx5dv.h declares them incomplete). */
struct mlx5dv_dek {
	struct shca_context *ctx;
	uint32_t handle;
};

struct mlx5dv_crypto_login_obj {
	struct shca_context *ctx;
	uint32_t handle;
};

#define container_of(p, type, member) ((type *)((char *)(p) - offsetof(type, member)))

static struct shca_qp *dvq(struct mlx5dv_qp_ex *m)
{
	return container_of(m, struct shca_qp, dv);
}

static struct shca_mkey *to_mkey(struct mlx5dv_mkey *m)
{
	return container_of(m, struct shca_mkey, dv);
}

/* -- the MKEY configure builders ---------------------------------------------------- */

void shca_dv_end_configure(struct shca_qp *qp)
{
	if (!qp->cfg_open)
		return;
	qp->cfg_open = 0;
	if (qp->cfg_got < qp->cfg_need) {
		shca_log("mlx5dv_wr_mkey_configure: EINVAL: %u setters announced, %u called",
			 qp->cfg_need, qp->cfg_got);
		shca_wr_fail(qp, EINVAL);
	}
}

/* Room for one more configure call in the batch's open configure run, or an error. */
static int add_call(struct shca_qp *qp)
{
	int rc;

	if (qp->wr_error)
		return qp->wr_error;
	rc = shca_batch_run(qp, SHCA_RUN_CONFIGURE);
	if (!rc && qp->nwrs >= MAX_CONFIGURE_CALLS) {
		shca_log("ibv_wr_complete: ENOMEM: more than %d MKEY configure calls in a row",
			 MAX_CONFIGURE_CALLS);
		rc = ENOMEM;
	}
	if (rc)
		shca_wr_fail(qp, rc);
	return rc;
}

static void configure(struct mlx5dv_qp_ex *m, struct mlx5dv_mkey *mkey,
		      unsigned num_setters, const struct mlx5dv_mkey_conf_attr *attr,
		      uint64_t needed, const char *what)
{
	struct shca_qp *qp = dvq(m);
	struct ibv_qp_ex *qpx = &qp->vqp.qp_ex;

	shca_wr_close(qp);
	shca_dv_end_configure(qp);
	if (!(qp->dv_send_ops & needed)) {
		shca_log("%s: EOPNOTSUPP: the QP was not created with its mlx5dv send_ops_flags "
			 "bit (%#llx)", what, (unsigned long long)needed);
		shca_wr_fail(qp, EOPNOTSUPP);
		return;
	}
	if (!mkey || !attr) {
		shca_log("%s: EINVAL: no MKEY or no mkey_conf_attr", what);
		shca_wr_fail(qp, EINVAL);
		return;
	}
	if (add_call(qp))
		return;
	mp_arr(&qp->wrs, 7);
	mp_str(&qp->wrs, "configure");
	mp_uint(&qp->wrs, qpx->wr_id);
	mp_uint(&qp->wrs, qpx->wr_flags);
	mp_uint(&qp->wrs, to_mkey(mkey)->handle);
	mp_uint(&qp->wrs, num_setters);
	mp_uint(&qp->wrs, attr->conf_flags);
	mp_uint(&qp->wrs, attr->comp_mask);
	qp->nwrs++;
	qp->cfg_open = 1;
	qp->cfg_need = num_setters;
	qp->cfg_got = 0;
}

static void wr_mkey_configure(struct mlx5dv_qp_ex *m, struct mlx5dv_mkey *mkey,
			      uint8_t num_setters, struct mlx5dv_mkey_conf_attr *attr)
{
	configure(m, mkey, num_setters, attr, MLX5DV_QP_EX_WITH_MKEY_CONFIGURE,
		  "mlx5dv_wr_mkey_configure");
}

/* A setter's call, [kind, value], is begun in the open run: 1, or 0 with the batch's
 * error recorded (mlx5dv_wr_mkey_configure(3): setters follow their configure, as many
 * as it announced). */
static int setter(struct mlx5dv_qp_ex *m, const char *kind, const void *arg)
{
	struct shca_qp *qp = dvq(m);

	shca_wr_close(qp);
	if (qp->wr_error)       /* the batch fails already; its first error is reported */
		return 0;
	if (!qp->cfg_open) {
		shca_log("mlx5dv_wr_set_mkey_%s: EINVAL: no mlx5dv_wr_mkey_configure is open",
			 kind);
		shca_wr_fail(qp, EINVAL);
		return 0;
	}
	if (qp->cfg_got >= qp->cfg_need) {
		shca_log("mlx5dv_wr_set_mkey_%s: EINVAL: more setters than the %u announced",
			 kind, qp->cfg_need);
		shca_wr_fail(qp, EINVAL);
		return 0;
	}
	qp->cfg_got++;
	if (!arg) {
		shca_log("mlx5dv_wr_set_mkey_%s: EINVAL: no attributes", kind);
		shca_wr_fail(qp, EINVAL);
		return 0;
	}
	if (add_call(qp))
		return 0;
	mp_arr(&qp->wrs, 2);
	mp_str(&qp->wrs, kind);
	qp->nwrs++;
	return 1;
}

static void wr_set_mkey_access_flags(struct mlx5dv_qp_ex *m, uint32_t access_flags)
{
	if (setter(m, "access_flags", m))
		mp_uint(&dvq(m)->wrs, access_flags);
}

static void wr_set_mkey_layout_list(struct mlx5dv_qp_ex *m, uint16_t num_sges,
				    const struct ibv_sge *sge)
{
	struct mp_buf *b = &dvq(m)->wrs;
	uint16_t i;

	if (!setter(m, "layout_list", num_sges ? (const void *)sge : m))
		return;
	mp_arr(b, num_sges);
	for (i = 0; i < num_sges; i++) {
		mp_arr(b, 3);
		mp_uint(b, sge[i].addr);
		mp_uint(b, sge[i].length);
		mp_uint(b, sge[i].lkey);
	}
}

static void wr_set_mkey_layout_interleaved(struct mlx5dv_qp_ex *m, uint32_t repeat_count,
					   uint16_t num_interleaved,
					   const struct mlx5dv_mr_interleaved *data)
{
	struct mp_buf *b = &dvq(m)->wrs;
	uint16_t i;

	if (!setter(m, "layout_interleaved", num_interleaved ? (const void *)data : m))
		return;
	mp_arr(b, 2);
	mp_uint(b, repeat_count);
	mp_arr(b, num_interleaved);
	for (i = 0; i < num_interleaved; i++) {
		mp_arr(b, 4);
		mp_uint(b, data[i].addr);
		mp_uint(b, data[i].bytes_count);
		mp_uint(b, data[i].bytes_skip);
		mp_uint(b, data[i].lkey);
	}
}

/* struct mlx5dv_sig_block_domain as protocol/attrs.py SigBlockDomain; the union's member
 * the sig_type names is sent, an unknown sig_type with neither (the daemon refuses it). */
static void sig_domain(struct mp_buf *b, const struct mlx5dv_sig_block_domain *d)
{
	if (!d) {
		mp_nil(b);
		return;
	}
	mp_map(b, 5);
	mp_kv_uint(b, "sig_type", d->sig_type);
	mp_str(b, "dif");
	if (d->sig_type == MLX5DV_SIG_TYPE_T10DIF && d->sig.dif) {
		mp_map(b, 5);
		mp_kv_uint(b, "bg_type", d->sig.dif->bg_type);
		mp_kv_uint(b, "bg", d->sig.dif->bg);
		mp_kv_uint(b, "app_tag", d->sig.dif->app_tag);
		mp_kv_uint(b, "ref_tag", d->sig.dif->ref_tag);
		mp_kv_uint(b, "flags", d->sig.dif->flags);
	} else {
		mp_nil(b);
	}
	mp_str(b, "crc");
	if (d->sig_type == MLX5DV_SIG_TYPE_CRC && d->sig.crc) {
		mp_map(b, 2);
		mp_kv_uint(b, "crc_type", d->sig.crc->type);
		mp_kv_uint(b, "seed", d->sig.crc->seed);
	} else {
		mp_nil(b);
	}
	mp_kv_uint(b, "block_size", d->block_size);
	mp_kv_uint(b, "comp_mask", d->comp_mask);
}

static void wr_set_mkey_sig_block(struct mlx5dv_qp_ex *m,
				  const struct mlx5dv_sig_block_attr *attr)
{
	struct mp_buf *b = &dvq(m)->wrs;

	if (!setter(m, "sig_block", attr))
		return;
	mp_map(b, 6);
	mp_str(b, "mem");
	sig_domain(b, attr->mem);
	mp_str(b, "wire");
	sig_domain(b, attr->wire);
	mp_kv_uint(b, "flags", attr->flags);
	mp_kv_uint(b, "check_mask", attr->check_mask);
	mp_kv_uint(b, "copy_mask", attr->copy_mask);
	mp_kv_uint(b, "comp_mask", attr->comp_mask);
}

static void wr_set_mkey_crypto(struct mlx5dv_qp_ex *m, const struct mlx5dv_crypto_attr *attr)
{
	struct mp_buf *b = &dvq(m)->wrs;

	if (!setter(m, "crypto", attr))
		return;
	mp_map(b, 8);
	mp_kv_uint(b, "crypto_standard", attr->crypto_standard);
	mp_str(b, "encrypt_on_tx");
	mp_bool(b, attr->encrypt_on_tx);
	mp_kv_uint(b, "signature_crypto_order", attr->signature_crypto_order);
	mp_kv_uint(b, "data_unit_size", attr->data_unit_size);
	mp_str(b, "initial_tweak");
	mp_bin(b, attr->initial_tweak, sizeof(attr->initial_tweak));
	mp_str(b, "dek");
	if (attr->dek)
		mp_uint(b, attr->dek->handle);
	else
		mp_nil(b);
	mp_str(b, "keytag");
	mp_bin(b, attr->keytag, sizeof(attr->keytag));
	mp_kv_uint(b, "comp_mask", attr->comp_mask);
}

/* mlx5dv_wr_post(3)'s older builders: a configure WR with its access flags and layout. */
static void wr_mr_list(struct mlx5dv_qp_ex *m, struct mlx5dv_mkey *mkey,
		       uint32_t access_flags, uint16_t num_sges, struct ibv_sge *sge)
{
	struct mlx5dv_mkey_conf_attr attr = {0};

	configure(m, mkey, 2, &attr, MLX5DV_QP_EX_WITH_MR_LIST, "mlx5dv_wr_mr_list");
	if (!dvq(m)->cfg_open)
		return;
	wr_set_mkey_access_flags(m, access_flags);
	wr_set_mkey_layout_list(m, num_sges, sge);
}

static void wr_mr_interleaved(struct mlx5dv_qp_ex *m, struct mlx5dv_mkey *mkey,
			      uint32_t access_flags, uint32_t repeat_count,
			      uint16_t num_interleaved, struct mlx5dv_mr_interleaved *data)
{
	struct mlx5dv_mkey_conf_attr attr = {0};

	configure(m, mkey, 2, &attr, MLX5DV_QP_EX_WITH_MR_INTERLEAVED,
		  "mlx5dv_wr_mr_interleaved");
	if (!dvq(m)->cfg_open)
		return;
	wr_set_mkey_access_flags(m, access_flags);
	wr_set_mkey_layout_interleaved(m, repeat_count, num_interleaved, data);
}

static void dv_unsupported(struct mlx5dv_qp_ex *m, const char *what)
{
	struct shca_qp *qp = dvq(m);

	shca_wr_close(qp);
	shca_dv_end_configure(qp);
	shca_log("%s: EOPNOTSUPP: not modelled by softhca", what);
	shca_wr_fail(qp, EOPNOTSUPP);
}

/* The DC address setters give the open WR its destination: they fail the batch, and
 * the WR stays open for its other setters (as a setter of any WR does). */
static void dc_unsupported(struct mlx5dv_qp_ex *m, const char *what)
{
	shca_log("%s: EOPNOTSUPP: DC QPs are not modelled by softhca", what);
	shca_wr_fail(dvq(m), EOPNOTSUPP);
}

static void wr_set_dc_addr(struct mlx5dv_qp_ex *m, struct ibv_ah *ah, uint32_t remote_dctn,
			   uint64_t remote_dc_key)
{
	(void)ah;
	(void)remote_dctn;
	(void)remote_dc_key;
	dc_unsupported(m, "mlx5dv_wr_set_dc_addr");
}

static void wr_set_dc_addr_stream(struct mlx5dv_qp_ex *m, struct ibv_ah *ah,
				  uint32_t remote_dctn, uint64_t remote_dc_key,
				  uint16_t stream_id)
{
	(void)ah;
	(void)remote_dctn;
	(void)remote_dc_key;
	(void)stream_id;
	dc_unsupported(m, "mlx5dv_wr_set_dc_addr_stream");
}

static void wr_raw_wqe(struct mlx5dv_qp_ex *m, const void *wqe)
{
	(void)wqe;
	dv_unsupported(m, "mlx5dv_wr_raw_wqe");
}

static void wr_memcpy(struct mlx5dv_qp_ex *m, uint32_t dest_lkey, uint64_t dest_addr,
		      uint32_t src_lkey, uint64_t src_addr, size_t length)
{
	(void)dest_lkey;
	(void)dest_addr;
	(void)src_lkey;
	(void)src_addr;
	(void)length;
	dv_unsupported(m, "mlx5dv_wr_memcpy");
}

void shca_dv_qp_init(struct shca_qp *qp)
{
	struct mlx5dv_qp_ex *m = &qp->dv;

	m->comp_mask = 0;
	m->wr_set_dc_addr = wr_set_dc_addr;
	m->wr_mr_interleaved = wr_mr_interleaved;
	m->wr_mr_list = wr_mr_list;
	m->wr_mkey_configure = wr_mkey_configure;
	m->wr_set_mkey_access_flags = wr_set_mkey_access_flags;
	m->wr_set_mkey_layout_list = wr_set_mkey_layout_list;
	m->wr_set_mkey_layout_interleaved = wr_set_mkey_layout_interleaved;
	m->wr_set_mkey_sig_block = wr_set_mkey_sig_block;
	m->wr_raw_wqe = wr_raw_wqe;
	m->wr_set_dc_addr_stream = wr_set_dc_addr_stream;
	m->wr_memcpy = wr_memcpy;
	m->wr_set_mkey_crypto = wr_set_mkey_crypto;
}

int shca_dv_post_configure(struct shca_qp *qp, struct shca_run *run)
{
	struct shca_context *ctx = to_sctx(qp->vqp.qp.context);
	struct mp_buf b;
	struct shca_reply r;
	int rc;

	shca_begin(&ctx->conn, &b, "mkey_configure", 2);
	mp_kv_uint(&b, "qp", qp->handle);
	mp_str(&b, "calls");
	mp_arr(&b, run->n);
	mp_raw(&b, run->buf.p, run->buf.len);
	b.failed |= run->buf.failed;
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (!rc)
		shca_reply_free(&r);
	return rc;
}

/* -- QPs ---------------------------------------------------------------------------- */

static struct ibv_qp *create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *qp_attr,
				struct mlx5dv_qp_init_attr *dv)
{
	const uint64_t known = MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS |
			       MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	/* DISABLE_SCATTER_TO_CQE only changes where hardware puts small receives, never
	 * what the application sees; softhca never scatters into a CQE. */
	const uint32_t flags_ok = MLX5DV_QP_CREATE_SIG_PIPELINING |
				  MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE;
	uint64_t ops = 0;
	uint32_t flags = 0;

	if (!qp_attr) {
		errno = EINVAL;
		return NULL;
	}
	if (dv && dv->comp_mask & ~known) {
		shca_log("mlx5dv_create_qp: EOPNOTSUPP: comp_mask %#llx (DC, DCI streams) is not "
			 "modelled", (unsigned long long)(dv->comp_mask & ~known));
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (dv && dv->comp_mask & MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS)
		flags = dv->create_flags;
	if (flags & ~flags_ok) {
		shca_log("mlx5dv_create_qp: EOPNOTSUPP: create_flags %#x are not modelled",
			 flags & ~flags_ok);
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (dv && dv->comp_mask & MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS)
		ops = dv->send_ops_flags;
	if (ops & ~(uint64_t)MKEY_OPS) {
		shca_log("mlx5dv_create_qp: EOPNOTSUPP: send_ops_flags %#llx (raw WQEs, memcpy) "
			 "are not modelled", (unsigned long long)(ops & ~(uint64_t)MKEY_OPS));
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (ops && !(qp_attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) {
		shca_log("mlx5dv_create_qp: EINVAL: mlx5dv send_ops_flags need an extended QP "
			 "(IBV_QP_INIT_ATTR_SEND_OPS_FLAGS in qp_attr->comp_mask)");
		errno = EINVAL;
		return NULL;
	}
	/* The daemon's QP takes configure WRs if any MKEY builder is allowed; which one the
	 * application may call is checked by the builders, against ops. */
	return shca_create_qp_dv(context, qp_attr, ops, flags & MLX5DV_QP_CREATE_SIG_PIPELINING);
}

static struct mlx5dv_qp_ex *qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *qpx)
{
	return &((struct shca_qp *)qpx)->dv;
}

/* Number of WRs canceled, or -errno (mlx5dv_qp_cancel_posted_send_wrs(3)). */
static int cancel_posted_send_wrs(struct mlx5dv_qp_ex *m, uint64_t wr_id)
{
	struct shca_qp *qp = dvq(m);
	struct shca_context *ctx = to_sctx(qp->vqp.qp.context);
	struct mp_buf b;
	struct shca_reply r;
	uint32_t n = 0;
	int rc;

	shca_begin(&ctx->conn, &b, "cancel_posted_send_wrs", 2);
	mp_kv_uint(&b, "qp", qp->handle);
	mp_kv_uint(&b, "wr_id", wr_id);
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return -rc;
	rc = shca_get_u32(&r, "canceled", &n);
	shca_reply_free(&r);
	return rc ? -rc : (int)n;
}

/* -- MKEYs ---------------------------------------------------------------------------- */

static struct mlx5dv_mkey *create_mkey(struct mlx5dv_mkey_init_attr *attr)
{
	struct shca_context *ctx;
	struct shca_mkey *mk;
	struct mp_buf b;
	struct shca_reply r;
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
	shca_begin(&ctx->conn, &b, "create_mkey", 3);
	mp_kv_uint(&b, "pd", ((struct shca_pd *)attr->pd)->handle);
	mp_kv_uint(&b, "create_flags", attr->create_flags);
	mp_kv_uint(&b, "max_entries", attr->max_entries);
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = shca_get_u32(&r, "mkey", &mk->handle);
		if (!rc)
			rc = shca_get_u32(&r, "lkey", &mk->dv.lkey);
		if (!rc)
			rc = shca_get_u32(&r, "rkey", &mk->dv.rkey);
		shca_reply_free(&r);
	}
	if (rc) {
		free(mk);
		errno = rc;
		return NULL;
	}
	mk->ctx = ctx;
	return &mk->dv;
}

static int destroy_mkey(struct mlx5dv_mkey *mkey)
{
	struct shca_mkey *mk = to_mkey(mkey);
	int rc = shca_call_simple(mk->ctx, "destroy_mkey", "mkey", mk->handle);

	if (!rc)
		free(mk);
	return rc;
}

static int mkey_check(struct mlx5dv_mkey *mkey, struct mlx5dv_mkey_err *err_info,
		      size_t err_info_size)
{
	struct shca_mkey *mk = to_mkey(mkey);
	struct mlx5dv_mkey_err e;
	struct mp_buf b;
	struct shca_reply r;
	uint64_t v;
	int rc;

	if (!err_info || err_info_size < offsetof(struct mlx5dv_mkey_err, err))
		return EINVAL;
	shca_begin(&mk->ctx->conn, &b, "mkey_check", 1);
	mp_kv_uint(&b, "mkey", mk->handle);
	rc = shca_call(&mk->ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	memset(&e, 0, sizeof(e));
	if (mp_find_uint(r.hdr, "err_type", &v))
		e.err_type = (enum mlx5dv_mkey_err_type)v;
	if (mp_find_uint(r.hdr, "actual_value", &v))
		e.err.sig.actual_value = v;
	if (mp_find_uint(r.hdr, "expected_value", &v))
		e.err.sig.expected_value = v;
	if (mp_find_uint(r.hdr, "offset", &v))
		e.err.sig.offset = v;
	shca_reply_free(&r);
	/* an application built with an older, shorter struct gets what fits */
	memcpy(err_info, &e, err_info_size < sizeof(e) ? err_info_size : sizeof(e));
	return 0;
}

/* -- device caps ------------------------------------------------------------------------ */

static int query_caps(struct shca_context *ctx, struct mlx5dv_sig_caps *sig,
		      struct mlx5dv_crypto_caps *crypto)
{
	struct mp_buf b;
	struct shca_reply r;
	struct mp_val a, c;
	uint64_t v;
	int rc;

	shca_begin(&ctx->conn, &b, "query_mlx5_device", 1);
	mp_kv_uint(&b, "ctx", ctx->handle);
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	memset(sig, 0, sizeof(*sig));
	memset(crypto, 0, sizeof(*crypto));
	if (mp_find(r.hdr, "attr", &a)) {
		if (mp_find(a, "sig_caps", &c)) {
#define U(field) if (mp_find_uint(c, #field, &v)) sig->field = v
			U(block_size);
			U(block_prot);
			U(t10dif_bg);
			U(crc_type);
		}
		if (mp_find(a, "crypto_caps", &c)) {
#define C(field) if (mp_find_uint(c, #field, &v)) crypto->field = v
			C(failed_selftests);
			C(crypto_engines);
			C(wrapped_import_method);
			C(log_max_num_deks);
			C(flags);
#undef C
#undef U
		}
	}
	shca_reply_free(&r);
	return 0;
}

/* mlx5dv_query_device(3): comp_mask is in/out; of what is asked, the signature and crypto
 * caps are answered (the rest of mlx5's hardware features are not modelled). */
static int query_device(struct ibv_context *context, struct mlx5dv_context *attrs)
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

static int login_request(struct shca_context *ctx, const char *verb, const void *cred,
			 size_t cred_len, uint32_t kek, uint32_t cred_id, uint64_t comp_mask,
			 struct shca_reply *r)
{
	struct mp_buf b;

	if (cred_len > 4096)
		return EINVAL;
	shca_begin(&ctx->conn, &b, verb, 5);
	mp_kv_uint(&b, "ctx", ctx->handle);
	mp_str(&b, "credential");
	mp_bin(&b, cred, (uint32_t)cred_len);
	mp_kv_uint(&b, "import_kek_id", kek);
	mp_kv_uint(&b, "credential_id", cred_id);
	mp_kv_uint(&b, "comp_mask", comp_mask);
	return shca_call(&ctx->conn, &b, NULL, 0, r);
}

static int crypto_login(struct ibv_context *context, struct mlx5dv_crypto_login_attr *a)
{
	struct shca_reply r;
	int rc;

	if (!a)
		return EINVAL;
	rc = login_request(to_sctx(context), "crypto_login", a->credential,
			   sizeof(a->credential), a->import_kek_id, a->credential_id,
			   a->comp_mask, &r);
	if (!rc)
		shca_reply_free(&r);
	return rc;
}

static int login_state(struct shca_context *ctx, const char *verb, const char *key,
		       uint32_t handle, enum mlx5dv_crypto_login_state *state)
{
	struct mp_buf b;
	struct shca_reply r;
	uint32_t v;
	int rc;

	shca_begin(&ctx->conn, &b, verb, 1);
	mp_kv_uint(&b, key, handle);
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	rc = shca_get_u32(&r, "state", &v);
	shca_reply_free(&r);
	if (!rc)
		*state = (enum mlx5dv_crypto_login_state)v;
	return rc;
}

static int crypto_login_query_state(struct ibv_context *context,
				    enum mlx5dv_crypto_login_state *state)
{
	struct shca_context *ctx = to_sctx(context);

	if (!state)
		return EINVAL;
	return login_state(ctx, "crypto_login_query_state", "ctx", ctx->handle, state);
}

static int crypto_logout(struct ibv_context *context)
{
	struct shca_context *ctx = to_sctx(context);

	return shca_call_simple(ctx, "crypto_logout", "ctx", ctx->handle);
}

static struct mlx5dv_crypto_login_obj *crypto_login_create(
	struct ibv_context *context, struct mlx5dv_crypto_login_attr_ex *a)
{
	struct shca_context *ctx = to_sctx(context);
	struct mlx5dv_crypto_login_obj *o;
	struct shca_reply r;
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
	rc = login_request(ctx, "create_crypto_login", a->credential, a->credential_len,
			   a->import_kek_id, a->credential_id, a->comp_mask, &r);
	if (!rc) {
		rc = shca_get_u32(&r, "login", &o->handle);
		shca_reply_free(&r);
	}
	if (rc) {
		free(o);
		errno = rc;
		return NULL;
	}
	o->ctx = ctx;
	return o;
}

static int crypto_login_query(struct mlx5dv_crypto_login_obj *o,
			      struct mlx5dv_crypto_login_query_attr *q)
{
	if (!o || !q)
		return EINVAL;
	q->comp_mask = 0;
	return login_state(o->ctx, "crypto_login_query", "login", o->handle, &q->state);
}

static int crypto_login_destroy(struct mlx5dv_crypto_login_obj *o)
{
	int rc;

	if (!o)
		return EINVAL;
	rc = shca_call_simple(o->ctx, "destroy_crypto_login", "login", o->handle);
	if (!rc)
		free(o);
	return rc;
}

/* mlx5dv_dek_create(3): key[] holds key1 || key2 (|| keytag with has_keytag), wrapped
 * (one more 64-bit block) on a device whose DEKs are imported wrapped; how many of its 128
 * bytes are the key follows from that. */
static struct mlx5dv_dek *dek_create(struct ibv_context *context,
				     struct mlx5dv_dek_init_attr *a)
{
	struct shca_context *ctx = to_sctx(context);
	struct mlx5dv_sig_caps sig;
	struct mlx5dv_crypto_caps caps;
	struct mlx5dv_dek *dek;
	struct mp_buf b;
	struct shca_reply r;
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
	shca_begin(&ctx->conn, &b, "create_dek", 10);
	mp_kv_uint(&b, "ctx", ctx->handle);
	mp_kv_uint(&b, "pd", ((struct shca_pd *)a->pd)->handle);
	mp_kv_uint(&b, "key_size", a->key_size);
	mp_str(&b, "key");
	mp_bin(&b, a->key, (uint32_t)len);
	mp_str(&b, "has_keytag");
	mp_bool(&b, a->has_keytag);
	mp_str(&b, "keytag");
	mp_bin(&b, "", 0);
	mp_kv_uint(&b, "key_purpose", a->key_purpose);
	mp_str(&b, "opaque");
	mp_bin(&b, a->opaque, sizeof(a->opaque));
	mp_kv_uint(&b, "comp_mask", a->comp_mask);
	mp_kv_uint(&b, "crypto_login",
		   (a->comp_mask & MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN) && a->crypto_login ?
		   a->crypto_login->handle : 0);
	rc = shca_call(&ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = shca_get_u32(&r, "dek", &dek->handle);
		shca_reply_free(&r);
	}
	if (rc) {
		free(dek);
		errno = rc;
		return NULL;
	}
	dek->ctx = ctx;
	return dek;
}

static int dek_query(struct mlx5dv_dek *dek, struct mlx5dv_dek_attr *attr)
{
	struct mp_buf b;
	struct shca_reply r;
	struct mp_val v;
	const char *s;
	uint32_t n, state = 0;
	int rc;

	if (!dek || !attr)
		return EINVAL;
	shca_begin(&dek->ctx->conn, &b, "query_dek", 1);
	mp_kv_uint(&b, "dek", dek->handle);
	rc = shca_call(&dek->ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return rc;
	rc = shca_get_u32(&r, "state", &state);
	if (!rc) {
		attr->state = (enum mlx5dv_dek_state)state;
		attr->comp_mask = 0;
		memset(attr->opaque, 0, sizeof(attr->opaque));
		/* opaque travels as bin; mp_get_str reads str and bin alike */
		if (mp_find(r.hdr, "opaque", &v) && mp_get_str(v, &s, &n))
			memcpy(attr->opaque, s, n < sizeof(attr->opaque) ? n : sizeof(attr->opaque));
	}
	shca_reply_free(&r);
	return rc;
}

static int dek_destroy(struct mlx5dv_dek *dek)
{
	int rc;

	if (!dek)
		return EINVAL;
	rc = shca_call_simple(dek->ctx, "destroy_dek", "dek", dek->handle);
	if (!rc)
		free(dek);
	return rc;
}

const struct softhca_mlx5dv_ops softhca_mlx5dv_ops = {
	.version = SOFTHCA_MLX5DV_OPS_VERSION,
	.size = sizeof(struct softhca_mlx5dv_ops),
	.owns_device = shca_owns_device,
	.owns = shca_owns,
	.query_device = query_device,
	.create_qp = create_qp,
	.qp_ex_from_ibv_qp_ex = qp_ex_from_ibv_qp_ex,
	.qp_cancel_posted_send_wrs = cancel_posted_send_wrs,
	.create_mkey = create_mkey,
	.destroy_mkey = destroy_mkey,
	.mkey_check = mkey_check,
	.crypto_login = crypto_login,
	.crypto_login_query_state = crypto_login_query_state,
	.crypto_logout = crypto_logout,
	.crypto_login_create = crypto_login_create,
	.crypto_login_query = crypto_login_query,
	.crypto_login_destroy = crypto_login_destroy,
	.dek_create = dek_create,
	.dek_query = dek_query,
	.dek_destroy = dek_destroy,
};
