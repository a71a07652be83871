/* The control requests' and pushed frames' encodings that are more than a map of
 * numbers (docs/protocol.md): a request's head, the WR maps of post_send and
 * post_recv, a pushed or polled WC. Plain functions of their arguments over mp.c, with
 * libibverbs' structs and no call into it, so that provider/tests/wirecheck.c builds
 * them without the provider and tests/unit/test_wire_codec.py holds them to the Python
 * decoders (protocol/records.py, protocol/control.py). The names, counts and version
 * are wire.h's, generated from those tables. */
#ifndef SOFTHCA_WIRE_ENC_H
#define SOFTHCA_WIRE_ENC_H

#include <infiniband/verbs.h>

#include "mp.h"
#include "wire.h"

/* A request's map opened: nfields entries after "t" (verb) and "id". */
void shca_wire_begin(struct mp_buf *b, const char *verb, uint32_t id, uint32_t nfields);
/* "sg": the n SGEs as [addr, length, lkey]. */
void shca_wire_sges(struct mp_buf *b, const struct ibv_sge *sg, int n);
/* One send WR's map (protocol/records.py SEND_WR) with the SGEs sg (the WR's own, or
 * the bounce SGE of its inline data). ud: the QP is UD (wr.ud sent, ah_handle the
 * session's handle of its AH); mw_handle: the window of an IBV_WR_BIND_MW. */
void shca_wire_send_wr(struct mp_buf *b, const struct ibv_send_wr *wr,
		       const struct ibv_sge *sg, int nsge, int ud, uint32_t ah_handle,
		       uint32_t mw_handle);
/* One receive WR's map (RECV_WR). */
void shca_wire_recv_wr(struct mp_buf *b, const struct ibv_recv_wr *wr);
/* A post_send request's fields after its head (SHCA_NREQ_POST_SEND, and one more when
 * all): qp, the n WR maps encoded in wrs, wr_complete when all. */
void shca_wire_post_send(struct mp_buf *b, uint32_t qp, const struct mp_buf *wrs,
			 uint32_t n, int all);
/* The fields post_send's head counts (SHCA_NREQ_POST_SEND, plus wr_complete). */
#define SHCA_POST_SEND_NFIELDS(all) (SHCA_NREQ_POST_SEND + ((all) ? 1 : 0))
/* A WC's wire list (WC_FIELDS) as struct ibv_wc; a malformed one reads as zeros. */
void shca_wire_wc(struct mp_val w, struct ibv_wc *wc);

#endif
