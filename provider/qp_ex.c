/* placeholder until the ibv_wr_* API lands */
#include "softhca.h"
void shca_qp_ex_init(struct shca_qp *qp, uint64_t send_ops_flags)
{
	(void)qp;
	(void)send_ops_flags;
}
