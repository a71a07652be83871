/* Address handles for UD QPs: ibv_create_ah(3) and ibv_destroy_ah(3). The AH lives in
 * the daemon (create_ah, server/ud_verbs.py); here it is its session's handle. Its dgid
 * names the peer's daemon and device as an RC QP's address vector does (shca_av_dest);
 * the sgid is this port's GID at the AH's sgid_index, as the GRH carries both. */
#include <errno.h>
#include <stdlib.h>

#include "softhca.h"

struct ibv_ah *shca_create_ah(struct ibv_pd *ibpd, struct ibv_ah_attr *attr)
{
	struct shca_context *ctx = to_sctx(ibpd->context);
	struct shca_ah *ah;
	union ibv_gid sgid;
	char host[32];
	unsigned port = 0;
	const char *dev = NULL;
	struct mp_buf b;
	struct shca_frame r;
	int rc;

	if (!attr) {
		errno = EINVAL;
		return NULL;
	}
	rc = shca_av_dest(ctx, attr, host, sizeof(host), &port, &dev, "ibv_create_ah");
	if (!rc && ibv_query_gid(ibpd->context, attr->port_num ? attr->port_num : 1,
				 attr->grh.sgid_index, &sgid))
		rc = EINVAL;
	if (rc) {
		errno = rc;
		return NULL;
	}
	ah = calloc(1, sizeof(*ah));
	if (!ah) {
		errno = ENOMEM;
		return NULL;
	}
	shca_begin(ctx->conn, &b, SHCA_V_CREATE_AH, SHCA_NFIELDS_CREATE_AH);
	mp_kv_uint(&b, SHCA_K_PD, to_spd(ibpd)->handle);
	mp_str(&b, SHCA_K_DEST_HOST);
	mp_str(&b, host);
	mp_kv_uint(&b, SHCA_K_DEST_PORT, port);
	mp_str(&b, SHCA_K_DEST_DEV);
	mp_str(&b, dev);
	mp_str(&b, SHCA_K_SGID);
	mp_bin(&b, sgid.raw, 16);
	mp_str(&b, SHCA_K_DGID);
	mp_bin(&b, attr->grh.dgid.raw, 16);
	mp_kv_uint(&b, SHCA_K_TRAFFIC_CLASS, attr->grh.traffic_class);
	mp_kv_uint(&b, SHCA_K_HOP_LIMIT, attr->grh.hop_limit);
	mp_kv_uint(&b, SHCA_K_FLOW_LABEL, attr->grh.flow_label & 0xFFFFF);
	rc = shca_call(ctx->conn, &b, NULL, 0, &r);
	if (!rc) {
		rc = shca_get_u32(&r, SHCA_R_AH, &ah->handle);
		shca_frame_free(&r);
	}
	if (rc) {
		free(ah);
		errno = rc;
		return NULL;
	}
	ah->ah.context = ibpd->context;
	ah->ah.pd = ibpd;
	ah->ah.handle = ah->handle;
	return &ah->ah;
}

int shca_destroy_ah(struct ibv_ah *ibah)
{
	struct shca_ah *ah = to_sah(ibah);
	int rc = shca_call_simple(to_sctx(ibah->context), SHCA_V_DESTROY_AH, SHCA_K_AH, ah->handle);

	if (!rc)
		free(ah);
	return rc;
}
