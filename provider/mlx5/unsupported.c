/* The mlx5dv calls softhca does not model, written by gen_unsupported.py (beside this
 * file) from mlx5dv.h's prototypes of the names Debian's libmlx5.so.1 exports
 * (libmlx5.map) that mlx5.c does not define: regenerate rather than edit by hand
 * (tests/unit/test_mlx5_unsupported.py checks it is current). Each answers as its man
 * page says a call fails: pointer-returning ones NULL with errno EOPNOTSUPP,
 * int-returning ones the errno value EOPNOTSUPP (errno set as well), the two that
 * return -1 on failure (mlx5dv_devx_get_event, mlx5dv_vfio_get_events_fd) -1 with errno
 * EOPNOTSUPP, void ones nothing. DevX, steering (flow and DR), device memory, UARs,
 * VARs, packet pacing, scheduling elements, LAG, VFIO and DC streams are mlx5 hardware
 * interfaces with no counterpart in the model. */
#include <errno.h>

#include "mlx5.h"

/* the stubs take their arguments only to have mlx5dv.h's prototypes */
#pragma GCC diagnostic ignored "-Wunused-parameter"

int
_mlx5dv_query_port(struct ibv_context *context, uint32_t port_num, struct mlx5_ib_uapi_query_port *info, size_t info_len)
{
	return shca_dv_unsupported("_mlx5dv_query_port");
}

struct ibv_dm *
mlx5dv_alloc_dm(struct ibv_context *context, struct ibv_alloc_dm_attr *dm_attr, struct mlx5dv_alloc_dm_attr *mlx5_dm_attr)
{
	return shca_dv_unsupported_ptr("mlx5dv_alloc_dm");
}

struct mlx5dv_var *
mlx5dv_alloc_var(struct ibv_context *context, uint32_t flags)
{
	return shca_dv_unsupported_ptr("mlx5dv_alloc_var");
}

struct ibv_cq_ex *
mlx5dv_create_cq(struct ibv_context *context, struct ibv_cq_init_attr_ex *cq_attr, struct mlx5dv_cq_init_attr *mlx5_cq_attr)
{
	return shca_dv_unsupported_ptr("mlx5dv_create_cq");
}

struct ibv_flow *
mlx5dv_create_flow(struct mlx5dv_flow_matcher *matcher, struct mlx5dv_flow_match_parameters *match_value, size_t num_actions, struct mlx5dv_flow_action_attr actions_attr[])
{
	return shca_dv_unsupported_ptr("mlx5dv_create_flow");
}

struct ibv_flow_action *
mlx5dv_create_flow_action_esp(struct ibv_context *ctx, struct ibv_flow_action_esp_attr *esp, struct mlx5dv_flow_action_esp *mlx5_attr)
{
	return shca_dv_unsupported_ptr("mlx5dv_create_flow_action_esp");
}

struct ibv_flow_action *
mlx5dv_create_flow_action_modify_header(struct ibv_context *ctx, size_t actions_sz, uint64_t actions[], enum mlx5_ib_uapi_flow_table_type ft_type)
{
	return shca_dv_unsupported_ptr("mlx5dv_create_flow_action_modify_header");
}

struct ibv_flow_action *
mlx5dv_create_flow_action_packet_reformat(struct ibv_context *ctx, size_t data_sz, void *data, enum mlx5_ib_uapi_flow_action_packet_reformat_type reformat_type, enum mlx5_ib_uapi_flow_table_type ft_type)
{
	return shca_dv_unsupported_ptr("mlx5dv_create_flow_action_packet_reformat");
}

struct mlx5dv_flow_matcher *
mlx5dv_create_flow_matcher(struct ibv_context *context, struct mlx5dv_flow_matcher_attr *matcher_attr)
{
	return shca_dv_unsupported_ptr("mlx5dv_create_flow_matcher");
}

struct mlx5dv_steering_anchor *
mlx5dv_create_steering_anchor(struct ibv_context *context, struct mlx5dv_steering_anchor_attr *attr)
{
	return shca_dv_unsupported_ptr("mlx5dv_create_steering_anchor");
}

struct ibv_wq *
mlx5dv_create_wq(struct ibv_context *context, struct ibv_wq_init_attr *wq_init_attr, struct mlx5dv_wq_init_attr *mlx5_wq_attr)
{
	return shca_dv_unsupported_ptr("mlx5dv_create_wq");
}

int
mlx5dv_dci_stream_id_reset(struct ibv_qp *qp, uint16_t stream_id)
{
	return shca_dv_unsupported("mlx5dv_dci_stream_id_reset");
}

int
mlx5dv_destroy_flow_matcher(struct mlx5dv_flow_matcher *matcher)
{
	return shca_dv_unsupported("mlx5dv_destroy_flow_matcher");
}

int
mlx5dv_destroy_steering_anchor(struct mlx5dv_steering_anchor *sa)
{
	return shca_dv_unsupported("mlx5dv_destroy_steering_anchor");
}

struct mlx5dv_devx_msi_vector *
mlx5dv_devx_alloc_msi_vector(struct ibv_context *ibctx)
{
	return shca_dv_unsupported_ptr("mlx5dv_devx_alloc_msi_vector");
}

struct mlx5dv_devx_uar *
mlx5dv_devx_alloc_uar(struct ibv_context *context, uint32_t flags)
{
	return shca_dv_unsupported_ptr("mlx5dv_devx_alloc_uar");
}

int
mlx5dv_devx_cq_modify(struct ibv_cq *cq, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported("mlx5dv_devx_cq_modify");
}

int
mlx5dv_devx_cq_query(struct ibv_cq *cq, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported("mlx5dv_devx_cq_query");
}

struct mlx5dv_devx_cmd_comp *
mlx5dv_devx_create_cmd_comp(struct ibv_context *context)
{
	return shca_dv_unsupported_ptr("mlx5dv_devx_create_cmd_comp");
}

struct mlx5dv_devx_eq *
mlx5dv_devx_create_eq(struct ibv_context *ibctx, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported_ptr("mlx5dv_devx_create_eq");
}

struct mlx5dv_devx_event_channel *
mlx5dv_devx_create_event_channel(struct ibv_context *context, enum mlx5_ib_uapi_devx_create_event_channel_flags flags)
{
	return shca_dv_unsupported_ptr("mlx5dv_devx_create_event_channel");
}

void
mlx5dv_devx_destroy_cmd_comp(struct mlx5dv_devx_cmd_comp *cmd_comp)
{
	shca_dv_unsupported("mlx5dv_devx_destroy_cmd_comp");
}

int
mlx5dv_devx_destroy_eq(struct mlx5dv_devx_eq *eq)
{
	return shca_dv_unsupported("mlx5dv_devx_destroy_eq");
}

void
mlx5dv_devx_destroy_event_channel(struct mlx5dv_devx_event_channel *event_channel)
{
	shca_dv_unsupported("mlx5dv_devx_destroy_event_channel");
}

int
mlx5dv_devx_free_msi_vector(struct mlx5dv_devx_msi_vector *msi)
{
	return shca_dv_unsupported("mlx5dv_devx_free_msi_vector");
}

void
mlx5dv_devx_free_uar(struct mlx5dv_devx_uar *devx_uar)
{
	shca_dv_unsupported("mlx5dv_devx_free_uar");
}

int
mlx5dv_devx_general_cmd(struct ibv_context *context, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported("mlx5dv_devx_general_cmd");
}

int
mlx5dv_devx_get_async_cmd_comp(struct mlx5dv_devx_cmd_comp *cmd_comp, struct mlx5_ib_uapi_devx_async_cmd_hdr *cmd_resp, size_t cmd_resp_len)
{
	return shca_dv_unsupported("mlx5dv_devx_get_async_cmd_comp");
}

ssize_t
mlx5dv_devx_get_event(struct mlx5dv_devx_event_channel *event_channel, struct mlx5_ib_uapi_devx_async_event_hdr *event_data, size_t event_resp_len)
{
	shca_dv_unsupported("mlx5dv_devx_get_event");
	return -1;
}

int
mlx5dv_devx_ind_tbl_modify(struct ibv_rwq_ind_table *ind_tbl, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported("mlx5dv_devx_ind_tbl_modify");
}

int
mlx5dv_devx_ind_tbl_query(struct ibv_rwq_ind_table *ind_tbl, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported("mlx5dv_devx_ind_tbl_query");
}

struct mlx5dv_devx_obj *
mlx5dv_devx_obj_create(struct ibv_context *context, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported_ptr("mlx5dv_devx_obj_create");
}

int
mlx5dv_devx_obj_destroy(struct mlx5dv_devx_obj *obj)
{
	return shca_dv_unsupported("mlx5dv_devx_obj_destroy");
}

int
mlx5dv_devx_obj_modify(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported("mlx5dv_devx_obj_modify");
}

int
mlx5dv_devx_obj_query(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported("mlx5dv_devx_obj_query");
}

int
mlx5dv_devx_obj_query_async(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, size_t outlen, uint64_t wr_id, struct mlx5dv_devx_cmd_comp *cmd_comp)
{
	return shca_dv_unsupported("mlx5dv_devx_obj_query_async");
}

int
mlx5dv_devx_qp_modify(struct ibv_qp *qp, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported("mlx5dv_devx_qp_modify");
}

int
mlx5dv_devx_qp_query(struct ibv_qp *qp, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported("mlx5dv_devx_qp_query");
}

int
mlx5dv_devx_query_eqn(struct ibv_context *context, uint32_t vector, uint32_t *eqn)
{
	return shca_dv_unsupported("mlx5dv_devx_query_eqn");
}

int
mlx5dv_devx_srq_modify(struct ibv_srq *srq, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported("mlx5dv_devx_srq_modify");
}

int
mlx5dv_devx_srq_query(struct ibv_srq *srq, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported("mlx5dv_devx_srq_query");
}

int
mlx5dv_devx_subscribe_devx_event(struct mlx5dv_devx_event_channel *event_channel, struct mlx5dv_devx_obj *obj, uint16_t events_sz, uint16_t events_num[], uint64_t cookie)
{
	return shca_dv_unsupported("mlx5dv_devx_subscribe_devx_event");
}

int
mlx5dv_devx_subscribe_devx_event_fd(struct mlx5dv_devx_event_channel *event_channel, int fd, struct mlx5dv_devx_obj *obj, uint16_t event_num)
{
	return shca_dv_unsupported("mlx5dv_devx_subscribe_devx_event_fd");
}

int
mlx5dv_devx_umem_dereg(struct mlx5dv_devx_umem *umem)
{
	return shca_dv_unsupported("mlx5dv_devx_umem_dereg");
}

struct mlx5dv_devx_umem *
mlx5dv_devx_umem_reg(struct ibv_context *ctx, void *addr, size_t size, uint32_t access)
{
	return shca_dv_unsupported_ptr("mlx5dv_devx_umem_reg");
}

struct mlx5dv_devx_umem *
mlx5dv_devx_umem_reg_ex(struct ibv_context *ctx, struct mlx5dv_devx_umem_in *umem_in)
{
	return shca_dv_unsupported_ptr("mlx5dv_devx_umem_reg_ex");
}

int
mlx5dv_devx_wq_modify(struct ibv_wq *wq, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported("mlx5dv_devx_wq_modify");
}

int
mlx5dv_devx_wq_query(struct ibv_wq *wq, const void *in, size_t inlen, void *out, size_t outlen)
{
	return shca_dv_unsupported("mlx5dv_devx_wq_query");
}

void *
mlx5dv_dm_map_op_addr(struct ibv_dm *dm, uint8_t op)
{
	return shca_dv_unsupported_ptr("mlx5dv_dm_map_op_addr");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_aso(struct mlx5dv_dr_domain *domain, struct mlx5dv_devx_obj *devx_obj, uint32_t offset, uint32_t flags, uint8_t return_reg_c)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_aso");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_default_miss(void)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_default_miss");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_dest_array(struct mlx5dv_dr_domain *domain, size_t num_dest, struct mlx5dv_dr_action_dest_attr *dests[])
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_dest_array");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_dest_devx_tir(struct mlx5dv_devx_obj *devx_obj)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_dest_devx_tir");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_dest_ib_port(struct mlx5dv_dr_domain *domain, uint32_t ib_port)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_dest_ib_port");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_dest_ibv_qp(struct ibv_qp *ibqp)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_dest_ibv_qp");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_dest_root_table(struct mlx5dv_dr_table *table, uint16_t priority)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_dest_root_table");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_dest_table(struct mlx5dv_dr_table *table)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_dest_table");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_dest_vport(struct mlx5dv_dr_domain *domain, uint32_t vport)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_dest_vport");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_drop(void)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_drop");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_flow_counter(struct mlx5dv_devx_obj *devx_obj, uint32_t offset)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_flow_counter");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_flow_meter(struct mlx5dv_dr_flow_meter_attr *attr)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_flow_meter");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_flow_sampler(struct mlx5dv_dr_flow_sampler_attr *attr)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_flow_sampler");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_modify_header(struct mlx5dv_dr_domain *domain, uint32_t flags, size_t actions_sz, __be64 actions[])
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_modify_header");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_packet_reformat(struct mlx5dv_dr_domain *domain, uint32_t flags, enum mlx5_ib_uapi_flow_action_packet_reformat_type reformat_type, size_t data_sz, void *data)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_packet_reformat");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_pop_vlan(void)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_pop_vlan");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_push_vlan(struct mlx5dv_dr_domain *domain, __be32 vlan_hdr)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_push_vlan");
}

struct mlx5dv_dr_action *
mlx5dv_dr_action_create_tag(uint32_t tag_value)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_action_create_tag");
}

int
mlx5dv_dr_action_destroy(struct mlx5dv_dr_action *action)
{
	return shca_dv_unsupported("mlx5dv_dr_action_destroy");
}

int
mlx5dv_dr_action_modify_aso(struct mlx5dv_dr_action *action, uint32_t offset, uint32_t flags, uint8_t return_reg_c)
{
	return shca_dv_unsupported("mlx5dv_dr_action_modify_aso");
}

int
mlx5dv_dr_action_modify_flow_meter(struct mlx5dv_dr_action *action, struct mlx5dv_dr_flow_meter_attr *attr, __be64 modify_field_select)
{
	return shca_dv_unsupported("mlx5dv_dr_action_modify_flow_meter");
}

int
mlx5dv_dr_aso_other_domain_link(struct mlx5dv_devx_obj *devx_obj, struct mlx5dv_dr_domain *peer_dmn, struct mlx5dv_dr_domain *dmn, uint32_t flags, uint8_t return_reg_c)
{
	return shca_dv_unsupported("mlx5dv_dr_aso_other_domain_link");
}

int
mlx5dv_dr_aso_other_domain_unlink(struct mlx5dv_devx_obj *devx_obj, struct mlx5dv_dr_domain *dmn)
{
	return shca_dv_unsupported("mlx5dv_dr_aso_other_domain_unlink");
}

void
mlx5dv_dr_domain_allow_duplicate_rules(struct mlx5dv_dr_domain *domain, bool allow)
{
	shca_dv_unsupported("mlx5dv_dr_domain_allow_duplicate_rules");
}

struct mlx5dv_dr_domain *
mlx5dv_dr_domain_create(struct ibv_context *ctx, enum mlx5dv_dr_domain_type type)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_domain_create");
}

int
mlx5dv_dr_domain_destroy(struct mlx5dv_dr_domain *domain)
{
	return shca_dv_unsupported("mlx5dv_dr_domain_destroy");
}

void
mlx5dv_dr_domain_set_reclaim_device_memory(struct mlx5dv_dr_domain *dmn, bool enable)
{
	shca_dv_unsupported("mlx5dv_dr_domain_set_reclaim_device_memory");
}

int
mlx5dv_dr_domain_sync(struct mlx5dv_dr_domain *domain, uint32_t flags)
{
	return shca_dv_unsupported("mlx5dv_dr_domain_sync");
}

struct mlx5dv_dr_matcher *
mlx5dv_dr_matcher_create(struct mlx5dv_dr_table *table, uint16_t priority, uint8_t match_criteria_enable, struct mlx5dv_flow_match_parameters *mask)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_matcher_create");
}

int
mlx5dv_dr_matcher_destroy(struct mlx5dv_dr_matcher *matcher)
{
	return shca_dv_unsupported("mlx5dv_dr_matcher_destroy");
}

int
mlx5dv_dr_matcher_set_layout(struct mlx5dv_dr_matcher *matcher, struct mlx5dv_dr_matcher_layout *layout)
{
	return shca_dv_unsupported("mlx5dv_dr_matcher_set_layout");
}

struct mlx5dv_dr_rule *
mlx5dv_dr_rule_create(struct mlx5dv_dr_matcher *matcher, struct mlx5dv_flow_match_parameters *value, size_t num_actions, struct mlx5dv_dr_action *actions[])
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_rule_create");
}

int
mlx5dv_dr_rule_destroy(struct mlx5dv_dr_rule *rule)
{
	return shca_dv_unsupported("mlx5dv_dr_rule_destroy");
}

struct mlx5dv_dr_table *
mlx5dv_dr_table_create(struct mlx5dv_dr_domain *domain, uint32_t level)
{
	return shca_dv_unsupported_ptr("mlx5dv_dr_table_create");
}

int
mlx5dv_dr_table_destroy(struct mlx5dv_dr_table *table)
{
	return shca_dv_unsupported("mlx5dv_dr_table_destroy");
}

int
mlx5dv_dump_dr_domain(FILE *fout, struct mlx5dv_dr_domain *domain)
{
	return shca_dv_unsupported("mlx5dv_dump_dr_domain");
}

int
mlx5dv_dump_dr_matcher(FILE *fout, struct mlx5dv_dr_matcher *matcher)
{
	return shca_dv_unsupported("mlx5dv_dump_dr_matcher");
}

int
mlx5dv_dump_dr_rule(FILE *fout, struct mlx5dv_dr_rule *rule)
{
	return shca_dv_unsupported("mlx5dv_dump_dr_rule");
}

int
mlx5dv_dump_dr_table(FILE *fout, struct mlx5dv_dr_table *table)
{
	return shca_dv_unsupported("mlx5dv_dump_dr_table");
}

void
mlx5dv_free_var(struct mlx5dv_var *dv_var)
{
	shca_dv_unsupported("mlx5dv_free_var");
}

int
mlx5dv_get_clock_info(struct ibv_context *context, struct mlx5dv_clock_info *clock_info)
{
	return shca_dv_unsupported("mlx5dv_get_clock_info");
}

struct ibv_device **
mlx5dv_get_vfio_device_list(struct mlx5dv_vfio_context_attr *attr)
{
	return shca_dv_unsupported_ptr("mlx5dv_get_vfio_device_list");
}

int
mlx5dv_map_ah_to_qp(struct ibv_ah *ah, uint32_t qp_num)
{
	return shca_dv_unsupported("mlx5dv_map_ah_to_qp");
}

int
mlx5dv_modify_qp_lag_port(struct ibv_qp *qp, uint8_t port_num)
{
	return shca_dv_unsupported("mlx5dv_modify_qp_lag_port");
}

int
mlx5dv_modify_qp_sched_elem(struct ibv_qp *qp, const struct mlx5dv_sched_leaf *requestor, const struct mlx5dv_sched_leaf *responder)
{
	return shca_dv_unsupported("mlx5dv_modify_qp_sched_elem");
}

int
mlx5dv_modify_qp_udp_sport(struct ibv_qp *qp, uint16_t udp_sport)
{
	return shca_dv_unsupported("mlx5dv_modify_qp_udp_sport");
}

struct mlx5dv_pp *
mlx5dv_pp_alloc(struct ibv_context *context, size_t pp_context_sz, const void *pp_context, uint32_t flags)
{
	return shca_dv_unsupported_ptr("mlx5dv_pp_alloc");
}

void
mlx5dv_pp_free(struct mlx5dv_pp *pp)
{
	shca_dv_unsupported("mlx5dv_pp_free");
}

int
mlx5dv_query_qp_lag_port(struct ibv_qp *qp, uint8_t *port_num, uint8_t *active_port_num)
{
	return shca_dv_unsupported("mlx5dv_query_qp_lag_port");
}

int
mlx5dv_reserved_qpn_alloc(struct ibv_context *ctx, uint32_t *qpn)
{
	return shca_dv_unsupported("mlx5dv_reserved_qpn_alloc");
}

int
mlx5dv_reserved_qpn_dealloc(struct ibv_context *ctx, uint32_t qpn)
{
	return shca_dv_unsupported("mlx5dv_reserved_qpn_dealloc");
}

struct mlx5dv_sched_leaf *
mlx5dv_sched_leaf_create(struct ibv_context *context, const struct mlx5dv_sched_attr *sched_attr)
{
	return shca_dv_unsupported_ptr("mlx5dv_sched_leaf_create");
}

int
mlx5dv_sched_leaf_destroy(struct mlx5dv_sched_leaf *leaf)
{
	return shca_dv_unsupported("mlx5dv_sched_leaf_destroy");
}

int
mlx5dv_sched_leaf_modify(struct mlx5dv_sched_leaf *leaf, const struct mlx5dv_sched_attr *sched_attr)
{
	return shca_dv_unsupported("mlx5dv_sched_leaf_modify");
}

struct mlx5dv_sched_node *
mlx5dv_sched_node_create(struct ibv_context *context, const struct mlx5dv_sched_attr *sched_attr)
{
	return shca_dv_unsupported_ptr("mlx5dv_sched_node_create");
}

int
mlx5dv_sched_node_destroy(struct mlx5dv_sched_node *node)
{
	return shca_dv_unsupported("mlx5dv_sched_node_destroy");
}

int
mlx5dv_sched_node_modify(struct mlx5dv_sched_node *node, const struct mlx5dv_sched_attr *sched_attr)
{
	return shca_dv_unsupported("mlx5dv_sched_node_modify");
}

int
mlx5dv_set_context_attr(struct ibv_context *context, enum mlx5dv_set_ctx_attr_type type, void *attr)
{
	return shca_dv_unsupported("mlx5dv_set_context_attr");
}

int
mlx5dv_vfio_get_events_fd(struct ibv_context *ibctx)
{
	shca_dv_unsupported("mlx5dv_vfio_get_events_fd");
	return -1;
}

int
mlx5dv_vfio_process_events(struct ibv_context *context)
{
	return shca_dv_unsupported("mlx5dv_vfio_process_events");
}
