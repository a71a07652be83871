/* The encodings wire_enc.h names, over mp.c and wire.h's names and counts. */
#include <arpa/inet.h>
#include <string.h>

#include "wire_enc.h"

void shca_wire_begin(struct mp_buf *b, const char *verb, uint32_t id, uint32_t nfields)
{
	mp_init(b);
	mp_map(b, nfields + 2);
	mp_str(b, SHCA_KEY_T);
	mp_str(b, verb);
	mp_kv_uint(b, SHCA_KEY_ID, id);
}

void shca_wire_sges(struct mp_buf *b, const struct ibv_sge *sg, int n)
{
	int i;

	mp_str(b, SHCA_K_SG);
	mp_arr(b, (uint32_t)n);
	for (i = 0; i < n; i++) {
		mp_arr(b, 3);
		mp_uint(b, sg[i].addr);
		mp_uint(b, sg[i].length);
		mp_uint(b, sg[i].lkey);
	}
}

void shca_wire_send_wr(struct mp_buf *b, const struct ibv_send_wr *wr,
		       const struct ibv_sge *sg, int nsge, int ud, uint32_t ah_handle,
		       uint32_t mw_handle)
{
	int imm = wr->opcode == IBV_WR_SEND_WITH_IMM ||
		  wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	int bind = wr->opcode == IBV_WR_BIND_MW;
	/* ibv_wr_atomic_write's value is in wr.atomic (qp_ex.c); with ibv_post_send the
	 * 8 bytes are an SGE and the target wr.rdma. */
	int atomic = wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		     wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ||
		     (wr->opcode == IBV_WR_ATOMIC_WRITE && wr->num_sge == 0);

	/* imm_data and bind are one entry each, present or not */
	mp_map(b, SHCA_SEND_WR_NREQ + (uint32_t)imm + (ud ? SHCA_SEND_WR_NUD : 0) +
	       (uint32_t)bind);
	mp_kv_uint(b, SHCA_K_WR_ID, wr->wr_id);
	mp_kv_uint(b, SHCA_K_OPCODE, wr->opcode);
	shca_wire_sges(b, sg, nsge);
	mp_kv_uint(b, SHCA_K_SEND_FLAGS, wr->send_flags);
	if (imm)
		mp_kv_uint(b, SHCA_K_IMM_DATA, ntohl(wr->imm_data));
	/* wr.ud shares its storage with wr.rdma and wr.atomic (a union): a UD WR sends
	 * its AH's handle, remote QPN and Q_Key, and no RDMA fields. */
	if (ud) {
		mp_kv_uint(b, SHCA_K_AH, ah_handle);
		mp_kv_uint(b, SHCA_K_REMOTE_QPN, wr->wr.ud.remote_qpn & 0xFFFFFF);
		mp_kv_uint(b, SHCA_K_REMOTE_QKEY, wr->wr.ud.remote_qkey);
		mp_kv_uint(b, SHCA_K_RKEY, 0);
		mp_kv_uint(b, SHCA_K_REMOTE_ADDR, 0);
		mp_kv_uint(b, SHCA_K_COMPARE_ADD, 0);
		mp_kv_uint(b, SHCA_K_SWAP, 0);
	} else if (atomic) {
		mp_kv_uint(b, SHCA_K_RKEY, wr->wr.atomic.rkey);
		mp_kv_uint(b, SHCA_K_REMOTE_ADDR, wr->wr.atomic.remote_addr);
		mp_kv_uint(b, SHCA_K_COMPARE_ADD, wr->wr.atomic.compare_add);
		mp_kv_uint(b, SHCA_K_SWAP, wr->wr.atomic.swap);
	} else {
		/* A bind's new key is bind_mw.rkey, in a union of its own. */
		mp_kv_uint(b, SHCA_K_RKEY, bind ? wr->bind_mw.rkey : wr->wr.rdma.rkey);
		mp_kv_uint(b, SHCA_K_REMOTE_ADDR, bind ? 0 : wr->wr.rdma.remote_addr);
		mp_kv_uint(b, SHCA_K_COMPARE_ADD, 0);
		mp_kv_uint(b, SHCA_K_SWAP, 0);
	}
	mp_kv_uint(b, SHCA_K_INVALIDATE_RKEY,
		   wr->opcode == IBV_WR_SEND_WITH_INV || wr->opcode == IBV_WR_LOCAL_INV ?
		   wr->invalidate_rkey : 0);
	if (bind) {
		/* bind_mw: the window's handle, the MR's lkey, addr, length, access; the new
		 * key travels as "rkey" (server/mw_verbs.py). */
		const struct ibv_mw_bind_info *bi = &wr->bind_mw.bind_info;

		mp_str(b, SHCA_K_BIND);
		mp_arr(b, SHCA_SEND_WR_BIND_LEN);
		mp_uint(b, mw_handle);
		mp_uint(b, bi->mr ? bi->mr->lkey : 0);
		mp_uint(b, bi->addr);
		mp_uint(b, bi->length);
		mp_uint(b, bi->mw_access_flags);
	}
}

void shca_wire_recv_wr(struct mp_buf *b, const struct ibv_recv_wr *wr)
{
	mp_map(b, SHCA_RECV_WR_NREQ);
	mp_kv_uint(b, SHCA_K_WR_ID, wr->wr_id);
	shca_wire_sges(b, wr->sg_list, wr->num_sge);
}

void shca_wire_post_send(struct mp_buf *b, uint32_t qp, const struct mp_buf *wrs,
			 uint32_t n, int all)
{
	mp_kv_uint(b, SHCA_K_QP, qp);
	mp_str(b, SHCA_K_WRS);
	mp_arr(b, n);
	mp_raw(b, wrs->p, wrs->len);
	b->failed |= wrs->failed;
	if (all) {
		mp_str(b, SHCA_K_WR_COMPLETE);
		mp_bool(b, 1);
	}
}

void shca_wire_wc(struct mp_val w, struct ibv_wc *wc)
{
	uint64_t f[SHCA_WC_NFIELDS] = {0};
	int has_imm = 0;
	struct mp_val e;
	uint32_t n, i;

	memset(wc, 0, sizeof(*wc));
	if (!mp_get_arr(w, &n, &e))
		return;
	for (i = 0; i < n && i < SHCA_WC_NFIELDS; i++) {
		if (mp_get_uint(e, &f[i]) && i == SHCA_WC_IMM_DATA)
			has_imm = 1;
		if (!mp_next(&e))
			break;
	}
	wc->wr_id = f[SHCA_WC_WR_ID];
	wc->status = (enum ibv_wc_status)f[SHCA_WC_STATUS];
	wc->opcode = (enum ibv_wc_opcode)f[SHCA_WC_OPCODE];
	wc->byte_len = (uint32_t)f[SHCA_WC_BYTE_LEN];
	wc->qp_num = (uint32_t)f[SHCA_WC_QP_NUM];
	wc->wc_flags = (unsigned int)f[SHCA_WC_WC_FLAGS];
	wc->vendor_err = (uint32_t)f[SHCA_WC_VENDOR_ERR];
	/* A UD receive's source QP (slid, sl, pkey_index are 0). */
	wc->src_qp = (uint32_t)f[SHCA_WC_SRC_QP];
	/* imm_data is the C field's big-endian bits; the wire carries its value. */
	if (wc->wc_flags & IBV_WC_WITH_INV)
		wc->invalidated_rkey = (uint32_t)f[SHCA_WC_INVALIDATED_RKEY];
	else if (has_imm)
		wc->imm_data = htonl((uint32_t)f[SHCA_WC_IMM_DATA]);
}
