/* rdma_getaddrinfo(3), rdma_create_ep(3) and rdma_get_request(3) over the calls of
 * cma.c, and what softhca does not model: each returns the documented error (-1 and
 * errno ENOSYS, or EOPNOTSUPP for an option or feature of the device). */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "cm.h"

#define EXPORT __attribute__((visibility("default")))

static struct sockaddr *copy_sin(const struct sockaddr_in *s)
{
	struct sockaddr_in *c = malloc(sizeof(*c));

	if (c)
		*c = *s;
	return (struct sockaddr *)c;
}

EXPORT int rdma_getaddrinfo(const char *node, const char *service,
			    const struct rdma_addrinfo *hints, struct rdma_addrinfo **res)
{
	struct addrinfo h = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	struct rdma_addrinfo *r;
	struct sockaddr_in sin = {.sin_family = AF_INET};
	int passive = hints && (hints->ai_flags & RAI_PASSIVE), rc;

	if (hints && hints->ai_family && hints->ai_family != AF_INET) {
		errno = EAFNOSUPPORT;
		return -1;
	}
	if (hints && hints->ai_port_space && hints->ai_port_space != RDMA_PS_TCP &&
	    hints->ai_port_space != RDMA_PS_UDP) {
		errno = EOPNOTSUPP;
		return -1;
	}
	if (hints && (hints->ai_flags & RAI_NUMERICHOST))
		h.ai_flags |= AI_NUMERICHOST;
	if (passive)
		h.ai_flags |= AI_PASSIVE;
	if (node || service) {
		rc = getaddrinfo(node, service, &h, &ai);
		if (rc) {
			errno = rc == EAI_SYSTEM ? errno : ENOENT;
			return rc;
		}
		memcpy(&sin, ai->ai_addr, sizeof(sin));
		freeaddrinfo(ai);
	}
	/* No node: the address is the hints' own (rdma_getaddrinfo(3): "resolve the RDMA
	 * addressing information based on the hints.ai_src_addr, hints.ai_dst_addr"), the
	 * service's port if one is given. libfabric's verbs provider connects so, with
	 * the peer's address in ai_dst_addr. */
	if (!node && hints) {
		const struct sockaddr *h = passive ? hints->ai_src_addr : hints->ai_dst_addr;
		uint16_t port = sin.sin_port;

		if (h && h->sa_family == AF_INET) {
			memcpy(&sin, h, sizeof(sin));
			if (service)
				sin.sin_port = port;
		}
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		errno = ENOMEM;
		return -1;
	}
	r->ai_flags = hints ? hints->ai_flags : 0;
	r->ai_family = AF_INET;
	r->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
	r->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type :
			r->ai_port_space == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC;
	if (passive) {
		r->ai_src_addr = copy_sin(&sin);
		r->ai_src_len = sizeof(sin);
	} else {
		r->ai_dst_addr = copy_sin(&sin);
		r->ai_dst_len = sizeof(sin);
		if (hints && hints->ai_src_addr && hints->ai_src_addr->sa_family == AF_INET) {
			r->ai_src_addr = copy_sin((struct sockaddr_in *)hints->ai_src_addr);
			r->ai_src_len = sizeof(sin);
		}
	}
	*res = r;
	return 0;
}

EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	struct rdma_addrinfo *n;

	for (; res; res = n) {
		n = res->ai_next;
		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
	}
}

#define NOSYS(decl) EXPORT decl { errno = ENOSYS; return -1; }

/* rsockets (rsocket(7)) are not modelled. */
NOSYS(int rsocket(void))
NOSYS(int rbind(void))
NOSYS(int rlisten(void))
NOSYS(int raccept(void))
NOSYS(int rconnect(void))
NOSYS(int rshutdown(void))
NOSYS(int rclose(void))
NOSYS(long rrecv(void))
NOSYS(long rrecvfrom(void))
NOSYS(long rrecvmsg(void))
NOSYS(long rsend(void))
NOSYS(long rsendto(void))
NOSYS(long rsendmsg(void))
NOSYS(long rread(void))
NOSYS(long rreadv(void))
NOSYS(long rwrite(void))
NOSYS(long rwritev(void))
NOSYS(int rpoll(void))
NOSYS(int rselect(void))
NOSYS(int rgetpeername(void))
NOSYS(int rgetsockname(void))
NOSYS(int rsetsockopt(void))
NOSYS(int rgetsockopt(void))
NOSYS(int rfcntl(void))
NOSYS(long riomap(void))
NOSYS(int riounmap(void))
NOSYS(long riowrite(void))

/* Multicast, SRQs on an id, options, ECE and extended QPs: not modelled. */
EXPORT int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	(void)id; (void)addr; (void)context;
	errno = ENOSYS;
	return -1;
}

EXPORT int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *a,
				  void *context)
{
	(void)id; (void)a; (void)context;
	errno = ENOSYS;
	return -1;
}

EXPORT int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	(void)id; (void)addr;
	errno = ENOSYS;
	return -1;
}

EXPORT int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd,
			   struct ibv_srq_init_attr *attr)
{
	(void)id; (void)pd; (void)attr;
	errno = ENOSYS;
	return -1;
}

EXPORT int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
	(void)id; (void)attr;
	errno = ENOSYS;
	return -1;
}

EXPORT void rdma_destroy_srq(struct rdma_cm_id *id)
{
	(void)id;
}

EXPORT int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	(void)id; (void)event;
	errno = ENOSYS;
	return -1;
}

EXPORT int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id; (void)ece;
	errno = EOPNOTSUPP;
	return -1;
}

EXPORT int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id; (void)ece;
	errno = EOPNOTSUPP;
	return -1;
}

EXPORT int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data,
			   uint8_t private_data_len)
{
	(void)id; (void)private_data; (void)private_data_len;
	errno = EOPNOTSUPP;
	return -1;
}

