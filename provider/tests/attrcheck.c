/* attrcheck: ibv_query_device_ex's extended fields and ibv_create_qp_ex's create_flags
 * through the provider (tests/native/test_query_device_ex.py).
 *
 *   attrcheck          prints "attrcheck: device_cap_flags 0x..", "device_cap_flags_ex
 *                      0x..", "phys_port_cnt_ex N" as ibv_query_device_ex answers them
 *                      (the test compares them with what it expects), checks that a
 *                      caller whose struct ends before device_cap_flags_ex has nothing
 *                      written past it, and that ibv_create_qp_ex with
 *                      IBV_QP_INIT_ATTR_CREATE_FLAGS takes 0 on an RC QP and
 *                      IBV_QP_CREATE_BLOCK_SELF_MCAST_LB on a UD QP (no multicast exists
 *                      to loop back) and refuses IBV_QP_CREATE_SCATTER_FCS, EOPNOTSUPP.
 *
 * Exit 0 when every check holds; each check prints one line. */
#define PROG "attrcheck"
#include <stddef.h>

#include "side.h"

static struct ibv_qp *qp_with_flags(struct side *s, enum ibv_qp_type type, uint32_t flags)
{
	struct ibv_qp_init_attr_ex a;

	memset(&a, 0, sizeof(a));
	a.qp_type = type;
	a.send_cq = s->cq;
	a.recv_cq = s->cq;
	a.cap.max_send_wr = a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	a.pd = s->pd;
	a.create_flags = flags;
	errno = 0;
	return ibv_create_qp_ex(s->ctx, &a);
}

int main(void)
{
	struct side s;
	struct ibv_device_attr_ex x;
	unsigned char *small;
	size_t cut = offsetof(struct ibv_device_attr_ex, device_cap_flags_ex);
	size_t i, dirty = 0;
	struct ibv_qp *qp;
	struct verbs_context *v;

	memset(&s, 0, sizeof(s));
	open_ctx(&s);
	memset(&x, 0, sizeof(x));
	if (ibv_query_device_ex(s.ctx, NULL, &x))
		die("ibv_query_device_ex");
	printf(PROG ": device_cap_flags 0x%x\n", (unsigned int)x.orig_attr.device_cap_flags);
	printf(PROG ": device_cap_flags_ex 0x%llx\n", (unsigned long long)x.device_cap_flags_ex);
	printf(PROG ": phys_port_cnt_ex %u\n", (unsigned int)x.phys_port_cnt_ex);
	printf(PROG ": odp general_caps 0x%llx\n", (unsigned long long)x.odp_caps.general_caps);
	printf(PROG ": odp rc_odp_caps 0x%x\n", x.odp_caps.per_transport_caps.rc_odp_caps);
	printf(PROG ": odp uc_odp_caps 0x%x\n", x.odp_caps.per_transport_caps.uc_odp_caps);
	printf(PROG ": odp ud_odp_caps 0x%x\n", x.odp_caps.per_transport_caps.ud_odp_caps);

	/* A struct of an older libibverbs, cut before device_cap_flags_ex, with a guard
	 * pattern after it: the provider writes nothing past its size. */
	small = malloc(sizeof(x));
	if (!small)
		die("malloc");
	memset(small, 0xA5, sizeof(x));
	v = verbs_get_ctx_op(s.ctx, query_device_ex);
	if (!v)
		die("no query_device_ex");
	if (v->query_device_ex(s.ctx, NULL, (struct ibv_device_attr_ex *)small, cut))
		die("query_device_ex (short)");
	for (i = cut; i < sizeof(x); i++)
		dirty += small[i] != 0xA5;
	CHECK(dirty == 0, "query_device_ex of %zu bytes wrote %zu bytes past them", cut, dirty);
	free(small);

	qp = qp_with_flags(&s, IBV_QPT_RC, 0);
	CHECK(qp != NULL, "RC QP with create_flags 0: %s", qp ? "created" : strerror(errno));
	if (qp)
		ibv_destroy_qp(qp);
	qp = qp_with_flags(&s, IBV_QPT_UD, IBV_QP_CREATE_BLOCK_SELF_MCAST_LB);
	CHECK(qp != NULL, "UD QP with BLOCK_SELF_MCAST_LB: %s", qp ? "created" : strerror(errno));
	if (qp)
		ibv_destroy_qp(qp);
	qp = qp_with_flags(&s, IBV_QPT_UD, IBV_QP_CREATE_SCATTER_FCS);
	CHECK(qp == NULL && errno == EOPNOTSUPP, "UD QP with SCATTER_FCS refused: %s",
	      qp ? "created" : strerror(errno));
	if (qp)
		ibv_destroy_qp(qp);
	ibv_dealloc_pd(s.pd);
	ibv_destroy_cq(s.cq);
	ibv_close_device(s.ctx);
	return failures ? 1 : 0;
}
