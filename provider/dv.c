/* mlx5dv on a softhca device: the MKEY configure WR builders of struct mlx5dv_qp_ex and
 * signature pipelining's cancel (mlx5dv_create_qp is qp.c's; MKEYs, DEKs, crypto logins
 * and the caps are in dv_keys.c); softhca's libmlx5.so.1 (provider/mlx5/) reaches them
 * through `softhca_mlx5dv_ops` (dv_bridge.h), defined here. Each is a control request
 * to the daemon (protocol/control.py), encoded the way the Python client encodes it.
 *
 * The builders only record: mlx5dv_wr_mkey_configure and its setters append calls to
 * the QP's ibv_wr_* batch (wr.c), and ibv_wr_complete posts each run of them as one
 * mkey_configure request, which the daemon validates whole and applies whole. What can
 * be told without the daemon (a setter with no open configure, more or fewer setters
 * than announced, a builder the QP was not created for) is caught here, before anything
 * of the batch is posted. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "softhca.h"
#include "wr.h"

/* Calls in one mkey_configure request (protocol/control.py MkeyConfigure). */
#define MAX_CONFIGURE_CALLS 2048

static struct shca_qp *dvq(struct mlx5dv_qp_ex *m)
{
	return shca_container_of(m, struct shca_qp, dv);
}

/* -- the MKEY configure builders ---------------------------------------------------- */

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
	mp_str(&qp->wrs, SHCA_SETTER_CONFIGURE);
	mp_uint(&qp->wrs, qpx->wr_id);
	mp_uint(&qp->wrs, qpx->wr_flags);
	mp_uint(&qp->wrs, shca_to_mkey(mkey)->handle);
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
	if (setter(m, SHCA_SETTER_ACCESS_FLAGS, m))
		mp_uint(&dvq(m)->wrs, access_flags);
}

static void wr_set_mkey_layout_list(struct mlx5dv_qp_ex *m, uint16_t num_sges,
				    const struct ibv_sge *sge)
{
	struct mp_buf *b = &dvq(m)->wrs;
	uint16_t i;

	if (!setter(m, SHCA_SETTER_LAYOUT_LIST, num_sges ? (const void *)sge : m))
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

	if (!setter(m, SHCA_SETTER_LAYOUT_INTERLEAVED, num_interleaved ? (const void *)data : m))
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
	mp_map(b, SHCA_ATTR_NFIELDS_SIG_BLOCK_DOMAIN);
	mp_kv_uint(b, SHCA_A_SIG_TYPE, d->sig_type);
	mp_str(b, SHCA_A_DIF);
	if (d->sig_type == MLX5DV_SIG_TYPE_T10DIF && d->sig.dif) {
		mp_map(b, SHCA_ATTR_NFIELDS_SIG_T10DIF);
		mp_kv_uint(b, SHCA_A_BG_TYPE, d->sig.dif->bg_type);
		mp_kv_uint(b, SHCA_A_BG, d->sig.dif->bg);
		mp_kv_uint(b, SHCA_A_APP_TAG, d->sig.dif->app_tag);
		mp_kv_uint(b, SHCA_A_REF_TAG, d->sig.dif->ref_tag);
		mp_kv_uint(b, SHCA_A_FLAGS, d->sig.dif->flags);
	} else {
		mp_nil(b);
	}
	mp_str(b, SHCA_A_CRC);
	if (d->sig_type == MLX5DV_SIG_TYPE_CRC && d->sig.crc) {
		mp_map(b, SHCA_ATTR_NFIELDS_SIG_CRC);
		mp_kv_uint(b, SHCA_A_CRC_TYPE, d->sig.crc->type);
		mp_kv_uint(b, SHCA_A_SEED, d->sig.crc->seed);
	} else {
		mp_nil(b);
	}
	mp_kv_uint(b, SHCA_A_BLOCK_SIZE, d->block_size);
	mp_kv_uint(b, SHCA_A_COMP_MASK, d->comp_mask);
}

static void wr_set_mkey_sig_block(struct mlx5dv_qp_ex *m,
				  const struct mlx5dv_sig_block_attr *attr)
{
	struct mp_buf *b = &dvq(m)->wrs;

	if (!setter(m, SHCA_SETTER_SIG_BLOCK, attr))
		return;
	mp_map(b, SHCA_ATTR_NFIELDS_SIG_BLOCK_ATTR);
	mp_str(b, SHCA_A_MEM);
	sig_domain(b, attr->mem);
	mp_str(b, SHCA_A_WIRE);
	sig_domain(b, attr->wire);
	mp_kv_uint(b, SHCA_A_FLAGS, attr->flags);
	mp_kv_uint(b, SHCA_A_CHECK_MASK, attr->check_mask);
	mp_kv_uint(b, SHCA_A_COPY_MASK, attr->copy_mask);
	mp_kv_uint(b, SHCA_A_COMP_MASK, attr->comp_mask);
}

static void wr_set_mkey_crypto(struct mlx5dv_qp_ex *m, const struct mlx5dv_crypto_attr *attr)
{
	struct mp_buf *b = &dvq(m)->wrs;

	if (!setter(m, SHCA_SETTER_CRYPTO, attr))
		return;
	mp_map(b, SHCA_ATTR_NFIELDS_CRYPTO_ATTR);
	mp_kv_uint(b, SHCA_A_CRYPTO_STANDARD, attr->crypto_standard);
	mp_str(b, SHCA_A_ENCRYPT_ON_TX);
	mp_bool(b, attr->encrypt_on_tx);
	mp_kv_uint(b, SHCA_A_SIGNATURE_CRYPTO_ORDER, attr->signature_crypto_order);
	mp_kv_uint(b, SHCA_A_DATA_UNIT_SIZE, attr->data_unit_size);
	mp_str(b, SHCA_A_INITIAL_TWEAK);
	mp_bin(b, attr->initial_tweak, sizeof(attr->initial_tweak));
	mp_str(b, SHCA_A_DEK);
	if (attr->dek)
		mp_uint(b, attr->dek->handle);
	else
		mp_nil(b);
	mp_str(b, SHCA_A_KEYTAG);
	mp_bin(b, attr->keytag, sizeof(attr->keytag));
	mp_kv_uint(b, SHCA_A_COMP_MASK, attr->comp_mask);
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

/* -- QPs ---------------------------------------------------------------------------- */

static struct mlx5dv_qp_ex *qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *qpx)
{
	return &to_sqp_ex(qpx)->dv;
}

/* Number of WRs canceled, or -errno (mlx5dv_qp_cancel_posted_send_wrs(3)). */
static int cancel_posted_send_wrs(struct mlx5dv_qp_ex *m, uint64_t wr_id)
{
	struct shca_qp *qp = dvq(m);
	struct shca_context *ctx = to_sctx(qp->vqp.qp.context);
	struct mp_buf b;
	struct shca_frame r;
	uint32_t n = 0;
	int rc;

	shca_begin(ctx->conn, &b, SHCA_V_CANCEL_POSTED_SEND_WRS,
		   SHCA_NREQ_CANCEL_POSTED_SEND_WRS);
	mp_kv_uint(&b, SHCA_K_QP, qp->handle);
	mp_kv_uint(&b, SHCA_K_WR_ID, wr_id);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (rc)
		return -rc;
	rc = shca_get_u32(&r, SHCA_R_CANCELED, &n);
	shca_frame_free(&r);
	return rc ? -rc : (int)n;
}

const struct softhca_mlx5dv_ops softhca_mlx5dv_ops = {
	.version = SOFTHCA_MLX5DV_OPS_VERSION,
	.size = sizeof(struct softhca_mlx5dv_ops),
	.owns_device = shca_owns_device,
	.owns = shca_owns,
	.query_device = shca_dv_query_device,
	.create_qp = shca_dv_create_qp,
	.qp_ex_from_ibv_qp_ex = qp_ex_from_ibv_qp_ex,
	.qp_cancel_posted_send_wrs = cancel_posted_send_wrs,
	.create_mkey = shca_dv_create_mkey,
	.destroy_mkey = shca_dv_destroy_mkey,
	.mkey_check = shca_dv_mkey_check,
	.crypto_login = shca_dv_crypto_login,
	.crypto_login_query_state = shca_dv_crypto_login_query_state,
	.crypto_logout = shca_dv_crypto_logout,
	.crypto_login_create = shca_dv_crypto_login_create,
	.crypto_login_query = shca_dv_crypto_login_query,
	.crypto_login_destroy = shca_dv_crypto_login_destroy,
	.dek_create = shca_dv_dek_create,
	.dek_query = shca_dv_dek_query,
	.dek_destroy = shca_dv_dek_destroy,
};
