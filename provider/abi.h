/* The few structures of libibverbs' private provider interface that a provider needs,
 * declared from their documented layout (rdma-core libibverbs/driver.h) for private ABI
 * version 34, which Debian's libibverbs 44 exports as IBVERBS_PRIVATE_34. The public
 * structures (struct ibv_*, struct verbs_context) come from the installed
 * <infiniband/verbs.h>.
 *
 * Why declared here rather than taken from rdma-core's source: no Debian package ships
 * driver.h, and the header pulls in generated kernel-ABI headers and a configured
 * config.h, which only a cmake run of rdma-core produces. These declarations are the
 * whole interface this provider uses; a test checks that the installed libibverbs
 * exports the symbols of this private ABI version. Any change to these layouts upstream
 * comes with a new private ABI number, so a libibverbs of another private ABI refuses to
 * load this provider rather than misreading it. */
#ifndef SOFTHCA_ABI_H
#define SOFTHCA_ABI_H

#include <infiniband/verbs.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define SOFTHCA_PABI_VERSION 34

struct softhca_list_node {
	struct softhca_list_node *next, *prev;
};

enum {
	VERBS_MATCH_SENTINEL = 0,
	VERBS_MATCH_PCI = 1,
	VERBS_MATCH_MODALIAS = 2,
	VERBS_MATCH_DRIVER_ID = 3,
};

struct verbs_match_ent {
	void *driver_data;
	union {
		const char *modalias;
		uint64_t driver_id;
	} u;
	uint16_t vendor;
	uint16_t device;
	uint8_t kind;
};

/* libibverbs' extension of struct ibv_mr: ibv_dereg_mr reads mr_type. */
enum { VERBS_MR_TYPE_MR = 0 };
struct verbs_mr {
	struct ibv_mr ibv_mr;
	int mr_type;    /* enum ibv_mr_type */
	int access;
};

/* libibverbs' extension of struct ibv_qp: ibv_qp_to_qp_ex() reads comp_mask. */
#define VERBS_QP_EX (1 << 1)
struct verbs_qp {
	union {
		struct ibv_qp qp;
		struct ibv_qp_ex qp_ex;
	};
	uint32_t comp_mask;
	void *xrcd;
};

/* Only passed through: this provider reads none of its fields. */
struct verbs_sysfs_dev;

struct verbs_device_ops {
	const char *name;
	uint32_t match_min_abi_version;
	uint32_t match_max_abi_version;
	const struct verbs_match_ent *match_table;
	const struct verbs_device_ops **static_providers;
	bool (*match_device)(struct verbs_sysfs_dev *sysfs_dev);
	struct verbs_context *(*alloc_context)(struct ibv_device *device, int cmd_fd,
					       void *private_data);
	struct verbs_context *(*import_context)(struct ibv_device *device, int cmd_fd);
	struct verbs_device *(*alloc_device)(struct verbs_sysfs_dev *sysfs_dev);
	void (*uninit_device)(struct verbs_device *device);
};

struct verbs_device {
	struct ibv_device device; /* first */
	const struct verbs_device_ops *ops;
	atomic_int refcount;
	struct softhca_list_node entry;
	struct verbs_sysfs_dev *sysfs;
	uint64_t core_support;
};

/* The union of every op a provider can supply, in libibverbs' order (alphabetical).
 * verbs_set_ops copies the non-NULL ones into the context, so the whole table must be
 * present; the ops this provider does not supply stay NULL (libibverbs then answers
 * EOPNOTSUPP for them). Pointers this provider never sets are plain void *. */
struct verbs_context_ops {
	void *advise_mr;
	void *alloc_dm;
	void *alloc_mw;
	void *alloc_null_mr;
	void *alloc_parent_domain;
	struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
	void *alloc_td;
	void (*async_event)(struct ibv_context *context, struct ibv_async_event *event);
	void *attach_counters_point_flow;
	void *attach_mcast;
	void *bind_mw;
	void *close_xrcd;
	void (*cq_event)(struct ibv_cq *cq);
	void *create_ah;
	void *create_counters;
	struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe,
				    struct ibv_comp_channel *channel, int comp_vector);
	void *create_cq_ex;
	void *create_flow;
	void *create_flow_action_esp;
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	struct ibv_qp *(*create_qp_ex)(struct ibv_context *context,
				       struct ibv_qp_init_attr_ex *attr);
	void *create_rwq_ind_table;
	void *create_srq;
	void *create_srq_ex;
	void *create_wq;
	void *dealloc_mw;
	int (*dealloc_pd)(struct ibv_pd *pd);
	void *dealloc_td;
	int (*dereg_mr)(struct verbs_mr *vmr);
	void *destroy_ah;
	void *destroy_counters;
	int (*destroy_cq)(struct ibv_cq *cq);
	void *destroy_flow;
	void *destroy_flow_action;
	int (*destroy_qp)(struct ibv_qp *qp);
	void *destroy_rwq_ind_table;
	void *destroy_srq;
	void *destroy_wq;
	void *detach_mcast;
	void (*free_context)(struct ibv_context *context);
	void *free_dm;
	void *get_srq_num;
	void *import_dm;
	void *import_mr;
	void *import_pd;
	void *modify_cq;
	void *modify_flow_action_esp;
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
	void *modify_qp_rate_limit;
	void *modify_srq;
	void *modify_wq;
	void *open_qp;
	void *open_xrcd;
	int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
	int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
	void *post_srq_ops;
	void *post_srq_recv;
	int (*query_device_ex)(struct ibv_context *context,
			       const struct ibv_query_device_ex_input *input,
			       struct ibv_device_attr_ex *attr, size_t attr_size);
	void *query_ece;
	int (*query_port)(struct ibv_context *context, uint8_t port_num,
			  struct ibv_port_attr *port_attr);
	int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
			struct ibv_qp_init_attr *init_attr);
	void *query_qp_data_in_order;
	void *query_rt_values;
	void *query_srq;
	void *read_counters;
	void *reg_dm_mr;
	void *reg_dmabuf_mr;
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length,
				 uint64_t hca_va, int access);
	int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
	void *rereg_mr;
	void *resize_cq;
	void *set_ece;
	void *unimport_dm;
	void *unimport_mr;
	void *unimport_pd;
};

/* The symbols of IBVERBS_PRIVATE_34. */
void verbs_register_driver_34(const struct verbs_device_ops *ops);
void *_verbs_init_and_alloc_context(struct ibv_device *device, int cmd_fd,
				    size_t alloc_size, struct verbs_context *context_offset,
				    uint32_t driver_id);
void verbs_uninit_context(struct verbs_context *context);
void verbs_set_ops(struct verbs_context *vctx, const struct verbs_context_ops *ops);

#endif
